#include "session/host_workspace.h"

namespace agentbox::session {

void set_primary_mount(SessionSpec* spec, MountSpec primary) {
  std::string_view target = primary.mount_path;
  while (target.size() > 1 && target.back() == '/') target.remove_suffix(1);
  const bool over_workspace = target == kHostWorkspacePath;
  if (over_workspace) primary.mount_path = kHostWorkspacePath;
  spec->primary = primary;
  if (primary.mode == "none" || over_workspace) return;
  spec->mounts.push_back(std::move(primary));
}

bool workspace_on_host(const SessionSpec& spec) {
  const MountSpec& p = spec.primary;
  return !p.host_path.empty() && p.mode != "none" && p.mount_path == kHostWorkspacePath;
}

Status check_host_workspace(const SessionSpec& spec) {
  if (!workspace_on_host(spec)) return {};
  if (spec.limits.disk_mb) {
    return fail(Code::kInvalid,
                "limits.disk_mb: cannot apply to a host_path workspace (" + spec.primary.host_path +
                    " is the client's dir, not one agentboxd can cap); leave disk_mb out, or "
                    "mount the dir elsewhere with mount_path");
  }
  if (!spec.template_name.empty()) {
    return fail(Code::kInvalid,
                "template: a templated session's workspace is agentboxd's copy of the template; "
                "it cannot also be the host_path " +
                    spec.primary.host_path + " (mount the dir elsewhere with mount_path)");
  }
  return {};
}

Status check_host_workspace_backend(const SessionSpec& spec, const std::string& backend) {
  if (!workspace_on_host(spec) || backend != "remote") return {};
  return fail(Code::kNotSupported,
              "host_path as the workspace of a remote session (the runner has its own "
              "workspace; this host's " +
                  spec.primary.host_path + " is not on it)");
}

Error host_workspace_archive_refused(const std::string& id, const SessionSpec& spec) {
  return Error{Code::kExists, 0,
               "session " + id + ": its workspace is the host dir " + spec.primary.host_path +
                   " (host_path), which agentboxd never archives or deletes; delete the session "
                   "without archive=true (the dir stays)"};
}

}  // namespace agentbox::session
