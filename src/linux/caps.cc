// Raw syscalls only: glibc's setuid family broadcasts the change to every thread it knows of
// (setxid), which in a child made by a raw clone() refers to the parent's threads. Each call
// here changes the calling thread's credentials, which in a single-threaded child is the process.
#include "linux/caps.h"

#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "linux/sys.h"

namespace agentbox::linux {
namespace {

// Highest capability number we try; the kernel's CAP_LAST_CAP is 40 today, and the loops stop at
// the first EINVAL (a cap this kernel does not know).
constexpr int kMaxCap = 63;

int clear_ambient() noexcept {
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) == 0) return 0;
  // Kernels before 4.3 have no ambient set, so there is nothing to clear.
  return errno == EINVAL ? 0 : errno;
}

int drop_bounding(std::uint64_t keep) noexcept {
  for (int cap = 0; cap <= kMaxCap; ++cap) {
    int in_set = ::prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
    if (in_set < 0) return errno == EINVAL ? 0 : errno;  // EINVAL: past the last cap
    // Dropping needs CAP_SETPCAP even for a cap already gone, so skip those: this makes the
    // call succeed without CAP_SETPCAP when the set is already as small as asked.
    if (in_set == 0 || (keep & cap_bit(cap)) != 0) continue;
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) return errno;
  }
  return 0;
}

int set_caps(std::uint64_t effective_and_permitted) noexcept {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  for (int i = 0; i < _LINUX_CAPABILITY_U32S_3; ++i) {
    auto word = static_cast<std::uint32_t>(effective_and_permitted >> (32 * i));
    data[i].effective = word;
    data[i].permitted = word;
    data[i].inheritable = 0;
  }
  return ::syscall(SYS_capset, &hdr, data) == 0 ? 0 : errno;
}

}  // namespace

int drop_all_capabilities() noexcept {
  return keep_only_capabilities(0);
}

int keep_only_capabilities(std::uint64_t keep) noexcept {
  // Ambient first (it would otherwise survive exec), bounding next (needs CAP_SETPCAP, which the
  // capset below may remove), capset last.
  if (int err = clear_ambient(); err != 0) return err;
  if (int err = drop_bounding(keep); err != 0) return err;
  return set_caps(keep);
}

int empty_bounding_set_keep(std::uint64_t keep) noexcept {
  if (int err = clear_ambient(); err != 0) return err;
  if (int err = drop_bounding(0); err != 0) return err;
  if (!bounding_set_is_empty()) return EPERM;
  return set_caps(keep);
}

bool bounding_set_is_empty() noexcept {
  for (int cap = 0; cap <= kMaxCap; ++cap) {
    int in_set = ::prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
    if (in_set < 0) return errno == EINVAL;  // EINVAL: past the last cap
    if (in_set != 0) return false;
  }
  return true;
}

int switch_user_and_drop_capabilities(uid_t uid, gid_t gid, bool bounding_already_empty) noexcept {
  // SECURITY: a command never runs as root: uid/gid 0 would keep every file owned by root
  // writable wherever the mounts allow it.
  if (uid == 0 || gid == 0) return EINVAL;
  // SECURITY: with `bounding_already_empty` the init emptied both sets before forking us
  // (empty_bounding_set_keep, checked there) and fork copies them: nothing to do per command.
  if (!bounding_already_empty) {
    if (int err = clear_ambient(); err != 0) return err;
    if (int err = drop_bounding(0); err != 0) return err;
  }
  // No supplementary groups (SECURITY.md T0): the init's group list is root's.
  if (int err = sys::switch_identity(uid, gid); err != 0) return err;
  if (int err = set_caps(0); err != 0) return err;
  // SECURITY: prove the switch stuck: with every uid non-zero and no CAP_SETUID left, going back
  // to root must be refused.
  if (::syscall(SYS_setresuid, 0, 0, 0) == 0) return ENOTRECOVERABLE;
  return 0;
}

int set_no_new_privs() noexcept {
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 ? 0 : errno;
}

}  // namespace agentbox::linux
