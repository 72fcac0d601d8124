#pragma once
// Artifacts: the files a command created or modified under an artifact dir, found by comparing a
// snapshot taken before the command with one taken after. Both walks start from a dir fd and use
// only *at() calls that never follow a symlink, so an agent's symlink cannot make us stat, read
// or type-sniff anything outside the dir. The walks are bounded (files, entries, depth): an agent
// can make the answer incomplete, never slow or huge.
//
// Blocking (plain syscalls); safe to call from any thread.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "sandbox/sandbox.h"

namespace agentbox::sandbox {

struct SnapshotLimits {
  std::size_t max_files = 10000;     // regular files recorded
  std::size_t max_entries = 100000;  // directory entries looked at, of any type
  int max_depth = 32;                // directory levels below the root
};

// What identifies a version of a file: a change in any field means "modified".
struct FileStamp {
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  dev_t dev = 0;  // with ino: a file replaced by rename is a new file even with equal size/mtime
  ino_t ino = 0;
  bool operator==(const FileStamp&) const = default;
};

struct TreeSnapshot {
  std::map<std::string, FileStamp> files;  // path relative to the root ("a/b.txt") -> stamp
  bool complete = true;                    // false when a limit cut the walk short
};

// Regular files under the directory `dir_fd` (any fd of it, O_PATH is enough; borrowed).
// Symlinks are neither followed nor recorded; unreadable subdirectories are skipped.
[[nodiscard]] Result<TreeSnapshot> snapshot_tree(int dir_fd, const SnapshotLimits& limits = {});

// Files in `after` that are not in `before` or whose stamp changed, as Artifacts with path
// `artifact_dir + "/" + rel`, the size and libmagic's MIME type of the file as it is now (opened
// from `dir_fd` without following any symlink; files gone or no longer regular are left out).
// Sorted by path.
std::vector<Artifact> diff_artifacts(const TreeSnapshot& before, const TreeSnapshot& after,
                                     int dir_fd, std::string_view artifact_dir);

// libmagic's MIME type ("image/png", "text/plain", ...) of the open file `fd`, read from its
// current offset; "application/octet-stream" when libmagic cannot tell or is unavailable.
std::string detect_mime_type(int fd);

}  // namespace agentbox::sandbox
