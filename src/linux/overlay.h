#pragma once
// Copy-on-write workspaces (API.md "Templates"): an overlayfs whose lower layer is a template's
// read-only snapshot and whose upper and work dirs belong to one session, mounted in the
// daemon's mount namespace at the session's workspace path before its box starts (the box
// binds that path as /workspace like any other workspace).
//
// The lower layer is a detached, read-only clone of the snapshot dir (open_tree), idmapped so
// that the snapshot's owner (the build user) is the session user through it: the agent owns
// what the template put there and copy-up gives it its own files, while the snapshot on disk is
// never written and never chowned. It is handed to the overlay by fd (fsconfig "lowerdir+",
// Linux 6.13+), so no per-session mount of the lower layer exists anywhere.
//
// SECURITY: the snapshot dir is beneath the daemon's 0700 data dir, so no session uid reaches
// it on the host; in a box only the merged view is visible. The overlay is nosuid,nodev, with
// metacopy and redirect_dir off (a session's upper layer cannot point at another file of the
// lower one), and whiteouts a session makes live in its own upper dir only.

#include <sys/types.h>

#include <optional>
#include <string>

#include "common/error.h"
#include "linux/idmap.h"

namespace agentbox::linux {

struct OverlaySpec {
  std::string lower;   // the snapshot dir (absolute)
  std::string upper;   // the session's upper dir (absolute, exists, same fs as work)
  std::string work;    // the session's overlay work dir (absolute, exists, empty)
  std::string target;  // the mountpoint: the session's workspace dir (absolute, exists)
  // Owner of the snapshot on disk -> the session user (nullopt: no idmap, lower as it is).
  std::optional<IdMap> lower_idmap;
};

// Mounts the overlay at spec.target. Errors name the step and the path.
[[nodiscard]] Status mount_overlay(const OverlaySpec& spec);

// Whether an overlayfs is mounted at `path` (statfs magic of the path itself).
bool is_overlay(const std::string& path);

// Detaches the mount at `path` (MNT_DETACH) if it is an overlay; nothing mounted is fine.
[[nodiscard]] Status unmount_overlay(const std::string& path);

}  // namespace agentbox::linux
