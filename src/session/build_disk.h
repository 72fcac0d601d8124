#pragma once
// A template build under limits.disk_mb: its workspace (builds/<id>/ws) is a capped disk
// (linux/quota_disk.h, image builds/<id>/ws.img), so a build writing past the cap hits ENOSPC
// and fails. The frozen tree is then copied off the disk (the snapshot lives on the data dir's
// file system, as every snapshot), and the disk is detached.

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/error.h"

namespace agentbox::session {

// Mounts a capped disk of `disk_mb` MiB at `ws` (an existing empty dir), its root owned by
// `owner`.
[[nodiscard]] Status attach_build_disk(const std::string& ws, std::uint64_t disk_mb, uid_t owner);

// Copies the tree at `ws` into `out` (made here, 0700; files owned by `owner`), keeping
// regular files, directories and symlinks with their 0777 mode bits and mtimes.
[[nodiscard]] Status copy_build_tree(const std::string& ws, const std::string& out, uid_t owner);

// Unmounts the disk at `ws` (if any) and deletes its image. Missing pieces are not an error.
[[nodiscard]] Status detach_build_disk(const std::string& ws);

}  // namespace agentbox::session
