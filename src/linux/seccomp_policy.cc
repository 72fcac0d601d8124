#include "linux/seccomp_policy.h"

#include <fcntl.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include "common/unique_fd.h"

// Syscalls newer than the libc headers we build against (Debian 12: glibc 2.36, Linux 6.1).
// Numbers are x86_64's, the only ABI the filter admits.
#ifndef SYS_open_tree_attr
#define SYS_open_tree_attr 467  // Linux 6.15: open_tree() that can also change mount attributes
#endif

namespace agentbox::linux {
namespace {

#if !defined(__x86_64__)
#error "the box seccomp policy is written for x86_64 only"
#endif

using Ctx = std::unique_ptr<void, decltype(&seccomp_release)>;

// libseccomp returns -errno.
Status check(int rc, std::string_view what) {
  if (rc < 0) return fail_errno(-rc, std::string("libseccomp ") + std::string(what));
  return {};
}

struct Denied {
  int nr;
  const char* name;  // for error messages
};
// clang-format off
#define AB_SYS(n) Denied{SYS_##n, #n}

// Denied outright with EPERM, whatever the arguments.
constexpr Denied kDeniedSyscalls[] = {
    // Filesystem view: the box's mounts are fixed once the init has set them up.
    AB_SYS(mount), AB_SYS(umount2), AB_SYS(pivot_root), AB_SYS(chroot), AB_SYS(open_tree),
    AB_SYS(open_tree_attr), AB_SYS(move_mount), AB_SYS(fsopen), AB_SYS(fsconfig), AB_SYS(fsmount),
    AB_SYS(fspick), AB_SYS(mount_setattr),
    // Other processes' memory and file descriptors.
    AB_SYS(ptrace), AB_SYS(process_vm_readv), AB_SYS(process_vm_writev), AB_SYS(process_madvise),
    AB_SYS(kcmp), AB_SYS(pidfd_getfd),
    // Namespaces: new ones (user namespaces above all: they hand out capabilities) and joining.
    AB_SYS(unshare), AB_SYS(setns),
    // Kernel attack surface with a long CVE record and no use in an agent's box.
    AB_SYS(keyctl), AB_SYS(add_key), AB_SYS(request_key), AB_SYS(bpf), AB_SYS(perf_event_open),
    AB_SYS(userfaultfd), AB_SYS(io_uring_setup), AB_SYS(io_uring_enter), AB_SYS(io_uring_register),
    AB_SYS(modify_ldt), AB_SYS(uselib), AB_SYS(lookup_dcookie),
    // Host administration (also refused for lack of capabilities; denied here as a second wall).
    AB_SYS(init_module), AB_SYS(finit_module), AB_SYS(delete_module), AB_SYS(kexec_load),
    AB_SYS(kexec_file_load), AB_SYS(reboot), AB_SYS(swapon), AB_SYS(swapoff), AB_SYS(syslog),
    AB_SYS(acct), AB_SYS(quotactl), AB_SYS(quotactl_fd), AB_SYS(iopl), AB_SYS(ioperm),
    AB_SYS(vhangup),
    // File handles bypass path lookup and so the mount view (the "shocker" escape).
    AB_SYS(open_by_handle_at), AB_SYS(name_to_handle_at),
};
#undef AB_SYS
// clang-format on

// clone() flags that create namespaces. CLONE_NEWTIME (0x80) is absent: clone() cannot take it
// (the low byte is the exit signal); only clone3/unshare can, and both are denied.
constexpr unsigned long kCloneNewFlags[] = {CLONE_NEWNS,  CLONE_NEWCGROUP, CLONE_NEWUTS,
                                            CLONE_NEWIPC, CLONE_NEWUSER,   CLONE_NEWPID,
                                            CLONE_NEWNET};

// Personas a program may legitimately ask for (the set Docker's default profile allows):
// PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32, and 0xffffffff = query.
constexpr scmp_datum_t kAllowedPersonas[] = {PER_LINUX, PER_LINUX32, UNAME26,
                                             scmp_datum_t{UNAME26} | scmp_datum_t{PER_LINUX32},
                                             0xffffffffu};

// Denies syscall nr with EPERM unless the low 32 bits of its first argument are one of
// `allowed` (sorted, ascending, each < 2^32). libseccomp cannot AND two comparisons of the same
// argument, so "not in the set" is written as a union: the complement of the set, split into
// aligned power-of-two blocks, each one MASKED_EQ rule. Comparing only the low 32 bits matches
// what the kernel reads for an unsigned int argument, whatever garbage the high bits carry.
Status deny_outside_u32(scmp_filter_ctx ctx, int nr, std::span<const scmp_datum_t> allowed,
                        const char* name) {
  std::uint64_t next = 0;  // lowest value not yet covered
  auto deny_range = [&](std::uint64_t lo, std::uint64_t hi) -> Status {  // [lo, hi)
    while (lo < hi) {
      // The largest aligned block starting at lo that fits below hi.
      std::uint64_t size = lo == 0 ? (std::uint64_t{1} << 32) : (lo & -lo);
      while (lo + size > hi) size >>= 1;
      const scmp_datum_t mask = ~(size - 1) & 0xffffffffu;
      if (auto st = check(seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 1,
                                           SCMP_A0(SCMP_CMP_MASKED_EQ, mask, lo)),
                          name);
          !st) {
        return st;
      }
      lo += size;
    }
    return {};
  };
  for (scmp_datum_t v : allowed) {
    if (auto st = deny_range(next, v); !st) return st;
    next = v + 1;
  }
  return deny_range(next, std::uint64_t{1} << 32);
}

Status add_rules(scmp_filter_ctx ctx) {
  const std::uint32_t eperm = SCMP_ACT_ERRNO(EPERM);
  for (const Denied& d : kDeniedSyscalls) {
    if (auto st = check(seccomp_rule_add(ctx, eperm, d.nr, 0), d.name); !st) return st;
  }

  // SECURITY: clone with any namespace flag. One rule per flag (rules are OR-ed; comparisons
  // inside one rule are AND-ed). The kernel reads only the low 32 bits of clone's flags, and each
  // mask selects one of those bits, so high garbage cannot hide a flag.
  for (unsigned long flag : kCloneNewFlags) {
    if (auto st = check(seccomp_rule_add(ctx, eperm, SCMP_SYS(clone), 1,
                                         SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag)),
                        "clone(CLONE_NEW*)");
        !st) {
      return st;
    }
  }
  // clone3 passes its flags in a struct seccomp cannot inspect: refuse it as if the kernel were
  // too old, so glibc (2.34+) and others fall back to clone(), whose flags are checked above.
  if (auto st = check(seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0), "clone3");
      !st) {
    return st;
  }

  // SECURITY: TIOCSTI pushes input into a terminal (a shell outside the box reads it), TIOCLINUX
  // can paste the console selection. The kernel takes ioctl's cmd as unsigned int, so compare the
  // low 32 bits only: TIOCSTI | 1 << 32 must not slip through (CVE-2019-10063, Flatpak).
  for (unsigned long cmd :
       {static_cast<unsigned long>(TIOCSTI), static_cast<unsigned long>(TIOCLINUX)}) {
    if (auto st = check(seccomp_rule_add(ctx, eperm, SCMP_SYS(ioctl), 1,
                                         SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, cmd)),
                        "ioctl(TIOCSTI/TIOCLINUX)");
        !st) {
      return st;
    }
  }

  // SECURITY: socket families other than AF_UNIX (1), AF_INET (2), AF_INET6 (10): netlink (route,
  // xfrm, netfilter), packet, vsock, bluetooth, ... are where socket-level kernel bugs live. The
  // kernel reads domain as int; any value with high bits set is >= 11 and denied as well.
  const std::uint32_t eafnosupport = SCMP_ACT_ERRNO(EAFNOSUPPORT);
  for (int sc : {SCMP_SYS(socket), SCMP_SYS(socketpair)}) {
    if (auto st = check(seccomp_rule_add(ctx, eafnosupport, sc, 1,
                                         SCMP_A0(SCMP_CMP_GT, scmp_datum_t{AF_INET6})),
                        "socket(family > AF_INET6)");
        !st) {
      return st;
    }
    for (scmp_datum_t family = 0; family < AF_INET6; ++family) {
      if (family == AF_UNIX || family == AF_INET) continue;
      if (auto st = check(seccomp_rule_add(ctx, eafnosupport, sc, 1, SCMP_A0(SCMP_CMP_EQ, family)),
                          "socket(family)");
          !st) {
        return st;
      }
    }
  }

  // personality: READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE and friends weaken the box's own
  // hardening (and ASLR for what it execs). Deny anything outside the allowed personas.
  return deny_outside_u32(ctx, SCMP_SYS(personality), kAllowedPersonas, "personality");
}

}  // namespace

Result<SeccompProgram> build_box_seccomp_program() {
  Ctx ctx(seccomp_init(SCMP_ACT_ALLOW), &seccomp_release);
  if (!ctx) return fail(Code::kInternal, "seccomp_init: failed");
  // SECURITY: foreign ABIs. The filter holds only the native arch, so an i386 syscall
  // (int $0x80, sysenter) fails the arch check and takes the bad-arch action, and libseccomp's
  // x86_64 code also sends x32 numbers (nr | 0x40000000) there. Both kill the process: no
  // program in a box has a reason to use them, and a denial with errno would let an exploit
  // probe on.
  if (auto st = check(seccomp_attr_set(ctx.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS),
                      "attr(ACT_BADARCH)");
      !st) {
    return std::unexpected(std::move(st.error()));
  }
  // A binary tree of syscall numbers instead of a linear list: every syscall a box makes runs
  // this filter, so its depth is on every command's hot path.
  if (auto st = check(seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2), "attr(OPTIMIZE)");
      !st) {
    return std::unexpected(std::move(st.error()));
  }
  if (auto st = add_rules(ctx.get()); !st) return std::unexpected(std::move(st.error()));

  // libseccomp 2.5 exports only to an fd; a memfd keeps it in memory.
  UniqueFd fd(::memfd_create("agentbox-seccomp", MFD_CLOEXEC));
  if (!fd) return fail_errno(errno, "memfd_create(agentbox-seccomp)");
  if (auto st = check(seccomp_export_bpf(ctx.get(), fd.get()), "export_bpf"); !st) {
    return std::unexpected(std::move(st.error()));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return fail_errno(errno, "fstat(seccomp memfd)");
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0 || size % sizeof(sock_filter) != 0 || size / sizeof(sock_filter) > BPF_MAXINSNS) {
    return fail(Code::kInternal,
                "seccomp_export_bpf: bad program size " + std::to_string(size) + " bytes");
  }
  SeccompProgram prog;
  prog.insns.resize(size / sizeof(sock_filter));
  std::size_t done = 0;
  auto* out = reinterpret_cast<char*>(prog.insns.data());
  while (done < size) {
    ssize_t n = ::pread(fd.get(), out + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "pread(seccomp memfd)");
    if (n == 0) return fail(Code::kInternal, "pread(seccomp memfd): short program");
    done += static_cast<std::size_t>(n);
  }
  return prog;
}

int install_seccomp(const SeccompProgram& program) noexcept {
  sock_fprog fprog{};
  fprog.len = static_cast<unsigned short>(program.insns.size());
  fprog.filter = const_cast<sock_filter*>(program.insns.data());
  return ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) == 0 ? 0 : errno;
}

}  // namespace agentbox::linux
