#pragma once
// Seed 002's primary mount over /workspace (API.md "Live changes to a session"): a session whose
// workspace is a host dir of the client's. The box sees the host dir at /workspace (ns: bound
// there, idmapped for rw so the agent writes as the session user and new files are the dir
// owner's; read-only for ro; host backend: commands run in the dir itself). agentboxd never
// creates, chowns, caps, archives or deletes it: that is the client's dir.

#include <string>

#include "common/error.h"
#include "session/session_manager.h"

namespace agentbox::session {

inline constexpr char kHostWorkspacePath[] = "/workspace";

// Sets the session's primary mount as the client gave it (seed 002's host_path, mount_path,
// host_path_mode): a mount_path of /workspace (trailing slashes dropped) makes the host dir the
// workspace; elsewhere it is also one more of spec->mounts; mode none mounts nothing.
void set_primary_mount(SessionSpec* spec, MountSpec primary);

// Whether the session's workspace is its primary host_path (mount_path /workspace, mode rw|ro).
bool workspace_on_host(const SessionSpec& spec);

// What cannot go with a host-dir workspace, each EINVAL naming the field: limits.disk_mb (a quota
// disk caps a dir of the daemon's own, not a host dir) and a template (its workspace is the
// daemon's overlay over a snapshot). No-op for a session without one.
Status check_host_workspace(const SessionSpec& spec);

// ENOTSUP naming host_path when the session's box runs on backend `backend` and that backend's
// commands cannot see this host's dirs ("remote": the runner has its own workspace).
Status check_host_workspace_backend(const SessionSpec& spec, const std::string& backend);

// Why a session with a host-dir workspace cannot be archived (EEXIST: the request conflicts with
// what the session is): the archive would hold the client's own dir, and a delete after it would
// be expected to remove it.
Error host_workspace_archive_refused(const std::string& id, const SessionSpec& spec);

}  // namespace agentbox::session
