// The async-signal-safe part of linux/sys.h (raw syscalls, no allocation): compiled into the
// linux module and, directly, into the static agentbox-init.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "linux/sys.h"

namespace agentbox::linux::sys {

int openat2_raw(int dirfd, const char* path, std::uint64_t flags, std::uint64_t resolve) noexcept {
  open_how how{};
  how.flags = flags | O_CLOEXEC;
  how.resolve = resolve;
  int eagain = 0;
  for (;;) {
    const long fd = ::syscall(SYS_openat2, dirfd, path, &how, sizeof how);
    if (fd >= 0) return static_cast<int>(fd);
    if (errno == EINTR) continue;
    if (errno != EAGAIN || ++eagain >= kOpenat2Attempts) return -1;
  }
}

int switch_identity(uid_t uid, gid_t gid) noexcept {
  if (::syscall(SYS_setgroups, 0, nullptr) != 0) return errno;
  if (::syscall(SYS_setresgid, gid, gid, gid) != 0) return errno;
  if (::syscall(SYS_setresuid, uid, uid, uid) != 0) return errno;
  return 0;
}

}  // namespace agentbox::linux::sys
