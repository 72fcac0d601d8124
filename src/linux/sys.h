#pragma once
// The one home of kernel calls that more than one module makes: openat2 with its single EAGAIN
// policy, pipes, directory reading and the identity switch. Everything else calls these. Left
// out on purpose: the box's init (src/linux/init/, which links nothing), RootedFs::remove_tree's
// getdents64 loop (it deletes while it reads, so that an agent's directory of a million entries
// costs no memory) and caps.cc's check that setresuid(0) is refused after the switch.
//
// The functions marked noexcept are async-signal-safe (no allocation, no locks, raw syscalls):
// fit for a clone child before exec. The others allocate and return Result.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"

namespace agentbox::linux::sys {

// openat2 fails with EAGAIN when a rename or mount anywhere on the system raced a ".." step of a
// RESOLVE_BENEATH / RESOLVE_IN_ROOT walk (the kernel cannot prove the walk stayed inside). Honest
// callers hit it rarely; an agent looping renames in its own workspace can force it every time,
// so the retries are bounded: after this many EAGAINs in a row the call fails with EAGAIN.
inline constexpr int kOpenat2Attempts = 64;

// openat2(dirfd, path, {flags | O_CLOEXEC, 0, resolve}); EINTR retried, EAGAIN retried up to
// kOpenat2Attempts times. Returns the fd, or -1 with errno set. Async-signal-safe.
int openat2_raw(int dirfd, const char* path, std::uint64_t flags, std::uint64_t resolve) noexcept;

// As openat2_raw, owning the fd. Errors carry sys_errno and start with `what` (default
// "open(<path>)"); running out of EAGAIN retries is kAccess, "...: path kept changing while it
// was resolved (gave up after 64 attempts)". An empty path opens "." (dirfd itself, re-opened).
Result<UniqueFd> openat2(int dirfd, const std::string& path, std::uint64_t flags,
                         std::uint64_t resolve, const std::string& what = {});

// A pipe, both ends O_CLOEXEC. With `above_stdio`, both ends are >= 3, so a child's dup2() onto
// 0/1/2 cannot clobber one of them even when the daemon runs with a standard fd closed.
Result<Pipe> pipe(bool above_stdio = false);

struct DirEntry {
  std::string name;
  unsigned char type = 0;  // DT_DIR, DT_REG, DT_LNK, ...; DT_UNKNOWN where the fs does not say
};

// The entries of the directory `dirfd` (an O_PATH fd is fine), without "." and "..", sorted by
// name. Reads through a fresh open of "." so dirfd's own offset is untouched; follows nothing
// (names only; the caller stats with AT_SYMLINK_NOFOLLOW or opens with O_NOFOLLOW). More than
// `max_entries` entries is kTooBig. Errors name `shown`: "readdir(<shown>)".
Result<std::vector<DirEntry>> read_dir(
    int dirfd, const std::string& shown,
    std::size_t max_entries = std::numeric_limits<std::size_t>::max());

// Just the names of read_dir.
Result<std::vector<std::string>> list_names(int dirfd, const std::string& shown);

// Becomes uid/gid with no supplementary groups: setgroups({}), setresgid(gid), setresuid(uid), in
// that order (each step needs the capability the next one may lose), each one checked. Returns
// 0 or the errno of the step that failed. Async-signal-safe.
int switch_identity(uid_t uid, gid_t gid) noexcept;

}  // namespace agentbox::linux::sys
