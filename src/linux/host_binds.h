#pragma once
// Host dirs bound into boxes (extra mounts, skills, shared dirs): prepared in the daemon,
// attached in the box.
//
// prepare_bind() runs in the daemon: it opens the host dir, makes a detached copy of it
// (open_tree(OPEN_TREE_CLONE), a mount in no namespace yet), sets its flags, and for a
// read-write bind of a dir the session user does not own, idmaps it (linux/idmap.h) so that the
// dir's owner is the session user through this mount only: the agent can write, the host dir
// is not chowned, and new files belong to the dir's owner on the host. Every failure (missing
// dir, a filesystem or kernel that cannot idmap) is an error here, in the daemon, naming the
// bind, before any box is touched.
//
// Attaching is one move_mount of the prepared tree onto a mountpoint resolved inside the box
// without following symlinks (mounts.h, open_in_root_nofollow):
//   - at box start, by the box child, as one step of the mount plan (MountPlan::add_prepared_bind);
//   - into a running box (attach_binds), from a short-lived helper thread of the daemon that
//     unshares its fs attributes (CLONE_FS), joins the box's mount namespace with setns, attaches
//     the trees and exits. The daemon's other threads never enter the box's namespace, nothing
//     runs in the box on the daemon's behalf, and the agent cannot redirect a mountpoint
//     (a planted symlink fails the walk with ELOOP).

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "linux/mounts.h"

namespace agentbox::linux {

struct PreparedBind {
  UniqueFd tree;          // the detached mount; flags (and idmap) already set
  std::string host_path;  // as given (for messages)
  std::string box_path;   // absolute, checked by validate::mount_target
  bool is_dir = true;     // else a single file
  bool read_only = true;
  bool idmapped = false;  // the host owner appears as the session user through it
  std::string what;       // names the bind in messages ("mounts[0]", "skills.web")
};

// Checks `b` (mount target rules, an absolute host path that exists) and prepares its tree for
// a box whose commands run as uid/gid. A read-write bind of a host path not owned by uid/gid is
// idmapped (owner -> uid/gid); one the kernel or the filesystem cannot idmap is kInvalid,
// naming the bind, the filesystem and what would work instead. A missing host path is
// kNotFound. A read-only bind is never idmapped (it is read with the host's permissions).
[[nodiscard]] Result<PreparedBind> prepare_bind(const BoxBind& b, uid_t uid, gid_t gid);

// The workspace itself from a client's host dir (seed 002's host_path over /workspace): as
// prepare_bind with target /workspace (which prepare_bind refuses for any other bind), named
// "host_path" in messages; a host path that is not a directory is kNotDir.
[[nodiscard]] Result<PreparedBind> prepare_workspace_bind(const std::string& host_dir,
                                                          bool read_only, uid_t uid, gid_t gid);

// What attach_binds did: everything (attached) or nothing. Nothing, without an error, when a
// mountpoint cannot be made in the running box (its parent is read-only, e.g. a new top-level
// dir on the box's read-only root): then `not_now` says why, and the mounts can only come at
// the box's next start.
struct AttachOutcome {
  bool attached = false;
  std::string not_now;
};

// Attaches `binds` (parents before children) into the running box whose mount namespace is
// `mntns_fd` (/proc/<init>/ns/mnt) and whose root is `root_fd` (/proc/<init>/root, O_PATH).
// All or nothing: on an error or a "not now", every mount attached so far is detached again and
// every mountpoint made for them removed. Blocking (a helper thread is made and joined).
[[nodiscard]] Result<AttachOutcome> attach_binds(int mntns_fd, int root_fd,
                                                 std::vector<PreparedBind>& binds);

}  // namespace agentbox::linux
