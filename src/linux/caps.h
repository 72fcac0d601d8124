#pragma once
// Capabilities, no_new_privs and the switch to the session's identity, for the box's processes.
//
// Every function here is async-signal-safe: may be called in a clone child or in a child forked
// by the box's init (no allocation, no locks, raw syscalls); each returns 0 or an errno.
//
// The box's init (uid 0 in the box) keeps only what it needs to start commands as the session
// user: keep_only_capabilities(kInitCapabilities). Each command's child, forked by the init,
// then calls switch_user_and_drop_capabilities(uid, gid), set_no_new_privs(), seccomp, exec.

#include <linux/capability.h>
#include <sys/types.h>

#include <cstdint>

namespace agentbox::linux {

constexpr std::uint64_t cap_bit(int cap) {
  return std::uint64_t{1} << cap;
}

// What the init is exec'd with: CAP_SETUID/CAP_SETGID to become the session user in each child,
// CAP_SETPCAP to empty its own bounding set once it runs (see kInitRunCapabilities), CAP_KILL to
// signal commands that run as the session uid. The bounding set must still hold these at the
// init's exec: a root exec gets permitted = bounding set.
inline constexpr std::uint64_t kInitCapabilities =
    cap_bit(CAP_SETUID) | cap_bit(CAP_SETGID) | cap_bit(CAP_SETPCAP) | cap_bit(CAP_KILL);
// What the init keeps once it has emptied its bounding set (empty_bounding_set_keep()): every
// child it forks inherits the empty bounding set, so no command needs CAP_SETPCAP (nor the ~45
// prctl calls that emptying the set costs per command).
inline constexpr std::uint64_t kInitRunCapabilities =
    cap_bit(CAP_SETUID) | cap_bit(CAP_SETGID) | cap_bit(CAP_KILL);

// Clears the ambient set, empties the bounding set (every cap the kernel knows, found by
// dropping until EINVAL) and sets effective, permitted and inheritable to zero. Needs CAP_SETPCAP
// for the bounding set. Afterwards even uid 0 gains nothing at exec (permitted = bounding set).
int drop_all_capabilities() noexcept;

// As drop_all_capabilities(), but the caps in `keep` stay in the bounding, permitted and
// effective sets (inheritable and ambient are emptied).
int keep_only_capabilities(std::uint64_t keep) noexcept;

// Empties the bounding set entirely (CAP_SETPCAP needed, once), then keeps only `keep` in the
// permitted and effective sets. The caps a process already has stay usable (the bounding set
// limits only what an exec may grant); every child forked afterwards starts with an empty
// bounding set. Returns EPERM if the set is not empty afterwards.
int empty_bounding_set_keep(std::uint64_t keep) noexcept;

// True if the calling thread's bounding set is empty (one prctl per cap the kernel knows).
bool bounding_set_is_empty() noexcept;

// In this order, because each step needs a capability the next one loses: empties ambient and
// bounding sets (CAP_SETPCAP), setgroups({}) and setresgid(gid) (CAP_SETGID), setresuid(uid)
// (CAP_SETUID; the kernel clears effective and permitted when all uids become non-zero), then
// zeroes every set explicitly and verifies that uid 0 cannot be regained. uid/gid must not be 0.
// `bounding_already_empty`: the caller inherited an empty bounding set and an empty ambient set
// (a child of an init that called empty_bounding_set_keep()), so both steps are skipped; the
// switch is still verified.
int switch_user_and_drop_capabilities(uid_t uid, gid_t gid,
                                      bool bounding_already_empty = false) noexcept;

// PR_SET_NO_NEW_PRIVS: exec can never grant privileges again (setuid bits, file caps).
int set_no_new_privs() noexcept;

}  // namespace agentbox::linux
