#pragma once
// The box's seccomp filter: policy (which syscalls a box may not make) apart from mechanism
// (installing it). The policy is compiled with libseccomp in the daemon, ahead of time, into a
// plain BPF program; the clone child only installs those bytes, which needs no allocation.
//
// Policy (default allow; a deny list of kernel attack surface and escape primitives, see
// SECURITY.md T2):
//  - EPERM: mount, umount2, pivot_root, chroot, the new mount API (open_tree, open_tree_attr,
//    move_mount, fsopen, fsconfig, fsmount, fspick, mount_setattr), ptrace, process_vm_readv/
//    writev, process_madvise, kcmp, pidfd_getfd, setns, unshare (any flags), clone with any
//    CLONE_NEW* flag, keyctl, add_key, request_key, bpf, perf_event_open, userfaultfd,
//    io_uring_setup/enter/register, init/finit/delete_module, kexec_load/kexec_file_load,
//    reboot, swapon/swapoff, syslog, acct, quotactl, quotactl_fd, iopl, ioperm, modify_ldt,
//    uselib, open_by_handle_at, name_to_handle_at, lookup_dcookie, vhangup, ioctl TIOCSTI and
//    TIOCLINUX (the 32-bit command compared under a mask, CVE-2019-10063), personality other
//    than the harmless personas.
//  - EAFNOSUPPORT: socket/socketpair of any family but AF_UNIX, AF_INET, AF_INET6.
//  - ENOSYS: clone3 (its flags live in memory seccomp cannot read; libc falls back to clone,
//    whose flags are checked).
//  - SIGSYS (kill the process): any syscall through a foreign ABI: i386 (int $0x80, sysenter)
//    and x32 (nr | 0x40000000).

#include <linux/filter.h>

#include <vector>

#include "common/error.h"

namespace agentbox::linux {

// A compiled classic-BPF seccomp program. Owns its instructions; install_seccomp() reads them.
struct SeccompProgram {
  std::vector<sock_filter> insns;
};

// Compiles the box policy above for the native (x86_64) ABI. Allocates; call in the daemon.
[[nodiscard]] Result<SeccompProgram> build_box_seccomp_program();

// Installs the program for the calling thread (and the children it forks/execs afterwards).
// Needs no_new_privs (set_no_new_privs() in linux/caps.h) or CAP_SYS_ADMIN. Returns 0 or errno.
// async-signal-safe: may be called in a clone child. Call it last before exec: every syscall
// after it is filtered.
int install_seccomp(const SeccompProgram& program) noexcept;

}  // namespace agentbox::linux
