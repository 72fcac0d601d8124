#pragma once
// A size-capped workspace (API.md limits.disk_mb; SECURITY.md T4 "fill /workspace → ENOSPC at
// the workspace quota"): the workspace directory becomes the mount point of an ext4 file system
// in a sparse image file of exactly that size, attached through a loop device.
//
// Why an image and not quotas: the data dir's file system may have no quota support (ext4
// without the quota feature, overlayfs, tmpfs), and project quotas cannot be switched on from
// here. An image caps bytes and inodes on any host file system, costs disk only for what is
// written (sparse), and a full image never touches the host's free space or other sessions.
//
// The mount lives in the daemon's (host) mount namespace, so every host-side view of the
// workspace (file API while suspended, archives) sees its files, and boxes bind it like a plain
// directory. It survives a daemon restart: attach() finds it mounted and reuses it. The loop
// device is configured with LO_FLAGS_AUTOCLEAR, so detaching the mount frees it.

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/error.h"

namespace agentbox::linux {

struct QuotaDiskSpec {
  std::string image_path;  // created (sparse) and formatted when missing
  std::string mountpoint;  // an existing, empty directory (the workspace)
  std::uint64_t bytes = 0;
  uid_t uid = 0;  // owner of the file system's root directory
  gid_t gid = 0;
};

// Makes `mountpoint` the root of the capped file system. Idempotent: an already mounted
// workspace is left as it is. A first attach formats the image (mkfs.ext4, ~tens of ms).
// Errors name the step (create image, mkfs, loop device, mount).
[[nodiscard]] Status attach_quota_disk(const QuotaDiskSpec& spec);

// Unmounts `mountpoint` if something is mounted there (lazily: a process still using it keeps
// it until it lets go), then removes the image. Missing pieces are not an error.
[[nodiscard]] Status detach_quota_disk(const std::string& mountpoint, const std::string& image_path);

// Unmounts `mountpoint` if something is mounted there (lazily, as above), keeping the image:
// the loop device (LO_FLAGS_AUTOCLEAR) goes with the mount. A clean daemon exit.
[[nodiscard]] Status unmount_quota_disk(const std::string& mountpoint);

// Whether `path` is the root of a mount (statx STATX_ATTR_MOUNT_ROOT).
[[nodiscard]] Result<bool> is_mount_root(const std::string& path);

}  // namespace agentbox::linux
