// SessionManager::usage (API.md "Usage"): a running box's cgroup figures and the workspace's
// size, read without resuming the session or counting as a use of it.
#include <fcntl.h>

#include "session/host_workspace.h"
#include "session/internal/manager.h"
#include "workspace/tree.h"

namespace agentbox::session {

Result<SessionManager::Usage> SessionManager::usage(const std::string& id, const Caller& caller) {
  if (auto st = validate_id(id); !st) return std::unexpected(st.error());
  Usage out;
  std::shared_ptr<sandbox::Sandbox> box;
  bool on_host = false;
  {
    std::unique_lock lk(mu_);
    auto e = find_settled_locked(lk, id);
    // SECURITY: another tenant's session is indistinguishable from a missing one.
    if (!e || !visible(*e, caller)) return fail(Code::kNotFound, "no such session: " + id);
    auto be = config_.backends.find(e->backend);
    if (be == config_.backends.end() || !be->second->measures_usage()) {
      return fail(Code::kNotSupported, "usage on the " + e->backend +
                                           " backend (it keeps no cgroup per session to read)");
    }
    out.info = info_locked(*e);
    if (e->state == State::kRunning) box = e->box;  // no lease: reading it is not a use
    on_host = workspace_on_host(e->spec);
  }
  if (box) {
    auto u = box->usage();
    if (u) {
      out.box = *u;
    } else if (u.error().code == Code::kUnavailable) {
      out.info.state = State::kSuspended;  // it went down while we asked: it uses nothing now
    } else {
      return std::unexpected(u.error());
    }
  }
  if (!on_host) {
    // Missing (a session mid-restore, or one whose box never started): nothing on disk yet.
    if (auto dir = workspaces_.open_dir(id)) {
      auto size = workspace::tree_size(dir->get());
      if (!size) {
        Error e = size.error();
        e.message = "session " + id + ": workspace size: " + e.message;
        return std::unexpected(std::move(e));
      }
      out.workspace_bytes = size->bytes;
    } else if (dir.error().code == Code::kNotFound) {
      out.workspace_bytes = 0;
    } else {
      return std::unexpected(dir.error());
    }
  }
  return out;
}

}  // namespace agentbox::session
