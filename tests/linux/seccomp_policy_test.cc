// The box seccomp filter, installed for real in forked children. Denied calls are probed with
// invalid arguments (bad fds, bad pointers, bad flags), so that if the filter let one through the
// kernel would refuse it with a different errno and change nothing on the host.
#include "linux/seccomp_policy.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "common/unique_fd.h"
#include "linux/caps.h"

namespace agentbox::linux {
namespace {

#ifndef SYS_open_tree_attr
#define SYS_open_tree_attr 467
#endif

// Outcome of running fn in a forked child under the box filter.
struct ChildOutcome {
  int status = 0;       // waitpid status
  std::string failure;  // what the child reported before exiting 1
};

// The child reports failures through a pipe so the parent's assertion names them.
class Child {
 public:
  explicit Child(int fd) : fd_(fd) {}
  // Records a failure (if !ok) and keeps going, so one run reports every broken expectation.
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    failed_ = true;
    std::string line = what + " (errno " + std::to_string(errno) + " " +
                       (strerrorname_np(errno) ? strerrorname_np(errno) : "?") + ")\n";
    (void)!::write(fd_, line.data(), line.size());
  }
  // A raw syscall that must fail with `err`.
  void expect_errno(long rc, int err, const std::string& what) {
    int e = errno;
    errno = e;
    expect(rc == -1 && e == err,
           what + " should fail with " + strerrorname_np(err) + ", got rc " + std::to_string(rc));
  }
  bool failed() const { return failed_; }

 private:
  int fd_;
  bool failed_ = false;
};

const SeccompProgram& box_program() {
  static const SeccompProgram prog = [] {
    auto p = build_box_seccomp_program();
    if (!p) {
      ADD_FAILURE() << p.error().message;
      return SeccompProgram{};
    }
    return std::move(*p);
  }();
  return prog;
}

ChildOutcome run_filtered(const std::function<void(Child&)>& fn, bool install = true) {
  const SeccompProgram& prog = box_program();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {-1, "pipe2 failed"};
  UniqueFd rd(fds[0]), wr(fds[1]);
  pid_t pid = ::fork();
  if (pid == 0) {
    rd.reset();
    Child c(wr.get());
    if (install) {
      c.expect(set_no_new_privs() == 0, "set_no_new_privs");
      int err = install_seccomp(prog);
      errno = err;
      c.expect(err == 0, "install_seccomp");
      if (err != 0) ::_exit(1);
    }
    fn(c);
    ::_exit(c.failed() ? 1 : 0);
  }
  wr.reset();
  ChildOutcome out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(rd.get(), buf, sizeof buf)) > 0)
    out.failure.append(buf, static_cast<std::size_t>(n));
  ::waitpid(pid, &out.status, 0);
  return out;
}

#define EXPECT_CHILD_OK(outcome)                                     \
  do {                                                               \
    auto o_ = (outcome);                                             \
    EXPECT_TRUE(WIFEXITED(o_.status) && WEXITSTATUS(o_.status) == 0) \
        << "status " << o_.status << "; child reported:\n"           \
        << o_.failure;                                               \
  } while (0)

TEST(SeccompPolicy, BuildsABoundedProgram) {
  const SeccompProgram& prog = box_program();
  ASSERT_FALSE(prog.insns.empty());
  EXPECT_LE(prog.insns.size(), 4096u);  // BPF_MAXINSNS: larger programs are refused by the kernel
  // Building twice yields the same program: the policy has no hidden state.
  auto again = build_box_seccomp_program();
  ASSERT_TRUE(again) << again.error().message;
  ASSERT_EQ(again->insns.size(), prog.insns.size());
  EXPECT_EQ(
      std::memcmp(again->insns.data(), prog.insns.data(), prog.insns.size() * sizeof(sock_filter)),
      0);
}

TEST(SeccompPolicy, StatusShowsFilterMode) {
  EXPECT_CHILD_OK(run_filtered([](Child& c) {
    std::ifstream status("/proc/self/status");
    std::string line;
    bool seen = false, nnp = false;
    while (std::getline(status, line)) {
      if (line == "Seccomp:\t2") seen = true;
      if (line == "NoNewPrivs:\t1") nnp = true;
    }
    c.expect(seen, "/proc/self/status Seccomp: 2");
    c.expect(nnp, "/proc/self/status NoNewPrivs: 1");
  }));
}

TEST(SeccompPolicy, MountFamilyDenied) {
  auto bad = reinterpret_cast<const char*>(1);
  EXPECT_CHILD_OK(run_filtered([bad](Child& c) {
    c.expect_errno(::syscall(SYS_mount, bad, bad, bad, 0, nullptr), EPERM, "mount");
    c.expect_errno(::syscall(SYS_umount2, bad, 0), EPERM, "umount2");
    c.expect_errno(::syscall(SYS_pivot_root, bad, bad), EPERM, "pivot_root");
    c.expect_errno(::syscall(SYS_chroot, bad), EPERM, "chroot");
    c.expect_errno(::syscall(SYS_open_tree, -1, bad, 0), EPERM, "open_tree");
    c.expect_errno(::syscall(SYS_open_tree_attr, -1, bad, 0, nullptr, 0), EPERM, "open_tree_attr");
    c.expect_errno(::syscall(SYS_move_mount, -1, bad, -1, bad, 0), EPERM, "move_mount");
    c.expect_errno(::syscall(SYS_fsopen, bad, 0), EPERM, "fsopen");
    c.expect_errno(::syscall(SYS_fsconfig, -1, 0, nullptr, nullptr, 0), EPERM, "fsconfig");
    c.expect_errno(::syscall(SYS_fsmount, -1, 0, 0), EPERM, "fsmount");
    c.expect_errno(::syscall(SYS_fspick, -1, bad, 0), EPERM, "fspick");
    c.expect_errno(::syscall(SYS_mount_setattr, -1, bad, 0, nullptr, 0), EPERM, "mount_setattr");
  }));
}

TEST(SeccompPolicy, NamespacesDenied) {
  EXPECT_CHILD_OK(run_filtered([](Child& c) {
    c.expect_errno(::unshare(CLONE_NEWUSER), EPERM, "unshare(CLONE_NEWUSER)");
    c.expect_errno(::unshare(CLONE_NEWNS), EPERM, "unshare(CLONE_NEWNS)");
    c.expect_errno(::unshare(CLONE_FILES), EPERM, "unshare(CLONE_FILES)");
    c.expect_errno(::syscall(SYS_setns, -1, 0), EPERM, "setns");
    for (unsigned long flag : {CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUTS,
                               CLONE_NEWIPC, CLONE_NEWCGROUP}) {
      // A raw clone that would create a child if allowed; should one appear, it leaves at once.
      long rc = ::syscall(SYS_clone, flag | SIGCHLD, nullptr, nullptr, nullptr, 0);
      if (rc == 0) ::_exit(0);
      if (rc > 0) ::waitpid(static_cast<pid_t>(rc), nullptr, 0);
      c.expect_errno(rc, EPERM, "clone(flag " + std::to_string(flag) + ")");
    }
    clone_args args{};
    args.flags = CLONE_NEWUSER;
    args.exit_signal = SIGCHLD;
    long rc = ::syscall(SYS_clone3, &args, sizeof args);
    if (rc == 0) ::_exit(0);
    if (rc > 0) ::waitpid(static_cast<pid_t>(rc), nullptr, 0);
    c.expect_errno(rc, ENOSYS, "clone3");
  }));
}

TEST(SeccompPolicy, ForkThreadsExecStillWork) {
  EXPECT_CHILD_OK(run_filtered([](Child& c) {
    // glibc's fork() is clone(SIGCHLD|CLONE_CHILD_*), pthread_create tries clone3 first and falls
    // back to clone on ENOSYS: both must keep working.
    pid_t pid = ::fork();
    if (pid == 0) {
      ::execl("/bin/true", "true", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    c.expect(pid > 0, "fork");
    int status = 0;
    c.expect(::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
             "fork+exec /bin/true exit 0");
    int value = 0;
    std::thread t([&value] { value = 42; });
    t.join();
    c.expect(value == 42, "std::thread");
    int p[2];
    c.expect(::pipe(p) == 0, "pipe");
    c.expect(::write(p[1], "hi", 2) == 2, "write");
    char buf[2];
    c.expect(::read(p[0], buf, 2) == 2 && buf[0] == 'h', "read");
  }));
}

TEST(SeccompPolicy, TerminalInjectionDeniedWithHighBits) {
  EXPECT_CHILD_OK(run_filtered([](Child& c) {
    char ch = 'x';
    // fd -1: unfiltered these fail with EBADF, so EPERM proves the filter matched.
    c.expect_errno(::ioctl(-1, TIOCSTI, &ch), EPERM, "ioctl(TIOCSTI)");
    c.expect_errno(::ioctl(-1, TIOCLINUX, &ch), EPERM, "ioctl(TIOCLINUX)");
    // CVE-2019-10063: the kernel truncates cmd to 32 bits; the filter must too.
    c.expect_errno(::syscall(SYS_ioctl, -1, (1ul << 32) | TIOCSTI, &ch), EPERM,
                   "ioctl(TIOCSTI | 1 << 32)");
    c.expect_errno(::syscall(SYS_ioctl, -1, 0xffffffff00000000ul | TIOCLINUX, &ch), EPERM,
                   "ioctl(TIOCLINUX | high bits)");
    c.expect_errno(::ioctl(-1, TIOCGWINSZ, nullptr), EBADF, "ioctl(TIOCGWINSZ) is not filtered");
  }));
}

TEST(SeccompPolicy, OnlyUnixAndInetSockets) {
  EXPECT_CHILD_OK(run_filtered([](Child& c) {
    for (int family : {AF_UNIX, AF_INET, AF_INET6}) {
      UniqueFd s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
      c.expect(s.valid(), "socket(family " + std::to_string(family) + ") allowed");
    }
    int sv[2];
    c.expect(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair(AF_UNIX)");
    for (int family : {AF_NETLINK, AF_PACKET, AF_VSOCK, AF_KEY, AF_ALG, AF_BLUETOOTH, AF_APPLETALK,
                       AF_X25, AF_NETROM, AF_UNSPEC}) {
      c.expect_errno(::socket(family, SOCK_RAW | SOCK_CLOEXEC, 0), EAFNOSUPPORT,
                     "socket(family " + std::to_string(family) + ")");
    }
    c.expect_errno(::syscall(SYS_socket, (1ul << 32) | AF_NETLINK, SOCK_RAW, 0), EAFNOSUPPORT,
                   "socket(AF_NETLINK | 1 << 32)");
    c.expect_errno(::socketpair(AF_NETLINK, SOCK_RAW, 0, sv), EAFNOSUPPORT, "socketpair(netlink)");
  }));
}

TEST(SeccompPolicy, KernelAttackSurfaceDenied) {
  auto bad = reinterpret_cast<void*>(1);
  EXPECT_CHILD_OK(run_filtered([bad](Child& c) {
    ::setsid();  // no controlling tty, so an unfiltered vhangup could hang up nothing
    struct Probe {
      long nr;
      const char* name;
      long a0, a1, a2, a3, a4;
    };
    const long b = reinterpret_cast<long>(bad);
    constexpr long kNoSuchPid = 0x3ffffff0;  // above pid_max: ESRCH if a probe got through
    const Probe probes[] = {
        {SYS_ptrace, "ptrace", PTRACE_ATTACH, kNoSuchPid, 0, 0, 0},
        {SYS_process_vm_readv, "process_vm_readv", 1, b, 1, b, 1},
        {SYS_process_vm_writev, "process_vm_writev", 1, b, 1, b, 1},
        {SYS_process_madvise, "process_madvise", -1, b, 1, 0, 0},
        {SYS_kcmp, "kcmp", kNoSuchPid, kNoSuchPid, 99, 0, 0},
        {SYS_pidfd_getfd, "pidfd_getfd", -1, 0, 0, 0, 0},
        {SYS_keyctl, "keyctl", 0, -1, 0, 0, 0},
        {SYS_add_key, "add_key", b, b, b, 0, 0},
        {SYS_request_key, "request_key", b, b, b, 0, 0},
        {SYS_bpf, "bpf", -1, 0, 0, 0, 0},
        {SYS_perf_event_open, "perf_event_open", b, 0, -1, -1, 0},
        {SYS_userfaultfd, "userfaultfd", 0x7fffffff, 0, 0, 0, 0},
        {SYS_io_uring_setup, "io_uring_setup", 0, b, 0, 0, 0},
        {SYS_io_uring_enter, "io_uring_enter", -1, 0, 0, 0, 0},
        {SYS_io_uring_register, "io_uring_register", -1, 0, 0, 0, 0},
        {SYS_init_module, "init_module", b, 0, b, 0, 0},
        {SYS_finit_module, "finit_module", -1, b, 0, 0, 0},
        {SYS_delete_module, "delete_module", b, 0, 0, 0, 0},
        {SYS_kexec_load, "kexec_load", 0, 0, 0, 0xdeadbeef, 0},
        {SYS_kexec_file_load, "kexec_file_load", -1, -1, 0, 0, 0xdeadbeef},
        {SYS_reboot, "reboot", 0, 0, 0, 0, 0},
        {SYS_swapon, "swapon", b, 0, 0, 0, 0},
        {SYS_swapoff, "swapoff", b, 0, 0, 0, 0},
        {SYS_syslog, "syslog", 999, 0, 0, 0, 0},
        {SYS_acct, "acct", b, 0, 0, 0, 0},
        {SYS_quotactl, "quotactl", 0, b, 0, 0, 0},
        {SYS_quotactl_fd, "quotactl_fd", -1, 0, 0, 0, 0},
        {SYS_iopl, "iopl", 99, 0, 0, 0, 0},
        {SYS_ioperm, "ioperm", -1, 1, 1, 0, 0},
        {SYS_modify_ldt, "modify_ldt", 99, 0, 0, 0, 0},
        {SYS_uselib, "uselib", b, 0, 0, 0, 0},
        {SYS_lookup_dcookie, "lookup_dcookie", 0, 0, 0, 0, 0},
        {SYS_vhangup, "vhangup", 0, 0, 0, 0, 0},
        {SYS_open_by_handle_at, "open_by_handle_at", -1, b, 0, 0, 0},
        {SYS_name_to_handle_at, "name_to_handle_at", -1, b, b, b, 0},
    };
    for (const Probe& p : probes) {
      c.expect_errno(::syscall(p.nr, p.a0, p.a1, p.a2, p.a3, p.a4), EPERM, p.name);
    }
  }));
}

TEST(SeccompPolicy, PersonalityOnlyHarmlessPersonas) {
  EXPECT_CHILD_OK(run_filtered([](Child& c) {
    c.expect(::personality(0xffffffff) != -1, "personality(query)");
    c.expect(::personality(PER_LINUX) != -1, "personality(PER_LINUX)");
    c.expect_errno(::personality(ADDR_NO_RANDOMIZE), EPERM, "personality(ADDR_NO_RANDOMIZE)");
    c.expect_errno(::personality(READ_IMPLIES_EXEC), EPERM, "personality(READ_IMPLIES_EXEC)");
  }));
}

// getpid through the i386 ABI: int $0x80 with eax = 20. Without IA32 emulation the kernel
// faults the process: SIGSEGV's default action must take it, not a handler of the sanitizer
// build (AddressSanitizer reports the fault and exits 1 instead).
long i386_getpid() {
  ::signal(SIGSEGV, SIG_DFL);
  long ret = 20;
  asm volatile("int $0x80" : "+a"(ret) : : "memory");
  return ret;
}

TEST(SeccompPolicy, I386AbiKillsTheProcess) {
  // Baseline without the filter: on this kernel int $0x80 works (IA32 emulation), so the kill
  // below is the filter's doing. Without IA32 emulation the kernel itself faults the process.
  auto baseline = run_filtered([](Child& c) { c.expect(i386_getpid() == ::getpid(), "int $0x80"); },
                               /*install=*/false);
  bool ia32 = WIFEXITED(baseline.status) && WEXITSTATUS(baseline.status) == 0;
  auto o = run_filtered([](Child&) { (void)i386_getpid(); });
  ASSERT_TRUE(WIFSIGNALED(o.status)) << "status " << o.status << " " << o.failure;
  EXPECT_EQ(WTERMSIG(o.status), ia32 ? SIGSYS : SIGSEGV);
}

TEST(SeccompPolicy, X32AbiKillsTheProcess) {
  constexpr long kX32Bit = 0x40000000;
  auto o = run_filtered([](Child&) { (void)::syscall(kX32Bit | SYS_getpid); });
  ASSERT_TRUE(WIFSIGNALED(o.status)) << "status " << o.status << " " << o.failure;
  EXPECT_EQ(WTERMSIG(o.status), SIGSYS);
  // And a denied call through x32 too.
  auto m = run_filtered([](Child&) { (void)::syscall(kX32Bit | SYS_unshare, CLONE_NEWUSER); });
  ASSERT_TRUE(WIFSIGNALED(m.status)) << "status " << m.status << " " << m.failure;
  EXPECT_EQ(WTERMSIG(m.status), SIGSYS);
}

TEST(SeccompPolicy, InstallFailsWithoutNoNewPrivsOrCaps) {
  // The contract: install needs no_new_privs (or CAP_SYS_ADMIN). A child without both is refused.
  auto o = run_filtered(
      [](Child& c) {
        c.expect(::prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) == 0, "drop bset");
        __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
        __user_cap_data_struct data[2] = {};
        c.expect(::syscall(SYS_capset, &hdr, data) == 0, "capset 0");
        c.expect(install_seccomp(box_program()) == EACCES, "install without NNP -> EACCES");
      },
      /*install=*/false);
  EXPECT_CHILD_OK(o);
}

}  // namespace
}  // namespace agentbox::linux
