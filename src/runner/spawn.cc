#include "runner/spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <linux/close_range.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "runner/spawn_posix.h"

extern char** environ;

namespace agentbox::runner {
namespace {

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::vector<std::string> environment_with(const std::vector<std::string>& extra) {
  std::vector<std::string> out;
  std::map<std::string, std::size_t> index;
  auto add = [&](const std::string& kv) {
    std::string key = kv.substr(0, kv.find('='));
    if (auto it = index.find(key); it != index.end()) {
      out[it->second] = kv;
    } else {
      index[key] = out.size();
      out.push_back(kv);
    }
  };
  for (char** e = environ; e && *e; ++e) add(*e);
  for (const auto& kv : extra) add(kv);
  return out;
}

Result<pid_t> spawn(const SpawnSpec& spec) {
  if (spec.argv.empty() || spec.argv[0].empty()) return fail(Code::kInvalid, "exec: no program");
  // Everything the child needs is prepared here: between fork and exec it only makes syscalls.
  std::vector<char*> argv = c_strings(spec.argv);
  std::vector<char*> envp = c_strings(spec.env);
  std::string path;
  for (const auto& kv : spec.env) {
    if (kv.rfind("PATH=", 0) == 0) path = kv.substr(5);
  }
  if (path.empty()) path = "/usr/local/bin:/usr/bin:/bin";
  std::vector<std::string> candidates;
  if (spec.argv[0].find('/') != std::string::npos) {
    candidates.push_back(spec.argv[0]);
  } else {
    std::size_t i = 0;
    while (i <= path.size()) {
      std::size_t j = path.find(':', i);
      if (j == std::string::npos) j = path.size();
      std::string dir = path.substr(i, j - i);
      candidates.push_back((dir.empty() ? "." : dir) + "/" + spec.argv[0]);
      i = j + 1;
    }
  }
  // posix_spawn cannot join a cgroup before exec: the fork path does.
  if (spec.join_fds.empty()) {
    if (auto fast = spawn_posix(spec, argv.data(), envp.data(), candidates)) return *fast;
  }
  int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd < 0) return fail_errno(errno, "open(/dev/null)");
  UniqueFd null_guard(null_fd);
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return fail_errno(errno, "pipe");
  UniqueFd rd(report[0]), wr(report[1]);

  pid_t pid = fork();
  if (pid < 0) return fail_errno(errno, "fork");
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    int step_err = 0;
    auto die = [&](int err) {
      step_err = err;
      (void)!::write(wr.get(), &step_err, sizeof step_err);
      _exit(127);
    };
    for (int fd : spec.join_fds) {
      if (::write(fd, "0", 1) != 1) die(errno);
    }
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);
    for (int s = 1; s < 32; ++s) {
      if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL);
    }
    if (spec.pty) {
      if (setsid() < 0) die(errno);
      if (ioctl(spec.stdin_fd, TIOCSCTTY, 0) != 0) die(errno);
    } else if (setpgid(0, 0) != 0) {
      die(errno);
    }
    int in = spec.stdin_fd >= 0 ? spec.stdin_fd : null_fd;
    int out = spec.stdout_fd >= 0 ? spec.stdout_fd : null_fd;
    int err = spec.stderr_fd >= 0 ? spec.stderr_fd : null_fd;
    // dup() to >= 3 first, so that dup2 onto 0..2 cannot clobber a source.
    int fds[3] = {fcntl(in, F_DUPFD, 3), fcntl(out, F_DUPFD, 3), fcntl(err, F_DUPFD, 3)};
    for (int i = 0; i < 3; ++i) {
      if (fds[i] < 0 || dup2(fds[i], i) < 0) die(errno);
    }
    for (int i = 0; i < 3; ++i) ::close(fds[i]);
    // Nothing but 0..2 reaches the program: the runner's sockets (its connection to the server
    // above all: a child holding it would keep it open past the runner's death, and could write
    // frames on it) and any fd opened without O_CLOEXEC close at exec.
    if (::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) != 0) {
      for (int fd = 3; fd < 65536; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    if (spec.cwd_fd >= 0 && fchdir(spec.cwd_fd) != 0) die(errno);
    int last = ENOENT;
    for (const auto& c : candidates) {
      execve(c.c_str(), argv.data(), envp.data());
      if (errno != ENOENT && errno != ENOTDIR) last = errno;
    }
    die(last);
  }
  wr.reset();
  int child_err = 0;
  ssize_t n;
  do {
    n = ::read(rd.get(), &child_err, sizeof child_err);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof child_err)) {
    wait_for(pid);
    return fail_errno(child_err, "exec " + spec.argv[0]);
  }
  return pid;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return -1;
}

int wait_for(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return 0;
  }
  return status;
}

void kill_group(pid_t pgid, int sig) {
  if (pgid > 1) ::kill(-pgid, sig);
}

bool drain(int out_fd, int err_fd, std::string& out, std::string& err, std::size_t cap,
           std::chrono::steady_clock::time_point deadline) {
  char buf[65536];
  pollfd p[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sink[2] = {&out, &err};
  for (;;) {
    if (p[0].fd < 0 && p[1].fd < 0) return true;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    int r = poll(p, 2, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return true;
    if (r == 0) return false;
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || p[i].revents == 0) continue;
      ssize_t n = ::read(p[i].fd, buf, sizeof buf);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        p[i].fd = -1;
        continue;
      }
      std::size_t room = cap > sink[i]->size() ? cap - sink[i]->size() : 0;
      sink[i]->append(buf, std::min<std::size_t>(room, static_cast<std::size_t>(n)));
    }
  }
}

}  // namespace agentbox::runner
