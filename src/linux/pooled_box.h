#pragma once
// The box filesystem of a box started ahead for the ns backend's pool (sandbox/internal/
// ns_pool.h), and what binds it to its session later: the parts of mounts.h and host_binds.h
// that only the pool uses.
//
// A pooled box's plan (plan_pooled_box_fs) is plan_box_fs's without the session: /workspace is
// only its mountpoint, there are no binds, and /etc/passwd and /etc/group name a placeholder
// user. Binding it (attach_session, from a helper thread in the box's mount namespace, as
// attach_binds) gives it the session's workspace and binds, /tmp's size and a read-only "/", so
// that it then looks as a box started for the session would.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "linux/host_binds.h"
#include "linux/mounts.h"

namespace agentbox::linux {

// plan_box_fs(spec) for a pooled box: spec.workspace_dir and spec.binds are not used.
[[nodiscard]] Result<MountPlan> plan_pooled_box_fs(const BoxFsSpec& spec);

// The box's /etc/passwd and /etc/group for spec.uid/gid, as plan_box_fs writes them (the
// session user "agent", home /workspace, bash when the host has one).
[[nodiscard]] std::string box_passwd_file(const BoxFsSpec& spec);
[[nodiscard]] std::string box_group_file(const BoxFsSpec& spec);

// What a pooled box gets from its session: the workspace (prepared like the plan's:
// prepare_workspace_bind for a client's host dir, else prepare_box_workspace), the binds,
// /tmp's size (0: keep).
struct SessionMounts {
  PreparedBind workspace;
  std::vector<PreparedBind> binds;
  std::uint64_t tmp_bytes = 0;
};

// The daemon's own workspace dir as the mount plan binds it (recursive, nosuid, nodev, private,
// never idmapped: the daemon made it the session user's).
[[nodiscard]] Result<PreparedBind> prepare_box_workspace(const std::string& dir);

// Attaches `session` into the pooled box whose mount namespace is `mntns_fd` and whose root is
// `root_fd`, then makes "/" read-only (box.cc's step kRootReadOnly, which a pooled box skips:
// BoxSpec::root_read_only). From one helper thread, as attach_binds. Any error leaves the box
// half bound: the caller discards it (no command has run in it).
[[nodiscard]] Status attach_session(int mntns_fd, int root_fd, SessionMounts& session);

}  // namespace agentbox::linux
