#pragma once
// Private to linux/: file helpers shared by the cgroup v1 and v2 drivers.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "linux/cgroup.h"

namespace agentbox::linux::detail {

// The real kernel's mkdir/rmdir (the default CgroupFs).
std::shared_ptr<CgroupFs> real_cgroup_fs();

// One write() of the whole value (cgroupfs parses each write as one request), O_TRUNC so a fake
// layout of plain files ends up holding exactly the value.
[[nodiscard]] Status write_file(const std::string& path, std::string_view value);
[[nodiscard]] Result<std::string> read_file(const std::string& path);
// Writes pid into a cgroup.procs file; a pid that does not exist (ESRCH) is kNotFound.
[[nodiscard]] Status move_process(const std::string& procs, pid_t pid);
// A decimal number, optionally followed by whitespace ("max" is not a number).
[[nodiscard]] Result<std::uint64_t> read_u64(const std::string& path);
bool exists(const std::string& path);
// The value of `key` in a flat keyed file ("key value" lines: memory.events, pids.events,
// memory.oom_control). kNotFound when the file or the key is missing.
[[nodiscard]] Result<std::uint64_t> read_keyed_u64(const std::string& path, std::string_view key);

// Pids listed in <dir>/cgroup.procs and in every descendant's, appended to out.
[[nodiscard]] Status collect_pids(const std::string& dir, std::vector<pid_t>& out);
// Names of the immediate subdirectories (child cgroups) of dir; empty if dir is gone.
[[nodiscard]] Result<std::vector<std::string>> subdirs(const std::string& dir);

// mkdir through fs; EEXIST is not an error when ok_if_exists.
[[nodiscard]] Status make_dir(CgroupFs& fs, const std::string& path, bool ok_if_exists);
// Removes dir and every cgroup below it, deepest first, through fs. The caller has emptied them;
// EBUSY (a just-killed task still exiting) is retried until deadline. A missing dir is success.
[[nodiscard]] Status remove_tree(CgroupFs& fs, const std::string& dir,
                                 std::chrono::steady_clock::time_point deadline);

// SIGKILLs each pid that is still listed in one of procs_files after it has been pinned with a
// pidfd, so a pid number reaped and reused by an unrelated process between the listing and the
// kill is never signalled.
void kill_listed(const std::vector<pid_t>& pids, const std::vector<std::string>& dirs);

// word appears in text delimited by spaces/newlines (cgroup.controllers, subtree_control).
bool contains_word(std::string_view text, std::string_view word);

// Sorts and removes duplicates.
void sort_unique(std::vector<pid_t>& pids);

// [A-Za-z0-9._-]{1,max_len}, not "." or "..".
bool valid_name(std::string_view name, std::size_t max_len);
// A relative path of valid names separated by '/'.
bool valid_parent(std::string_view parent);

std::string join(const std::string& dir, std::string_view name);

// How long kill_all() keeps trying before reporting kTimedOut.
inline constexpr std::chrono::milliseconds kKillTimeout{2000};

}  // namespace agentbox::linux::detail
