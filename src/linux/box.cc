#include "linux/box.h"

#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "linux/caps.h"
#include "linux/init_protocol.h"
#include "linux/internal/clone_args.h"

namespace agentbox::linux {
namespace {

namespace proto = initproto;

using detail::CloneArgs;

constexpr int kInitFdInBox = proto::kControlFd + 1;  // O_CLOEXEC: gone once the init runs
// A SEQPACKET message must fit the sender's buffer; requests carry up to kMaxPayloadBytes.
constexpr int kControlSndBuf = 2 * 1024 * 1024;

// Everything the box child needs, prepared by the parent before clone: the child reads this
// (its copy of the parent's memory) and allocates nothing.
struct ChildArgs {
  int ctl = -1;
  int init_fd = -1;
  const char* root_mountpoint = nullptr;
  int root_tree = -1;          // an image root (linux/image_root.h), else a fresh tmpfs
  bool root_writable = false;  // leave "/" writable (an image root of its own)
  const MountPlan* plan = nullptr;
  const SeccompProgram* seccomp = nullptr;
  const BoxRlimits* rlimits = nullptr;
  const char* hostname = nullptr;
  std::size_t hostname_len = 0;
  char root_size[32] = {};
  char oom[16] = {};
  std::size_t oom_len = 0;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  bool root_read_only = true;
};

[[noreturn]] void child_fail(int ctl, BoxStep step, int err, std::uint32_t detail = 0) noexcept {
  proto::SetupError e;
  e.step = static_cast<std::uint32_t>(step);
  e.detail = detail;
  e.err = err;
  (void)::send(ctl, &e, sizeof e, MSG_NOSIGNAL);
  _exit(127);
}

// Mounts a fresh tmpfs for the root and attaches it to `mountpoint`. Returns the mount's fd (the
// new root) or -1 with errno set.
int make_root_tmpfs(const char* mountpoint, const char* size) noexcept {
  int fs = ::fsopen("tmpfs", FSOPEN_CLOEXEC);
  if (fs < 0) return -1;
  int mnt = -1;
  if (::fsconfig(fs, FSCONFIG_SET_STRING, "source", "tmpfs", 0) == 0 &&
      ::fsconfig(fs, FSCONFIG_SET_STRING, "size", size, 0) == 0 &&
      ::fsconfig(fs, FSCONFIG_SET_STRING, "nr_inodes", "4096", 0) == 0 &&
      ::fsconfig(fs, FSCONFIG_SET_STRING, "mode", "0755", 0) == 0 &&
      ::fsconfig(fs, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) == 0) {
    mnt = ::fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
  }
  int err = errno;
  ::close(fs);
  if (mnt < 0) {
    errno = err;
    return -1;
  }
  int target = ::open(mountpoint, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (target < 0 ||
      ::move_mount(mnt, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0) {
    err = errno;
    if (target >= 0) ::close(target);
    ::close(mnt);
    errno = err;
    return -1;
  }
  ::close(target);
  return mnt;  // still refers to the root of the (now attached) tmpfs
}

int bring_loopback_up() noexcept {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return errno;
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, "lo", 3);
  int err = 0;
  if (::ioctl(s, SIOCGIFFLAGS, &ifr) != 0) {
    err = errno;
  } else {
    ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
    if (::ioctl(s, SIOCSIFFLAGS, &ifr) != 0) err = errno;
  }
  ::close(s);
  return err;
}

int write_file(const char* path, const char* data, std::size_t len) noexcept {
  int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  ssize_t n = ::write(fd, data, len);
  int err = n == static_cast<ssize_t>(len) ? 0 : (n < 0 ? errno : EIO);
  ::close(fd);
  return err;
}

// The box child, from clone3 to execveat. One flat list of steps, in order; each failure is
// reported as {step, errno} and ends the child. Between clone and exec: no allocation, no locks,
// no exceptions, no logging (the parent's other threads may hold the allocator's locks).
[[noreturn]] void box_child(const ChildArgs& a) noexcept {
  int ctl = a.ctl;

  // 1. Signals: the parent blocked them all around clone3; we restore default dispositions
  //    (handlers of the daemon make no sense here, and an inherited SIG_IGN would survive exec
  //    into every command), then unblock.
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction sa{};
    sa.sa_handler = SIG_DFL;
    (void)::sigaction(sig, &sa, nullptr);  // EINVAL for the signals glibc reserves: fine
  }
  sigset_t none;
  sigemptyset(&none);
  if (::sigprocmask(SIG_SETMASK, &none, nullptr) != 0) child_fail(ctl, BoxStep::kSignals, errno);
  //    Our own session: no terminal signals (a ^C at the daemon's terminal) reach the box.
  if (::setsid() < 0) child_fail(ctl, BoxStep::kSignals, errno);

  // 2. SECURITY: die with the daemon (its creating thread, precisely).
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) {
    child_fail(ctl, BoxStep::kDeathSignal, errno);
  }

  // 3. Wait for Go: the daemon has put us into the box cgroup, so everything below (and every
  //    page we charge) counts against the box. This is also the parent-alive re-check after
  //    arming PDEATHSIG: if the daemon died before that, the socket reads EOF (getppid() is no
  //    use here: as pid 1 of a new pid namespace our parent is always 0).
  proto::Go go;
  ssize_t got;
  do {
    got = ::recv(ctl, &go, sizeof go, 0);
  } while (got < 0 && errno == EINTR);
  if (got != static_cast<ssize_t>(sizeof go) || go.type != proto::MsgType::kGo) _exit(127);

  // 4. The cgroup namespace, rooted at the box cgroup we are now in (CLONE_NEWCGROUP at clone
  //    time would have rooted it at the daemon's).
  if (::unshare(CLONE_NEWCGROUP) != 0) child_fail(ctl, BoxStep::kCgroupNs, errno);

  // 5. SECURITY: no mount event propagates to or from the host.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    child_fail(ctl, BoxStep::kMountPrivate, errno);
  }

  // 6. The root: a small tmpfs, or the image root the daemon made (attached here, in the box's
  //    own mount namespace; the fd then refers to the attached root).
  int root = -1;
  if (a.root_tree >= 0) {
    int target = ::open(a.root_mountpoint, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (target < 0 || ::move_mount(a.root_tree, "", target, "",
                                   MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0) {
      child_fail(ctl, BoxStep::kRootFs, errno);
    }
    ::close(target);
    root = a.root_tree;
  } else {
    root = make_root_tmpfs(a.root_mountpoint, a.root_size);
  }
  if (root < 0) child_fail(ctl, BoxStep::kRootFs, errno);

  // 7. The box filesystem (mounts.h).
  std::size_t failed_op = 0;
  if (int err = apply_mount_plan(*a.plan, root, &failed_op); err != 0) {
    child_fail(ctl, BoxStep::kMountPlan, err, static_cast<std::uint32_t>(failed_op));
  }

  // 8. pivot_root(".", ".") stacks the old root on top of the new one at "/"; detaching it
  //    leaves only the box filesystem. SECURITY: nothing of the host's tree stays reachable.
  if (::fchdir(root) != 0 || ::syscall(SYS_pivot_root, ".", ".") != 0) {
    child_fail(ctl, BoxStep::kPivotRoot, errno);
  }
  if (::umount2(".", MNT_DETACH) != 0 || ::chdir("/") != 0) {
    child_fail(ctl, BoxStep::kDetachOldRoot, errno);
  }
  ::close(root);

  // 9. SECURITY: "/" (and /etc within it) read-only; /workspace, /tmp, /dev/shm are their own
  //    writable mounts.
  //    (A pooled box gets this when it is bound to its session: BoxSpec::root_read_only.)
  if (a.root_read_only) {
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if (!a.root_writable) attr.attr_set |= MOUNT_ATTR_RDONLY;
    if (::mount_setattr(AT_FDCWD, "/", 0, &attr, sizeof attr) != 0) {
      child_fail(ctl, BoxStep::kRootReadOnly, errno);
    }
  }

  // 10. Our own uts namespace.
  if (::sethostname(a.hostname, a.hostname_len) != 0) child_fail(ctl, BoxStep::kHostname, errno);

  // 11. Network mode "none": the new net namespace has only `lo`, down until we raise it.
  if (int err = bring_loopback_up(); err != 0) child_fail(ctl, BoxStep::kLoopback, err);

  // 12. The daemon runs at -1000; the box must be the one the OOM killer picks.
  if (int err = write_file("/proc/self/oom_score_adj", a.oom, a.oom_len); err != 0) {
    child_fail(ctl, BoxStep::kOomScoreAdj, err);
  }

  // 13. fds: /dev/null on 0-2, the control socket at kControlFd, the init binary just above it
  //     (close-on-exec), nothing else. First lift both out of the way of the fixed numbers.
  {
    int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    int hi_ctl = ::fcntl(ctl, F_DUPFD_CLOEXEC, 10);
    int hi_init = ::fcntl(a.init_fd, F_DUPFD_CLOEXEC, 10);
    if (null_fd < 0 || hi_ctl < 0 || hi_init < 0) child_fail(ctl, BoxStep::kFds, errno);
    if (::dup3(hi_ctl, proto::kControlFd, 0) < 0) child_fail(ctl, BoxStep::kFds, errno);
    ctl = proto::kControlFd;
    if (::dup3(hi_init, kInitFdInBox, O_CLOEXEC) < 0) child_fail(ctl, BoxStep::kFds, errno);
    for (int fd = 0; fd < 3; ++fd) {
      if (null_fd != fd && ::dup2(null_fd, fd) < 0) child_fail(ctl, BoxStep::kFds, errno);
    }
    // SECURITY: no daemon fd survives into the box.
    if (::syscall(SYS_close_range, kInitFdInBox + 1, ~0U, 0) != 0) {
      child_fail(ctl, BoxStep::kFds, errno);
    }
  }

  // 14. rlimits, inherited by the init and every command. Only now: until step 13 the child
  //     holds a copy of every daemon descriptor, and with a box's nofile limit (1024 by default)
  //     below their count, any open() before it would fail with EMFILE.
  if (int err = apply_rlimits(*a.rlimits); err != 0) child_fail(ctl, BoxStep::kRlimits, err);

  // 15. SECURITY: the init keeps only what it needs to start commands as the session user.
  if (int err = keep_only_capabilities(kInitCapabilities); err != 0) {
    child_fail(ctl, BoxStep::kCapabilities, err);
  }

  // 16. SECURITY: no exec can ever grant privileges again.
  if (int err = set_no_new_privs(); err != 0) child_fail(ctl, BoxStep::kNoNewPrivs, err);

  // 17. SECURITY: the seccomp filter, last: from here on every syscall is filtered (execveat
  //     is allowed).
  if (int err = install_seccomp(*a.seccomp); err != 0) child_fail(ctl, BoxStep::kSeccomp, err);

  // 18. Become agentbox-init.
  ::syscall(SYS_execveat, kInitFdInBox, "", a.argv, a.envp, AT_EMPTY_PATH);
  child_fail(ctl, BoxStep::kExecInit, errno);
}

// Blocks every signal in the calling thread for its lifetime (around clone3: the child must not
// run one of the daemon's handlers before it has reset them).
class BlockAllSignals {
 public:
  BlockAllSignals() {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old_);
  }
  ~BlockAllSignals() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

// Reads the child's first message: Hello (ok), SetupError, or EOF (the child died).
Status await_hello(int ctl, const BoxSpec& spec, pid_t pid) {
  pollfd pfd{ctl, POLLIN, 0};
  int r;
  do {
    r = ::poll(&pfd, 1, static_cast<int>(spec.start_timeout.count()));
  } while (r < 0 && errno == EINTR);
  if (r < 0) return fail_errno(errno, "poll(box " + spec.key + " control socket)");
  if (r == 0) {
    return fail(Code::kTimedOut, "box " + spec.key + ": no answer from the init within " +
                                     std::to_string(spec.start_timeout.count()) + " ms");
  }
  alignas(8) char buf[64];
  ssize_t n;
  do {
    n = ::recv(ctl, buf, sizeof buf, 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return fail_errno(errno, "recv(box " + spec.key + " control socket)");
  proto::MsgType type{};
  if (static_cast<std::size_t>(n) >= sizeof type) std::memcpy(&type, buf, sizeof type);
  if (type == proto::MsgType::kHello && static_cast<std::size_t>(n) == sizeof(proto::Hello)) {
    proto::Hello h;
    std::memcpy(&h, buf, sizeof h);
    if (h.version != proto::kVersion) {
      return fail(Code::kUnavailable, "box " + spec.key + ": agentbox-init speaks protocol " +
                                          std::to_string(h.version) + ", the daemon " +
                                          std::to_string(proto::kVersion) +
                                          " (init binary from another build?)");
    }
    return {};
  }
  if (type == proto::MsgType::kSetupError &&
      static_cast<std::size_t>(n) == sizeof(proto::SetupError)) {
    proto::SetupError e;
    std::memcpy(&e, buf, sizeof e);
    auto step = static_cast<BoxStep>(e.step);
    std::string what = std::string(box_step_name(step));
    if (step == BoxStep::kMountPlan && spec.fs != nullptr) what += ": " + spec.fs->describe(e.detail);
    Error err = Error::from_errno(e.err, "box " + spec.key + " setup step '" + what + "'");
    if (err.code != Code::kNotFound && err.code != Code::kInvalid) err.code = Code::kUnavailable;
    return std::unexpected(std::move(err));
  }
  return fail(Code::kUnavailable, "box " + spec.key + ": the box process (pid " +
                                      std::to_string(pid) + ") ended during setup");
}

}  // namespace

std::string_view box_step_name(BoxStep step) {
  switch (step) {
    case BoxStep::kSignals: return "reset signals";
    case BoxStep::kDeathSignal: return "PR_SET_PDEATHSIG";
    case BoxStep::kWaitGo: return "wait for the daemon";
    case BoxStep::kCgroupNs: return "cgroup namespace";
    case BoxStep::kMountPrivate: return "make mounts private";
    case BoxStep::kRootFs: return "root tmpfs";
    case BoxStep::kMountPlan: return "box filesystem";
    case BoxStep::kPivotRoot: return "pivot_root";
    case BoxStep::kDetachOldRoot: return "detach the old root";
    case BoxStep::kRootReadOnly: return "make / read-only";
    case BoxStep::kHostname: return "sethostname";
    case BoxStep::kLoopback: return "bring lo up";
    case BoxStep::kRlimits: return "rlimits";
    case BoxStep::kOomScoreAdj: return "oom_score_adj";
    case BoxStep::kFds: return "file descriptors";
    case BoxStep::kCapabilities: return "drop capabilities";
    case BoxStep::kNoNewPrivs: return "no_new_privs";
    case BoxStep::kSeccomp: return "seccomp";
    case BoxStep::kExecInit: return "exec agentbox-init";
  }
  return "unknown step";
}

Result<std::unique_ptr<Box>> Box::create(const BoxSpec& spec) {
  AB_CHECK(spec.fs != nullptr && spec.seccomp != nullptr && spec.cgroup != nullptr);
  AB_CHECK(spec.init_fd >= 0);
  if (spec.hostname.empty() || spec.hostname.size() > 64) {
    return fail(Code::kInvalid, "box hostname '" + spec.hostname + "' must be 1-64 bytes");
  }

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return fail_errno(errno, "socketpair(box control)");
  }
  UniqueFd daemon_end(sv[0]);
  UniqueFd child_end(sv[1]);
  // SO_PASSCRED: every message from the box carries its sender's pid in our pid namespace; that
  // is how the daemon learns the host pid of a command (init_protocol.h, ChildReady).
  int one = 1;
  if (::setsockopt(daemon_end.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0) {
    return fail_errno(errno, "setsockopt(SO_PASSCRED)");
  }
  int sndbuf = kControlSndBuf;
  if (::setsockopt(daemon_end.get(), SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof sndbuf) != 0) {
    (void)::setsockopt(daemon_end.get(), SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  }

  // Everything the child will read, prepared now.
  ChildArgs args;
  args.ctl = child_end.get();
  args.init_fd = spec.init_fd;
  args.root_mountpoint = spec.root_mountpoint.c_str();
  args.root_tree = spec.root_tree;
  args.root_writable = spec.root_writable;
  args.plan = spec.fs;
  args.seccomp = spec.seccomp;
  args.rlimits = &spec.rlimits;
  args.hostname = spec.hostname.c_str();
  args.hostname_len = spec.hostname.size();
  args.root_read_only = spec.root_read_only;
  std::snprintf(args.root_size, sizeof args.root_size, "%llu",
                static_cast<unsigned long long>(spec.root_tmpfs_bytes));
  args.oom_len = static_cast<std::size_t>(
      std::snprintf(args.oom, sizeof args.oom, "%d", spec.init_oom_score_adj));
  char init_name[sizeof proto::kInitName];
  std::memcpy(init_name, proto::kInitName, sizeof init_name);
  char* argv[] = {init_name, nullptr};
  char* envp[] = {nullptr};
  args.argv = argv;
  args.envp = envp;

  int pidfd = -1;
  CloneArgs ca{};
  ca.flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET | CLONE_PIDFD;
  ca.pidfd = reinterpret_cast<std::uintptr_t>(&pidfd);
  // No exit signal: a SIGCHLD-driven waitpid(-1) elsewhere in the daemon must not reap our init
  // (it only sees children that signal SIGCHLD); we reap it with waitid(P_PIDFD, __WALL).
  ca.exit_signal = 0;
  long pid;
  {
    BlockAllSignals blocked;
    pid = ::syscall(SYS_clone3, &ca, sizeof ca);
    if (pid == 0) box_child(args);
  }
  if (pid < 0) return fail_errno(errno, "clone3(box " + spec.key + ")");
  child_end.reset();
  // From here the Box owns the child: every early return kills and reaps it.
  std::unique_ptr<Box> box(
      new Box(static_cast<pid_t>(pid), UniqueFd(pidfd), std::move(daemon_end)));

  if (auto s = spec.cgroup->add_process(box->pid_); !s) {
    return std::unexpected(Error{s.error().code, s.error().sys_errno,
                                 "box " + spec.key + ": join cgroup: " + s.error().message});
  }
  proto::Go go;
  if (::send(box->control_.get(), &go, sizeof go, MSG_NOSIGNAL) != sizeof go) {
    return fail_errno(errno, "send(box " + spec.key + " go)");
  }
  if (auto s = await_hello(box->control_.get(), spec, box->pid_); !s) {
    return std::unexpected(s.error());
  }
  return box;
}

int Box::kill_and_reap() {
  if (reaped_ || !pidfd_) return status_;
  (void)::syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGKILL, nullptr, 0);
  siginfo_t info{};
  int rc;
  do {
    rc = ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info,
                 WEXITED | __WALL);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) {
    status_ = info.si_code == CLD_EXITED ? (info.si_status & 0xff) << 8 : info.si_status & 0x7f;
  }
  reaped_ = true;
  return status_;
}

Box::~Box() { kill_and_reap(); }

Result<std::string> encode_exec_request(const ExecCommand& cmd, bool has_stdin) {
  if (cmd.argv.empty()) return fail(Code::kInvalid, "exec: empty argv");
  if (cmd.argv.size() + cmd.env.size() > proto::kMaxStrings) {
    return fail(Code::kTooBig, "exec: more than " + std::to_string(proto::kMaxStrings) +
                                   " argv and env strings");
  }
  std::size_t payload = 0;
  auto check = [&payload](const std::string& s, const char* what) -> Status {
    if (s.find('\0') != std::string::npos) {
      return fail(Code::kInvalid, std::string("exec: ") + what + " contains a NUL byte");
    }
    payload += s.size() + 1;
    return {};
  };
  for (const auto& a : cmd.argv) {
    if (auto s = check(a, "argument"); !s) return std::unexpected(s.error());
  }
  for (const auto& e : cmd.env) {
    if (auto s = check(e, "environment entry"); !s) return std::unexpected(s.error());
  }
  if (auto s = check(cmd.cwd, "cwd"); !s) return std::unexpected(s.error());
  if (payload > proto::kMaxPayloadBytes) {
    return fail(Code::kTooBig, "exec: argv, env and cwd take " + std::to_string(payload) +
                                   " bytes, over the " +
                                   std::to_string(proto::kMaxPayloadBytes) + "-byte limit");
  }
  proto::ExecRequest req;
  if (cmd.self_join_fds > proto::kMaxJoinFds) {
    return fail(Code::kInvalid, "exec: " + std::to_string(cmd.self_join_fds) +
                                    " cgroup join fds (at most " +
                                    std::to_string(proto::kMaxJoinFds) + ")");
  }
  req.flags = has_stdin || cmd.pty ? proto::kExecHasStdin : 0;
  if (cmd.pty) req.flags |= proto::kExecPty;
  if (cmd.self_join_fds > 0) {
    req.flags |= proto::kExecSelfJoin;
    req.join_fds = cmd.self_join_fds;
  }
  req.id = cmd.id;
  req.cpu_time_sec = cmd.cpu_time_sec;
  req.uid = cmd.uid;
  req.gid = cmd.gid;
  req.oom_score_adj = cmd.oom_score_adj;
  req.argc = static_cast<std::uint32_t>(cmd.argv.size());
  req.envc = static_cast<std::uint32_t>(cmd.env.size());
  req.payload_bytes = static_cast<std::uint32_t>(payload);
  std::string msg;
  msg.reserve(sizeof req + payload);
  msg.append(reinterpret_cast<const char*>(&req), sizeof req);
  for (const auto& a : cmd.argv) msg.append(a.c_str(), a.size() + 1);
  for (const auto& e : cmd.env) msg.append(e.c_str(), e.size() + 1);
  msg.append(cmd.cwd.c_str(), cmd.cwd.size() + 1);
  return msg;
}

int send_exec_request(int control_fd, std::string_view msg, const int* fds, int nfds,
                      bool dont_wait) noexcept {
  if (nfds < 0 || nfds > proto::kMaxExecFds) return EINVAL;
  alignas(alignof(cmsghdr)) char cbuf[CMSG_SPACE(sizeof(int) * proto::kMaxExecFds)] = {};
  iovec iov{const_cast<char*>(msg.data()), msg.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (nfds > 0) {
    mh.msg_control = cbuf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * static_cast<std::size_t>(nfds));
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * static_cast<std::size_t>(nfds));
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * static_cast<std::size_t>(nfds));
  }
  for (;;) {
    ssize_t n = ::sendmsg(control_fd, &mh, MSG_NOSIGNAL | (dont_wait ? MSG_DONTWAIT : 0));
    if (n == static_cast<ssize_t>(msg.size())) return 0;
    if (n < 0 && errno == EINTR) continue;
    return n < 0 ? errno : EMSGSIZE;
  }
}

int send_signal_request(int control_fd, std::uint64_t id, int signo) noexcept {
  proto::Signal sig;
  sig.id = id;
  sig.signo = signo;
  for (;;) {
    ssize_t n = ::send(control_fd, &sig, sizeof sig, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(sizeof sig)) return 0;
    if (n < 0 && errno == EINTR) continue;
    return n < 0 ? errno : EMSGSIZE;
  }
}

int recv_box_message(int control_fd, bool dont_wait, BoxMessage* out) noexcept {
  alignas(8) char buf[64];
  alignas(alignof(cmsghdr)) char cbuf[CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(sizeof(int) * 8)];
  iovec iov{buf, sizeof buf};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf;
  mh.msg_controllen = sizeof cbuf;
  ssize_t n;
  do {
    n = ::recvmsg(control_fd, &mh, MSG_CMSG_CLOEXEC | (dont_wait ? MSG_DONTWAIT : 0));
  } while (n < 0 && errno == EINTR);
  if (n < 0) return -1;
  if (n == 0) return 0;
  *out = BoxMessage{};
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET) continue;
    if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
      ucred cred;
      std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
      out->sender_pid = cred.pid;
      out->sender_uid = cred.uid;
    } else if (c->cmsg_type == SCM_RIGHTS) {
      std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        ::close(fd);
      }
    }
  }
  proto::MsgType type{};
  if (static_cast<std::size_t>(n) >= sizeof type) std::memcpy(&type, buf, sizeof type);
  out->type = type;
  if (type == proto::MsgType::kChildReady && static_cast<std::size_t>(n) == sizeof(proto::ChildReady)) {
    proto::ChildReady m;
    std::memcpy(&m, buf, sizeof m);
    out->id = m.id;
    out->box_pid = m.box_pid;
    return 1;
  }
  if (type == proto::MsgType::kExited && static_cast<std::size_t>(n) == sizeof(proto::Exited)) {
    proto::Exited m;
    std::memcpy(&m, buf, sizeof m);
    out->id = m.id;
    out->status = m.status;
    out->cpu_usec = m.cpu_usec;
    return 1;
  }
  if (type == proto::MsgType::kHello && static_cast<std::size_t>(n) == sizeof(proto::Hello)) {
    return 1;
  }
  errno = EBADMSG;
  return -1;
}

}  // namespace agentbox::linux
