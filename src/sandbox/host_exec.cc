#include "sandbox/host_exec.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>

#include "common/log.h"
#include "linux/sys.h"

namespace agentbox::sandbox {
namespace {

namespace asio = boost::asio;

// glibc's execvp default when the environment has no PATH.
constexpr std::string_view kDefaultPath = "/bin:/usr/bin";

class SpawnAttr {
 public:
  SpawnAttr() { ::posix_spawnattr_init(&attr_); }
  ~SpawnAttr() { ::posix_spawnattr_destroy(&attr_); }
  SpawnAttr(const SpawnAttr&) = delete;
  SpawnAttr& operator=(const SpawnAttr&) = delete;
  posix_spawnattr_t* get() { return &attr_; }

 private:
  posix_spawnattr_t attr_;
};

class FileActions {
 public:
  FileActions() { ::posix_spawn_file_actions_init(&fa_); }
  ~FileActions() { ::posix_spawn_file_actions_destroy(&fa_); }
  FileActions(const FileActions&) = delete;
  FileActions& operator=(const FileActions&) = delete;
  posix_spawn_file_actions_t* get() { return &fa_; }

 private:
  posix_spawn_file_actions_t fa_;
};

// Errors of the exec step itself (the command is at fault, not the host): reported like a shell
// does, as exit status 127 (not found) or 126 (found but not runnable).
std::optional<int> exec_failure_status(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR: return 127;
    case EACCES:
    case EPERM:
    case ENOEXEC:
    case EISDIR:
    case ETXTBSY:
    case ELOOP:
    case ENAMETOOLONG:
    case E2BIG:
    case ELIBBAD: return 126;
    default: return std::nullopt;
  }
}

// A command that could not start, as a Process: empty stdout, `message` on stderr, exit `code`.
Result<std::unique_ptr<HostProcess>> not_started(asio::any_io_executor ex, int code,
                                                 std::string_view message) {
  auto out = linux::sys::pipe(/*above_stdio=*/true);
  if (!out) return std::unexpected(out.error());
  auto err = linux::sys::pipe(/*above_stdio=*/true);
  if (!err) return std::unexpected(err.error());
  // A few dozen bytes always fit in an empty pipe: this write cannot block.
  ssize_t n = ::write(err->write.get(), message.data(), message.size());
  (void)n;
  auto p = std::make_unique<HostProcess>(std::move(ex), ExitStatus{.exit_code = code});
  p->stdout_fd = std::move(out->read);
  p->stderr_fd = std::move(err->read);
  return p;
}

// `searched`: the name was looked up in PATH (no '/'), so ENOENT means "not in PATH".
std::string failure_message(std::string_view name, int err, bool searched) {
  std::string m = "agentbox: ";
  m += name;
  m += searched && err == ENOENT ? ": command not found" : std::string(": ") + std::strerror(err);
  m += '\n';
  return m;
}

// execvp's PATH search, done in the parent against the command's own PATH (posix_spawnp would
// use the daemon's). Relative PATH entries are relative to the command's cwd, as in the child.
// Returns the path to exec, or the errno execvp would have failed with.
Result<std::string> search_path(const std::string& name, std::string_view path_var,
                                const LaunchSpec& spec) {
  if (name.find('/') != std::string::npos) return name;
  const int dirfd = spec.cwd_fd >= 0 ? spec.cwd_fd : AT_FDCWD;
  UniqueFd cwd_dir;  // spec.cwd, opened on the first relative entry
  bool seen_eacces = false;
  std::size_t pos = 0;
  for (;;) {
    std::size_t end = path_var.find(':', pos);
    std::string_view dir = path_var.substr(pos, end == std::string_view::npos ? end : end - pos);
    std::string candidate(dir.empty() ? std::string_view(".") : dir);
    candidate += '/';
    candidate += name;
    int at = dirfd;
    if (candidate[0] != '/' && spec.cwd_fd < 0 && !spec.cwd.empty()) {
      if (!cwd_dir) cwd_dir = UniqueFd(::open(spec.cwd.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      at = cwd_dir ? cwd_dir.get() : AT_FDCWD;
    }
    struct stat st;
    if (::fstatat(at, candidate.c_str(), &st, 0) == 0 && S_ISREG(st.st_mode)) {
      if (::faccessat(at, candidate.c_str(), X_OK, AT_EACCESS) == 0) return candidate;
      seen_eacces = true;
    }
    if (end == std::string_view::npos) break;
    pos = end + 1;
  }
  return std::unexpected(
      Error{seen_eacces ? Code::kAccess : Code::kNotFound, seen_eacces ? EACCES : ENOENT, name});
}

ExitStatus decode(const siginfo_t& info) {
  if (info.si_code == CLD_EXITED) return ExitStatus{.exit_code = info.si_status};
  return ExitStatus{.exit_code = 128 + info.si_status, .signal = info.si_status};
}

}  // namespace

HostProcess::HostProcess(asio::any_io_executor ex, pid_t pid, UniqueFd pidfd)
    : pid_(pid), pidfd_(std::move(ex)) {
  boost::system::error_code ec;
  pidfd_.assign(pidfd.get(), ec);
  if (!ec) {
    (void)pidfd.release();
  } else {
    // Impossible on kernels with pidfd_open (5.3+ poll pidfds); keep working, blocking in wait().
    spdlog::error("exec: cannot poll pidfd of {}: {}", pid, ec.message());
    fallback_pidfd_ = std::move(pidfd);
  }
}

HostProcess::HostProcess(asio::any_io_executor ex, ExitStatus status)
    : pidfd_(std::move(ex)), status_(status), exited_(true) {}

HostProcess::~HostProcess() {
  if (pid_ <= 0) return;
  if (!exited_) ::kill(-pid_, SIGKILL);
  siginfo_t info{};
  while (::waitid(P_PIDFD, pidfd(), &info, WEXITED) < 0 && errno == EINTR) {
  }
}

int HostProcess::pidfd() {
  return pidfd_.is_open() ? pidfd_.native_handle() : fallback_pidfd_.get();
}

asio::awaitable<ExitStatus> HostProcess::wait() {
  if (exited_) co_return status_;
  if (pidfd_.is_open()) {
    // A pidfd polls readable once the process has exited; the zombie stays until we reap it.
    auto [ec] = co_await pidfd_.async_wait(asio::posix::stream_descriptor::wait_read,
                                           asio::as_tuple(asio::use_awaitable));
    if (ec) {
      spdlog::error("exec: waiting on pidfd of {} failed: {}; killing it", pid_, ec.message());
      kill_tree();
    }
  }
  siginfo_t info{};
  int r;
  do {
    // WNOWAIT: read the status but leave the zombie, so the pid (and thus the process group id)
    // cannot be reused before ~HostProcess; kill_tree() stays safe until then.
    r = ::waitid(P_PIDFD, pidfd(), &info, WEXITED | WNOWAIT);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    spdlog::error("exec: waitid(pidfd of {}) failed: errno {}", pid_, errno);
    status_ = ExitStatus{.exit_code = -1};
  } else {
    status_ = decode(info);
  }
  exited_ = true;
  co_return status_;
}

Status HostProcess::signal(int signo) {
  if (pid_ > 0 && ::kill(pid_, signo) != 0 && errno != ESRCH) {
    return fail_errno(errno, "kill(" + std::to_string(pid_) + ")");
  }
  return {};
}

void HostProcess::kill_tree() {
  // SECURITY: the whole group, not only the leader: `sleep 30 &` children must die on timeout.
  if (pid_ > 0) ::kill(-pid_, SIGKILL);
}

Result<std::unique_ptr<HostProcess>> launch_host_process(asio::any_io_executor ex,
                                                         LaunchSpec spec) {
  if (spec.argv.empty() || spec.argv[0].empty()) {
    return fail(Code::kInvalid, "exec: empty argv");
  }
  // C strings end at NUL: an embedded one would silently run something else than asked.
  for (std::size_t i = 0; i < spec.argv.size(); ++i) {
    if (spec.argv[i].find('\0') != std::string::npos) {
      return fail(Code::kInvalid, "exec: argv[" + std::to_string(i) + "] contains a NUL byte");
    }
  }
  std::string_view path_var = kDefaultPath;
  for (const std::string& kv : spec.env) {
    if (kv.find('\0') != std::string::npos || kv.find('=') == std::string::npos ||
        kv.front() == '=') {
      return fail(Code::kInvalid, "exec: malformed environment entry (want K=V without NUL)");
    }
    if (path_var.data() == kDefaultPath.data() && kv.starts_with("PATH=")) {
      path_var = std::string_view(kv).substr(5);
    }
  }

  auto exe = search_path(spec.argv[0], path_var, spec);
  if (!exe) {
    const int err = exe.error().sys_errno;
    return not_started(std::move(ex), err == EACCES ? 126 : 127,
                       failure_message(spec.argv[0], err, /*searched=*/true));
  }

  const bool pty = !spec.pty_slave.empty();
  Pipe in;
  Result<Pipe> out = Pipe{};
  Result<Pipe> err = Pipe{};
  if (!pty) {
    out = linux::sys::pipe(/*above_stdio=*/true);
    if (!out) return std::unexpected(out.error());
    err = linux::sys::pipe(/*above_stdio=*/true);
    if (!err) return std::unexpected(err.error());
  }
  if (spec.with_stdin && !pty) {
    auto p = linux::sys::pipe(/*above_stdio=*/true);
    if (!p) return std::unexpected(p.error());
    in = std::move(*p);
  }

  // Everything the child needs is built here, before the spawn: glibc's child side only makes
  // syscalls from these tables (no allocation between clone and exec).
  FileActions fa;
  if (spec.cwd_fd >= 0) {
    ::posix_spawn_file_actions_addfchdir_np(fa.get(), spec.cwd_fd);
  } else if (!spec.cwd.empty()) {
    ::posix_spawn_file_actions_addchdir_np(fa.get(), spec.cwd.c_str());
  }
  if (pty) {
    // Opened without O_NOCTTY by the new session's leader: it becomes the controlling terminal.
    ::posix_spawn_file_actions_addopen(fa.get(), STDIN_FILENO, spec.pty_slave.c_str(), O_RDWR, 0);
    ::posix_spawn_file_actions_adddup2(fa.get(), STDIN_FILENO, STDOUT_FILENO);
    ::posix_spawn_file_actions_adddup2(fa.get(), STDIN_FILENO, STDERR_FILENO);
  } else {
    if (spec.with_stdin) {
      ::posix_spawn_file_actions_adddup2(fa.get(), in.read.get(), STDIN_FILENO);
    } else {
      ::posix_spawn_file_actions_addopen(fa.get(), STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    }
    ::posix_spawn_file_actions_adddup2(fa.get(), out->write.get(), STDOUT_FILENO);
    ::posix_spawn_file_actions_adddup2(fa.get(), err->write.get(), STDERR_FILENO);
  }
  // SECURITY: the command inherits stdio only, even if some library leaked an fd without
  // O_CLOEXEC (our own fds are all O_CLOEXEC already).
  ::posix_spawn_file_actions_addclosefrom_np(fa.get(), STDERR_FILENO + 1);

  SpawnAttr attr;
  sigset_t all;
  sigfillset(&all);
  sigdelset(&all, SIGKILL);
  sigdelset(&all, SIGSTOP);
  sigset_t none;
  sigemptyset(&none);
  ::posix_spawnattr_setsigdefault(attr.get(), &all);  // no SIG_IGN inherited (SIGPIPE, SIGCHLD)
  ::posix_spawnattr_setsigmask(attr.get(), &none);    // no blocked signal from a daemon thread
  ::posix_spawnattr_setpgroup(attr.get(), 0);         // own group: kill_tree() reaches children
  // With a pty, its own session (and so its own group too): the pty can be its terminal.
  ::posix_spawnattr_setflags(attr.get(), POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK |
                                             (pty ? POSIX_SPAWN_SETSID : POSIX_SPAWN_SETPGROUP));

  std::vector<char*> envp;
  envp.reserve(spec.env.size() + 1);
  for (std::string& kv : spec.env) envp.push_back(kv.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  argv.reserve(spec.argv.size() + 2);
  for (std::string& a : spec.argv) argv.push_back(a.data());
  argv.push_back(nullptr);

  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, exe->c_str(), fa.get(), attr.get(), argv.data(), envp.data());
  if (rc == ENOEXEC) {
    // execvp's fallback for a script without a #! line: run it with the shell.
    static char kShell[] = "/bin/sh";
    argv[0] = exe->data();
    argv.insert(argv.begin(), kShell);
    rc = ::posix_spawn(&pid, kShell, fa.get(), attr.get(), argv.data(), envp.data());
  }
  if (rc != 0) {
    if (auto code = exec_failure_status(rc)) {
      return not_started(std::move(ex), *code,
                         failure_message(spec.argv[0], rc, /*searched=*/false));
    }
    return fail_errno(rc, "posix_spawn(" + spec.argv[0] + ")");
  }
  // The child has exec'd (posix_spawn returns after the exec with CLONE_VFORK); its ends go.
  out->write.reset();
  err->write.reset();
  in.read.reset();

  // We are the parent and have not reaped it, so `pid` cannot be recycled before pidfd_open.
  // (The syscall directly: glibc 2.36's <sys/pidfd.h> lacks extern "C" for C++.) Born O_CLOEXEC.
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) {
    const int e = errno;
    ::kill(-pid, SIGKILL);
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    return fail_errno(e, "pidfd_open (Linux >= 5.3 required)");
  }
  auto p = std::make_unique<HostProcess>(std::move(ex), pid, std::move(pidfd));
  p->stdin_fd = std::move(in.write);
  p->stdout_fd = std::move(out->read);
  p->stderr_fd = std::move(err->read);
  return p;
}

}  // namespace agentbox::sandbox
