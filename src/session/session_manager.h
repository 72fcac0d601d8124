#pragma once
// Sessions (shared/DESIGN.md, "Sessions"): create-or-get by id, one live Sandbox per running
// session, workspaces under data_dir/workspaces/<id>. Thread-safe: every public method may be
// called from any thread. Nothing here knows about HTTP.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"
#include "sandbox/sandbox.h"

namespace agentbox::session {

struct NetworkSpec {
  std::string mode = "none";  // none | allowlist | open
  std::vector<std::string> allow;
};

struct MountSpec {
  std::string host_path;
  std::string mount_path;
  std::string mode = "rw";  // rw | ro | none
};

// Everything a client may set at creation (API.md "Sessions"); all optional.
struct SessionSpec {
  std::string backend;  // "" = the daemon's default
  std::string template_name;
  std::vector<MountSpec> mounts;
  std::map<std::string, std::string> skills;  // name -> host dir
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> labels;
  sandbox::Limits limits;
  NetworkSpec network;
  std::optional<std::int64_t> ttl_sec;
};

enum class State { kRunning, kSuspended };
std::string_view state_name(State s);

struct SessionInfo {
  std::string id;
  State state = State::kRunning;
  std::string backend;
  std::string workspace;  // as commands see it
  std::chrono::system_clock::time_point created_at;
  std::chrono::system_clock::time_point last_used_at;
  SessionSpec spec;
  std::optional<uid_t> uid;
};

// Session ids: [A-Za-z0-9._-]{1,128}, not "." or "..".
Status validate_id(std::string_view id);
// Renders a scope template: "{name}" -> vars[name], a missing variable -> "unknown"; the result
// must be a valid id (EINVAL naming the template otherwise).
Result<std::string> render_scope(std::string_view tmpl,
                                 const std::map<std::string, std::string>& vars);
// FNV-1a 32-bit of the id, the first uid probe (seed 001): FNV32(id) % 60000 + 10000.
uid_t first_uid_probe(std::string_view id);

struct ManagerConfig {
  std::string data_dir;  // exists; workspaces go under data_dir/workspaces/
  std::string default_backend;
  std::map<std::string, std::shared_ptr<sandbox::Backend>> backends;  // by name
  std::vector<sandbox::BindMount> shared_dirs;  // mounted read-only into every box
};

class SessionManager {
 public:
  static Result<std::unique_ptr<SessionManager>> open(ManagerConfig config);
  ~SessionManager();

  // Returns the session and whether it was created now. An existing id returns it unchanged.
  Result<std::pair<SessionInfo, bool>> create_or_get(const std::string& id,
                                                     const SessionSpec& spec);
  Result<SessionInfo> get(const std::string& id);
  std::vector<SessionInfo> list();  // sorted by id
  // Tears the box down and deletes the workspace.
  Status destroy(const std::string& id);

  // The live sandbox of a session for exec and file work; creates the session with default
  // spec first when create_if_missing (exec routes), else ENOENT. Marks the session used.
  Result<std::shared_ptr<sandbox::Sandbox>> acquire(const std::string& id,
                                                    bool create_if_missing);

  // Counts for /metrics.
  std::map<std::string, std::size_t> count_by_state();

  // Kills every box (daemon shutdown). Workspaces stay.
  void shutdown_all();

  const ManagerConfig& config() const { return config_; }

 private:
  explicit SessionManager(ManagerConfig config);
  struct Entry;
  Result<std::shared_ptr<Entry>> create_locked(const std::string& id, const SessionSpec& spec);
  SessionInfo info_locked(const Entry& e) const;

  ManagerConfig config_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> sessions_;
  std::map<uid_t, std::string> uids_;  // allocated uid -> session id
};

}  // namespace agentbox::session
