// agentbox-init: pid 1 of every ns box. It reaps every zombie in the box and, on request from the
// daemon over the control socket (linux/init_protocol.h), forks commands as the session user.
//
// Kept deliberately tiny (static, no C++ runtime beyond what the compiler inlines, no heap on the
// hot path): its resident memory is paid once per live session.
//
// The box setup (linux/box.cc) has already: entered the namespaces and the box cgroup, built and
// pivoted into the box filesystem, set rlimits, no_new_privs, left this process only
// kInitCapabilities and installed the seccomp filter. main() then empties the bounding set once
// (every child inherits it empty). What is left for each command is done in the child, see
// run_child(); self-joining children share our memory until they exec (CLONE_VFORK).
//
// Exit: when the control socket reports EOF (the daemon closed it or died), main() returns, and
// the kernel kills everything else in the pid namespace because its init is gone. PR_SET_PDEATHSIG
// (set before exec by box.cc, re-armed here) covers a daemon that dies while we are blocked.

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "linux/caps.h"
#include "linux/init_protocol.h"
#include "linux/rlimits.h"

namespace proto = agentbox::linux::initproto;

namespace {

constexpr int kCtl = proto::kControlFd;

// One request: header + payload. Static, so it costs resident memory only for the pages a large
// request actually touched.
alignas(8) char g_request[sizeof(proto::ExecRequest) + proto::kMaxPayloadBytes];
char* g_strings[proto::kMaxStrings + 2];

// Leaders of running commands (pid -> request id). Background processes they leave are not
// here: they are reaped silently when they end.
struct Running {
  pid_t pid;
  std::uint64_t id;
};
Running* g_running = nullptr;
std::size_t g_running_len = 0;
std::size_t g_running_cap = 0;

sigset_t g_init_mask;  // what the init blocks; children restore the empty mask

// The stack of a command child started with CLONE_VM|CLONE_VFORK (see handle_request): one at a
// time, since the init is suspended until that child execs or exits. Only the pages a child
// touches become resident. Room for execvpe's ENOEXEC fallback, which copies argv on the stack.
alignas(16) char g_child_stack[256 * 1024];

// write(2) all of it, for messages on a command's stderr. Best effort.
void write_all(int fd, const char* s, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

// "agentbox: <what>: <strerror>\n" on fd.
void report(int fd, const char* what, const char* arg, int err) {
  write_all(fd, "agentbox: ", 10);
  write_all(fd, what, strlen(what));
  if (arg != nullptr) {
    write_all(fd, " ", 1);
    write_all(fd, arg, strlen(arg));
  }
  if (err != 0) {
    const char* msg = strerrordesc_np(err);
    write_all(fd, ": ", 2);
    if (msg != nullptr) write_all(fd, msg, strlen(msg));
  }
  write_all(fd, "\n", 1);
}

bool send_msg(const void* msg, std::size_t len) {
  for (;;) {
    ssize_t n = ::send(kCtl, msg, len, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(len)) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

void send_exited(std::uint64_t id, int status, std::uint64_t cpu_usec = 0) {
  proto::Exited e;
  e.id = id;
  e.status = status;
  e.cpu_usec = cpu_usec;
  // A failed send means the daemon is gone; the next recv sees EOF and we exit.
  (void)send_msg(&e, sizeof e);
}

bool track(pid_t pid, std::uint64_t id) {
  if (g_running_len == g_running_cap) {
    std::size_t cap = g_running_cap == 0 ? 16 : g_running_cap * 2;
    auto* grown = static_cast<Running*>(realloc(g_running, cap * sizeof(Running)));
    if (grown == nullptr) return false;
    g_running = grown;
    g_running_cap = cap;
  }
  g_running[g_running_len++] = Running{pid, id};
  return true;
}

void reap_all() {
  for (;;) {
    int status = 0;
    struct rusage ru {};
    pid_t pid = ::wait4(-1, &status, WNOHANG, &ru);
    if (pid <= 0) return;  // 0: none exited yet; -1/ECHILD: no children at all
    for (std::size_t i = 0; i < g_running_len; ++i) {
      if (g_running[i].pid != pid) continue;
      const auto usec = [](const timeval& tv) {
        return static_cast<std::uint64_t>(tv.tv_sec) * 1000000u +
               static_cast<std::uint64_t>(tv.tv_usec);
      };
      send_exited(g_running[i].id, status, usec(ru.ru_utime) + usec(ru.ru_stime));
      g_running[i] = g_running[--g_running_len];
      break;
    }
  }
}

// The forked child: becomes the command. Runs in a copy of the single-threaded init, so libc is
// safe to use here. Never returns.
[[noreturn]] void run_child(const proto::ExecRequest& req, const int* fds, char** argv,
                            char** envp, const char* cwd) {
  const bool has_stdin = (req.flags & proto::kExecHasStdin) != 0;
  const bool self_join = (req.flags & proto::kExecSelfJoin) != 0;
  const int in_fd = has_stdin ? fds[0] : -1;
  const int out_fd = fds[has_stdin ? 1 : 0];
  const int err_fd = fds[has_stdin ? 2 : 1];
  const int* after_stdio = fds + (has_stdin ? 3 : 2);

  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);

  // Own session and process group: a leader whose group the command controls (and, with a pty,
  // the session the terminal belongs to).
  ::setsid();

  if (self_join) {
    // SECURITY: into the exec's cgroup (every hierarchy) before anything else, so that nothing
    // this command starts can run outside it; a command that cannot join never runs.
    for (std::uint32_t i = 0; i < req.join_fds; ++i) {
      if (::write(after_stdio[i], "0", 1) != 1) {
        report(err_fd, "join the exec cgroup", nullptr, errno);
        _exit(127);
      }
    }
  }
  // Tell the daemon who we are; the kernel attaches our pid as the daemon sees it. Self-joined,
  // this says "in my cgroup" (a kill that raced us is repeated); else we wait to be moved.
  proto::ChildReady ready;
  ready.id = req.id;
  ready.box_pid = ::getpid();
  if (!send_msg(&ready, sizeof ready)) _exit(127);
  if (!self_join) {
    // SECURITY: block until the daemon has put us into the exec's cgroup, so that nothing this
    // command starts can run outside it (timeouts and kills reach the whole tree).
    char go = 0;
    ssize_t n;
    do {
      n = ::read(after_stdio[0], &go, 1);
    } while (n < 0 && errno == EINTR);
    if (n != 1) {
      report(err_fd, "start cancelled by the daemon", nullptr, 0);
      _exit(127);
    }
  }

  if (req.oom_score_adj != 0) {
    int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      char buf[16];
      int len = 0;
      int v = req.oom_score_adj;
      bool neg = v < 0;
      unsigned u = neg ? static_cast<unsigned>(-v) : static_cast<unsigned>(v);
      char rev[12];
      int r = 0;
      do {
        rev[r++] = static_cast<char>('0' + u % 10);
        u /= 10;
      } while (u != 0);
      if (neg) buf[len++] = '-';
      while (r > 0) buf[len++] = rev[--r];
      (void)!::write(fd, buf, static_cast<std::size_t>(len));
      ::close(fd);
    }
  }

  // The command's CPU-time budget (limits.cpu_time_sec); every process it starts inherits it.
  if (int err = agentbox::linux::apply_cpu_time_limit(req.cpu_time_sec); err != 0) {
    report(err_fd, "set the CPU time limit", nullptr, err);
    _exit(127);
  }

  int null_fd = -1;
  if (!has_stdin) {
    null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd < 0) {
      report(err_fd, "open /dev/null", nullptr, errno);
      _exit(127);
    }
  }
  // The received fds are all >= 3 (0-2 are the init's /dev/null), so these dup2s cannot clobber
  // one another.
  if (::dup2(has_stdin ? in_fd : null_fd, 0) < 0 || ::dup2(out_fd, 1) < 0 ||
      ::dup2(err_fd, 2) < 0) {
    report(err_fd, "dup2", nullptr, errno);
    _exit(127);
  }
  if ((req.flags & proto::kExecPty) != 0 && ::ioctl(0, TIOCSCTTY, 0) != 0) {
    report(err_fd, "make the pty the controlling terminal", nullptr, errno);
    _exit(127);
  }
  // SECURITY: the command sees exactly fds 0, 1 and 2: not the control socket (which would let
  // it forge messages to the daemon), not the go pipe, nothing of the init.
  if (::syscall(SYS_close_range, 3U, ~0U, 0U) != 0) {
    for (int fd = 3; fd < 65536; ++fd) ::close(fd);
  }

  // SECURITY: never run a command as root or with any capability; no supplementary groups.
  // The bounding and ambient sets are empty already: main() emptied ours before any fork.
  if (int err = agentbox::linux::switch_user_and_drop_capabilities(req.uid, req.gid,
                                                                   /*bounding_already_empty=*/true);
      err != 0) {
    report(2, "switch to the session user", nullptr, err);
    _exit(127);
  }
  if (::chdir(cwd) != 0) {
    report(2, "cd", cwd, errno);
    _exit(127);
  }
  // execvpe searches the PATH of the calling process's environment, so install the command's.
  environ = envp;
  ::execvpe(argv[0], argv, envp);
  const int err = errno;
  report(2, argv[0], nullptr, err);
  _exit(err == ENOENT ? 127 : 126);
}

struct ChildArgs {
  const proto::ExecRequest* req;
  const int* fds;
  char** argv;
  char** envp;
  const char* cwd;
};

int child_entry(void* p) {
  const auto* a = static_cast<const ChildArgs*>(p);
  run_child(*a->req, a->fds, a->argv, a->envp, a->cwd);
}

// Rejects a malformed request: tells the command's stderr (when we have it) and reports exit 127.
void reject(const proto::ExecRequest* req, const int* fds, int nfds, const char* why) {
  if (req != nullptr) {
    int err_index = (req->flags & proto::kExecHasStdin) != 0 ? 2 : 1;
    if (err_index < nfds) report(fds[err_index], "bad request:", why, 0);
    send_exited(req->id, 127 << 8);
  }
  for (int i = 0; i < nfds; ++i) ::close(fds[i]);
}

// Splits `count` NUL-terminated strings off [*p, end) into out[0..count). False if short.
bool take_strings(char** p, char* end, std::uint32_t count, char** out) {
  for (std::uint32_t i = 0; i < count; ++i) {
    char* s = *p;
    char* nul = static_cast<char*>(memchr(s, '\0', static_cast<std::size_t>(end - s)));
    if (nul == nullptr) return false;
    out[i] = s;
    *p = nul + 1;
  }
  return true;
}

// Handles one message from the daemon. Returns false when the socket is closed or broken.
bool handle_request() {
  alignas(alignof(cmsghdr)) char cbuf[CMSG_SPACE(sizeof(int) * proto::kMaxExecFds)];
  iovec iov{g_request, sizeof g_request};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = sizeof cbuf;
  ssize_t n = ::recvmsg(kCtl, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;  // EOF: the daemon is gone

  int fds[proto::kMaxExecFds];
  int nfds = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < count; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (nfds < proto::kMaxExecFds) {
        fds[nfds++] = fd;
      } else {
        ::close(fd);
      }
    }
  }

  if (static_cast<std::size_t>(n) == sizeof(proto::Signal)) {
    proto::Signal sig;
    memcpy(&sig, g_request, sizeof sig);
    if (sig.type == proto::MsgType::kSignal) {
      for (int i = 0; i < nfds; ++i) ::close(fds[i]);
      // Only a leader not reaped yet: its pid cannot have been reused.
      for (std::size_t i = 0; i < g_running_len; ++i) {
        if (g_running[i].id == sig.id) {
          ::kill(g_running[i].pid, sig.signo);
          break;
        }
      }
      return true;
    }
  }
  if (static_cast<std::size_t>(n) < sizeof(proto::ExecRequest)) {
    reject(nullptr, fds, nfds, "short");
    return true;
  }
  proto::ExecRequest req;
  memcpy(&req, g_request, sizeof req);
  if (req.type != proto::MsgType::kExecRequest) {
    reject(nullptr, fds, nfds, "type");
    return true;
  }
  if ((req.flags & proto::kExecSelfJoin) != 0 &&
      (req.join_fds == 0 || req.join_fds > proto::kMaxJoinFds)) {
    reject(&req, fds, nfds, "join fd count");
    return true;
  }
  const int stdio_fds = (req.flags & proto::kExecHasStdin) != 0 ? 3 : 2;
  const int want_fds = stdio_fds + ((req.flags & proto::kExecSelfJoin) != 0
                                        ? static_cast<int>(req.join_fds)
                                        : 1);  // the go pipe
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || nfds != want_fds) {
    reject(&req, fds, nfds, "truncated or wrong fds");
    return true;
  }
  if (req.payload_bytes != static_cast<std::size_t>(n) - sizeof req || req.argc == 0 ||
      static_cast<std::size_t>(req.argc) + req.envc > proto::kMaxStrings) {
    reject(&req, fds, nfds, "payload size or counts");
    return true;
  }
  // SECURITY: refuse to start anything as root, whatever the daemon says.
  if (req.uid == 0 || req.gid == 0) {
    reject(&req, fds, nfds, "uid/gid 0");
    return true;
  }
  char* p = g_request + sizeof req;
  char* end = g_request + n;
  char** argv = g_strings;
  char** envp = g_strings + req.argc + 1;
  char* cwd = nullptr;
  if (!take_strings(&p, end, req.argc, argv) || !take_strings(&p, end, req.envc, envp) ||
      !take_strings(&p, end, 1, &cwd) || p != end) {
    reject(&req, fds, nfds, "malformed strings");
    return true;
  }
  argv[req.argc] = nullptr;
  envp[req.envc] = nullptr;

  // A self-joining child never waits for the daemon before it execs, so it can share our memory
  // and we can sleep until it has exec'd (CLONE_VM|CLONE_VFORK, as posix_spawn does): no page
  // tables copied per command. The child only makes syscalls, writes to its own stack and the
  // `environ` pointer (unused by the init), and leaves errno alone where we read it. A child that
  // waits for its go byte is forked instead: it must not hold the init up meanwhile.
  pid_t pid;
  if ((req.flags & proto::kExecSelfJoin) != 0) {
    ChildArgs args{&req, fds, argv, envp, cwd};
    pid = ::clone(child_entry, g_child_stack + sizeof g_child_stack, CLONE_VM | CLONE_VFORK | SIGCHLD,
                  &args);
  } else {
    pid = ::fork();
    if (pid == 0) run_child(req, fds, argv, envp, cwd);
  }
  const int fork_err = errno;
  if (pid > 0 && !track(pid, req.id)) {
    // Out of memory for the table: the command runs, but we could not report its exit. Kill it
    // rather than leave the daemon waiting forever.
    ::kill(pid, SIGKILL);
    send_exited(req.id, SIGKILL);
  }
  if (pid < 0) {
    report(fds[stdio_fds - 1], "fork", nullptr, fork_err);
    send_exited(req.id, 127 << 8);
  }
  for (int i = 0; i < nfds; ++i) ::close(fds[i]);
  return true;
}

}  // namespace

int main() {
  // SECURITY: nobody in the box may ptrace us, read our memory or open our fds via /proc (exec
  // reset the flag that box.cc could have set).
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  ::umask(022);

  struct stat st;
  if (::fstat(kCtl, &st) != 0 || !S_ISSOCK(st.st_mode)) return 2;

  // SECURITY: empty the bounding (and ambient) set once, here: every command child inherits it
  // empty, so none can ever regain a capability at exec, and none pays the ~45 prctl calls of
  // emptying it per command. CAP_SETPCAP goes with it; the caps needed to start commands stay.
  if (agentbox::linux::empty_bounding_set_keep(agentbox::linux::kInitRunCapabilities) != 0) {
    return 6;
  }

  // Children are reaped through a signalfd; SIGPIPE is blocked so that writing an error to a
  // command's closed stderr cannot hurt us (as pid 1 of the namespace we would ignore it anyway).
  sigemptyset(&g_init_mask);
  sigaddset(&g_init_mask, SIGCHLD);
  sigaddset(&g_init_mask, SIGPIPE);
  sigprocmask(SIG_BLOCK, &g_init_mask, nullptr);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  int sfd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return 3;

  proto::Hello hello;
  if (!send_msg(&hello, sizeof hello)) return 4;

  pollfd pfd[2] = {{kCtl, POLLIN, 0}, {sfd, POLLIN, 0}};
  for (;;) {
    int r = ::poll(pfd, 2, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      return 5;
    }
    if ((pfd[1].revents & POLLIN) != 0) {
      signalfd_siginfo si;
      while (::read(sfd, &si, sizeof si) > 0) {
      }
      reap_all();
    }
    if ((pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      if (!handle_request()) return 0;
    }
  }
}
