#pragma once
// Snapshot trees: a directory's content hash (its snapshot id), size and file count, and the
// checks that make a build's result fit to be a read-only overlay lower layer.

#include <cstdint>
#include <string>

#include "common/error.h"

namespace agentbox::workspace {

struct TreeStats {
  std::string hash;         // SHA-256 (hex) over paths, types, modes, owners, targets, contents
  std::uint64_t bytes = 0;  // of regular files
  std::uint64_t files = 0;  // entries of any type, directories included (not the root)
};

// Walks the tree under `dirfd` without following a symlink (every open is O_NOFOLLOW beneath its
// parent's fd), in name order. SECURITY: a device node, fifo or socket is kInvalid naming its
// path: a lower layer holding a 0/0 character device would be an overlay whiteout, and nothing
// a build should leave behind needs one. Symlinks are kept as they are (they resolve inside the
// session's box, never on the host).
[[nodiscard]] Result<TreeStats> hash_tree(int dirfd);

// What a live tree takes on disk, as `du` counts it: the blocks allocated to every entry under
// `dirfd` (the root excluded; a file with several hard links counted once), and how many
// entries there are. Never follows a symlink nor leaves the root's filesystem (a mount inside
// the tree is not walked). Entries that vanish during the walk (the tree is in use) are skipped.
struct TreeSize {
  std::uint64_t bytes = 0;
  std::uint64_t entries = 0;
};
[[nodiscard]] Result<TreeSize> tree_size(int dirfd);

}  // namespace agentbox::workspace
