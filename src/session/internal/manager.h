#pragma once
// What the files of the session manager share (session_manager.h is the interface):
// session_manager.cc   the registry: open/load, create, get/list, destroy/archive/restore, leases;
// session_spec.cc      a spec's checks (skills, host paths under the allowed roots, a re-create);
// session_boxes.cc     a box's start: its binds (mounts, skills, shared dirs) and add_mounts;
// session_lifecycle.cc suspend/resume/keepalive, the reaper and eviction, managed processes' specs;
// session_live.cc      live changes (network, limits, TTL, labels) and the daemon's counters.

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "common/log.h"
#include "common/paths.h"
#include "common/validate.h"
#include "sandbox/default_limits.h"
#include "sandbox/rooted_fs.h"
#include "session/host_workspace.h"
#include "session/session_images.h"
#include "session/session_manager.h"
#include "session/store.h"
#include "session/template_manager.h"

namespace agentbox::session {
namespace manager_detail {

inline constexpr uid_t kFirstUid = 10000;
inline constexpr uid_t kUidRange = 60000;  // uids are allocated in [10000, 70000)
inline constexpr char kSkillsDir[] = "/workspace/.skills/";
inline constexpr char kSharedDir[] = "/shared/";
inline constexpr char kAgentsDir[] = "/workspace/.agents";
inline constexpr char kStateDb[] = "state.db";

inline std::int64_t now_ms() {
  return to_unix_ms(std::chrono::system_clock::now());
}

// Internal life-cycle phase. Only kReady entries are visible to list()/get(); the others are
// owned by the one thread that set them, and everyone else waits on cv_ for them to settle.
enum class Phase { kCreating, kReady, kSuspending, kDestroying };

// SECURITY: with isolation the session's own uid owns its workspace root (and what a restore
// extracts); the host backend runs commands as the daemon's user, which keeps ownership.
inline std::optional<workspace::Owner> owner_of(bool isolated, uid_t uid) {
  if (!isolated) return std::nullopt;
  return workspace::Owner{uid, static_cast<gid_t>(uid)};
}

// A skill name becomes one path component under /workspace/.skills/.
Status check_skill_name(const std::string& name);

// SECURITY: a client may only bind host paths under a configured root. The path is checked
// twice: as written (lexically normalised), before the filesystem is asked anything, so a client
// cannot probe which paths exist elsewhere on the host; and resolved (symlinks included), so a
// link under a root cannot lead out of it. Both on a '/' boundary (/srv/skills2 does not pass
// for /srv/skills). The resolved path is what the backend mounts. A missing path under a root
// is ENOENT (API.md "Sessions": 404 for a missing host dir).
Result<std::string> resolve_host_path(const std::string& host_path, const std::string& field,
                                      const std::vector<std::string>& roots);

// Cheap checks of a client spec (no filesystem access), before any state is touched.
Status validate_spec(const SessionSpec& spec);

// A re-create must not silently drop what it asks for: every field the request sets, except
// labels and ttl_sec (which may change), must equal the session's; else 409 EEXIST naming the
// first field that differs.
Status check_same_spec(const std::string& id, const SessionSpec& have, const SessionSpec& want);

}  // namespace manager_detail

using namespace manager_detail;  // NOLINT: the manager's own internals

struct SessionManager::Entry {
  // Set once under mu_ when the entry is registered; immutable afterwards.
  std::string id;
  std::string tenant;
  SessionSpec spec;
  std::string backend;
  uid_t uid = 0;              // allocated for every session; applied by isolating backends
  std::string workspace_dir;  // host path
  std::chrono::system_clock::time_point created_at;

  // Written without mu_ (a lease ending, a request using a running box), read anywhere.
  std::atomic<std::int64_t> last_used_ms{0};
  std::atomic<int> leases{0};  // acquire() results alive: requests and commands in flight

  // Guarded by mu_.
  Phase phase = Phase::kCreating;
  State state = State::kSuspended;
  std::shared_ptr<sandbox::Sandbox> box;  // set iff state == kRunning
  std::string box_workspace;              // workspace() of the last box; kept while suspended
  std::optional<uid_t> box_uid;
  std::int64_t stored_used_ms = 0;                      // last_used_ms as the database has it
  std::map<std::string, sandbox::ProcessSpec> managed;  // by key; as the database has it
};

// What acquire() hands out, aliased as the Sandbox: while one is alive the session is in use
// (not idle, whatever its last-used time); its end marks the session used then, so a build
// that ran for an hour starts its TTL when it finishes.
struct SessionManager::Lease {
  std::shared_ptr<Entry> entry;
  std::shared_ptr<sandbox::Sandbox> box;
  ~Lease() {
    entry->last_used_ms.store(now_ms());
    entry->leases.fetch_sub(1);
  }
};

struct SessionManager::BoxStart {
  std::shared_ptr<sandbox::Sandbox> box;
  bool created_dir = false;  // the workspace did not exist before
};

}  // namespace agentbox::session
