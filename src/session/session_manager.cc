#include "session/session_manager.h"

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

#include "common/paths.h"
#include "common/log.h"
#include "common/validate.h"
#include "sandbox/default_limits.h"
#include "sandbox/rooted_fs.h"
#include "session/host_workspace.h"
#include "session/session_images.h"
#include "session/store.h"
#include "session/template_manager.h"

namespace agentbox::session {
namespace {

constexpr uid_t kFirstUid = 10000;
constexpr uid_t kUidRange = 60000;  // uids are allocated in [10000, 70000)
constexpr char kSkillsDir[] = "/workspace/.skills/";
constexpr char kSharedDir[] = "/shared/";
constexpr char kAgentsDir[] = "/workspace/.agents";
constexpr char kStateDb[] = "state.db";

std::int64_t now_ms() {
  return to_unix_ms(std::chrono::system_clock::now());
}

// Internal life-cycle phase. Only kReady entries are visible to list()/get(); the others are
// owned by the one thread that set them, and everyone else waits on cv_ for them to settle.
enum class Phase { kCreating, kReady, kSuspending, kDestroying };

// An in-box path a mount may target: absolute, no NUL, no "." or ".." components.
// A skill name becomes one path component under /workspace/.skills/.
Status check_skill_name(const std::string& name) {
  if (auto st = validate_id(name); !st) {
    return fail(Code::kInvalid,
                "skills: invalid skill name (same rules as a session id): " + st.error().message);
  }
  return {};
}


// SECURITY: a client may only bind host paths under a configured root. The path is checked
// twice: as written (lexically normalised), before the filesystem is asked anything, so a client
// cannot probe which paths exist elsewhere on the host; and resolved (symlinks included), so a
// link under a root cannot lead out of it. Both on a '/' boundary (/srv/skills2 does not pass
// for /srv/skills). The resolved path is what the backend mounts. A missing path under a root
// is ENOENT (API.md "Sessions": 404 for a missing host dir).
Result<std::string> resolve_host_path(const std::string& host_path, const std::string& field,
                                      const std::vector<std::string>& roots) {
  if (host_path.empty() || host_path[0] != '/') {
    return fail(Code::kInvalid, field + ": host path must be absolute");
  }
  if (host_path.find('\0') != std::string::npos) {
    return fail(Code::kInvalid, field + ": host path contains NUL");
  }
  // As written, normalised lexically ("//", "." and ".." folded).
  std::string lexical = std::filesystem::path(host_path).lexically_normal().string();
  while (lexical.size() > 1 && lexical.back() == '/') lexical.pop_back();
  auto allowed = [&roots](const std::string& path, bool resolve_roots) {
    for (const std::string& root : roots) {
      if (!resolve_roots && paths::at_or_under(path, root)) return true;
      char rbuf[PATH_MAX];
      if (::realpath(root.c_str(), rbuf) == nullptr) continue;  // a missing root allows nothing
      if (paths::at_or_under(path, rbuf)) return true;
    }
    return false;
  };
  auto denied = [&] {
    return fail(Code::kAccess,
                field + ": mount of " + host_path + " denied: not under an allowed mount root");
  };
  if (!allowed(lexical, false) && !allowed(lexical, true)) return denied();
  char buf[PATH_MAX];
  if (::realpath(host_path.c_str(), buf) == nullptr) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return std::unexpected(
          Error{Code::kNotFound, err, field + ": no such host dir: " + host_path});
    }
    // A bad field of the request (400), not a missing file of the session.
    Error e = Error::from_errno(err, field + ": realpath(" + host_path + ")");
    e.code = Code::kInvalid;
    return std::unexpected(std::move(e));
  }
  std::string resolved(buf);
  if (!allowed(resolved, true)) return denied();
  return resolved;
}

// Cheap checks of a client spec (no filesystem access), before any state is touched.
Status validate_spec(const SessionSpec& spec) {
  for (std::size_t i = 0; i < spec.mounts.size(); ++i) {
    const MountSpec& m = spec.mounts[i];
    std::string field = "mounts[" + std::to_string(i) + "]";
    if (m.mode != "rw" && m.mode != "ro" && m.mode != "none") {
      return fail(Code::kInvalid, field + ".mode: must be rw, ro or none, not \"" + m.mode + "\"");
    }
    if (auto st = validate::mount_target(m.mount_path, field + ".mount_path"); !st) return st;
  }
  for (const auto& [name, dir] : spec.skills) {
    if (auto st = check_skill_name(name); !st) return st;
  }
  for (const std::string& name : spec.read_only_skills) {
    if (spec.skills.count(name) == 0) {
      return fail(Code::kInvalid, "skill_mode: names no skill \"" + name + "\"");
    }
  }
  const std::string& mode = spec.network.mode;
  if (mode != "none" && mode != "allowlist" && mode != "open") {
    return fail(Code::kInvalid,
                "network.mode: must be none, allowlist or open, not \"" + mode + "\"");
  }
  if (mode == "allowlist") {
    if (auto p = net::Policy::parse(spec.network.allow); !p) {
      return fail(Code::kInvalid, "network.allow: " + p.error().message);
    }
  } else if (!spec.network.allow.empty()) {
    return fail(Code::kInvalid, "network.allow: needs network.mode \"allowlist\"");
  }
  if (auto st = validate::env(spec.env, "env"); !st) return st;
  if (spec.ttl_sec && *spec.ttl_sec < 0) return fail(Code::kInvalid, "ttl_sec: must be >= 0");
  const std::string& pm = spec.primary.mode;
  if (!spec.primary.host_path.empty() && pm != "rw" && pm != "ro" && pm != "none") {
    return fail(Code::kInvalid, "host_path_mode: must be rw, ro or none, not \"" + pm + "\"");
  }
  if (auto st = check_host_workspace(spec); !st) return st;
  return {};
}

// A re-create must not silently drop what it asks for: every field the request sets, except
// labels and ttl_sec (which may change), must equal the session's; else 409 EEXIST naming the
// first field that differs.
Status check_same_spec(const std::string& id, const SessionSpec& have, const SessionSpec& want) {
  auto differs = [&](const std::string& field) -> Status {
    return fail(Code::kExists, "session " + id + " already exists with a different " + field +
                                   "; leave " + field + " out, or delete the session first");
  };
  if (!want.backend.empty() && want.backend != have.backend) return differs("backend");
  if (!want.template_name.empty() && want.template_name != have.template_name) {
    return differs("template");
  }
  // Mounts and skills: each one asked for must be the session's (it may have more, added
  // through POST .../mounts since, so that a client re-creating with its first list still gets
  // the session).
  for (const MountSpec& w : want.mounts) {
    bool found = false;
    for (const MountSpec& h : have.mounts) {
      found = found || (w.host_path == h.host_path && w.mount_path == h.mount_path &&
                        w.mode == h.mode);
    }
    if (!found) return differs("mounts");
  }
  if (!want.primary.host_path.empty() && (want.primary.host_path != have.primary.host_path ||
                                          want.primary.mount_path != have.primary.mount_path ||
                                          want.primary.mode != have.primary.mode)) {
    return differs("host_path");
  }
  for (const auto& [name, dir] : want.skills) {
    auto it = have.skills.find(name);
    if (it == have.skills.end() || it->second != dir ||
        want.read_only_skills.count(name) != have.read_only_skills.count(name)) {
      return differs("skills");
    }
  }
  if (!want.env.empty() && want.env != have.env) return differs("env");
  const sandbox::Limits& wl = want.limits;
  const sandbox::Limits& hl = have.limits;
  if (wl.memory_mb && wl.memory_mb != hl.memory_mb) return differs("limits.memory_mb");
  if (wl.cpu_percent && wl.cpu_percent != hl.cpu_percent) return differs("limits.cpu_percent");
  if (wl.max_pids && wl.max_pids != hl.max_pids) return differs("limits.max_pids");
  if (wl.disk_mb && wl.disk_mb != hl.disk_mb) return differs("limits.disk_mb");
  if (wl.max_open_files && wl.max_open_files != hl.max_open_files) {
    return differs("limits.max_open_files");
  }
  if (wl.cpu_time_sec && wl.cpu_time_sec != hl.cpu_time_sec) return differs("limits.cpu_time_sec");
  if (wl.tmp_mb && wl.tmp_mb != hl.tmp_mb) return differs("limits.tmp_mb");
  const bool network_given = want.network.mode != "none" || !want.network.allow.empty();
  if (network_given &&
      (want.network.mode != have.network.mode || want.network.allow != have.network.allow)) {
    return differs("network");
  }
  return {};
}

}  // namespace

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
  std::int64_t stored_used_ms = 0;  // last_used_ms as the database has it
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

namespace {
// SECURITY: with isolation the session's own uid owns its workspace root (and what a restore
// extracts); the host backend runs commands as the daemon's user, which keeps ownership.
std::optional<workspace::Owner> owner_of(bool isolated, uid_t uid) {
  if (!isolated) return std::nullopt;
  return workspace::Owner{uid, static_cast<gid_t>(uid)};
}
}  // namespace

struct SessionManager::BoxStart {
  std::shared_ptr<sandbox::Sandbox> box;
  bool created_dir = false;  // the workspace did not exist before
};

SessionManager::SessionManager(ManagerConfig config, workspace::Workspaces workspaces)
    : config_(std::move(config)), workspaces_(std::move(workspaces)) {}

SessionManager::~SessionManager() {
  {
    std::lock_guard lk(reaper_mu_);
    stop_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  if (config_.templates) config_.templates->set_in_use(nullptr);
  shutdown_all();
  flush_used();
}

Result<std::unique_ptr<SessionManager>> SessionManager::open(ManagerConfig config) {
  if (config.data_dir.empty()) return fail(Code::kInvalid, "session manager: data_dir not set");
  std::error_code ec;
  std::filesystem::path data = std::filesystem::absolute(config.data_dir, ec);
  if (ec) return fail_errno(ec.value(), "absolute(" + config.data_dir + ")");
  config.data_dir = data.lexically_normal().string();
  if (config.data_dir.size() > 1 && config.data_dir.back() == '/') config.data_dir.pop_back();

  if (config.backends.find(config.default_backend) == config.backends.end()) {
    return fail(Code::kInvalid, "default backend \"" + config.default_backend +
                                    "\" is not one of the configured backends");
  }
  for (const auto& [name, b] : config.backends) {
    if (!b) return fail(Code::kInvalid, "backend \"" + name + "\" is null");
  }

  auto ws = workspace::Workspaces::open(config.data_dir, config.workspaces_dir);
  if (!ws) return std::unexpected(ws.error());
  std::unique_ptr<SessionManager> sm(new SessionManager(std::move(config), std::move(*ws)));
  sm->started_at_ = std::chrono::system_clock::now();
  if (sm->config_.persist) {
    auto store = Store::open(sm->config_.data_dir + "/" + kStateDb);
    if (!store) return std::unexpected(store.error());
    sm->store_ = std::move(*store);
    std::lock_guard lk(sm->mu_);
    if (auto st = sm->load_locked(); !st) return std::unexpected(st.error());
  }
  if (sm->config_.templates) {
    // What sessions use is never garbage-collected (nor its template deleted).
    sm->config_.templates->set_in_use([raw = sm.get()] {
      std::set<std::string> out;
      std::lock_guard lk(raw->mu_);
      for (const auto& [id, e] : raw->sessions_) {
        if (!e->spec.snapshot.empty()) out.insert(e->spec.snapshot);
      }
      return out;
    });
  }
  sm->reaper_ = std::thread([raw = sm.get()] { raw->reaper_loop(); });
  return sm;
}

Status SessionManager::load_locked() {
  auto rows = store_->load();
  if (!rows) return std::unexpected(rows.error());
  std::size_t was_running = 0;
  for (StoredSession& r : *rows) {
    SessionInfo& i = r.info;
    if (!validate_id(i.id) || uids_.count(r.uid) != 0) {
      spdlog::error("state: skipping session row {} (bad id or uid {} taken)", i.id, r.uid);
      continue;
    }
    auto e = std::make_shared<Entry>();
    e->id = i.id;
    e->tenant = i.tenant;
    e->spec = std::move(i.spec);
    if (auto be = config_.backends.find(i.backend);
        be == config_.backends.end() || be->second->takes_default_limits()) {
      sandbox::fill_unset_limits(&e->spec.limits, config_.default_limits);
    }
    e->backend = i.backend;
    e->uid = r.uid;
    e->workspace_dir = workspaces_.path(i.id);
    e->created_at = i.created_at;
    e->last_used_ms.store(to_unix_ms(i.last_used_at));
    e->stored_used_ms = e->last_used_ms.load();
    // Whatever it was, its box died with the daemon that ran it: it comes back suspended and
    // resumes on first use.
    e->state = State::kSuspended;
    e->phase = Phase::kReady;
    e->box_workspace = i.workspace;
    e->box_uid = i.uid;
    for (sandbox::ProcessSpec& p : r.managed) e->managed[p.key] = std::move(p);
    if (i.state == State::kRunning) ++was_running;
    if (config_.backends.find(e->backend) == config_.backends.end()) {
      spdlog::warn(
          "session {}: its backend \"{}\" is not configured on this daemon; it stays "
          "suspended until it is",
          e->id, e->backend);
    }
    if (!workspace_on_host(e->spec) && !workspaces_.exists(e->id)) {
      spdlog::warn("session {}: workspace {} is missing; it will start empty", e->id,
                   e->workspace_dir);
    }
    uids_.emplace(e->uid, e->id);
    sessions_.emplace(e->id, std::move(e));
  }
  spdlog::info("state: {} sessions loaded from {} ({} were running; all are suspended now)",
               sessions_.size(), store_->path(), was_running);
  // A workspace without a row (a crash between mkdir and the first commit, an older daemon):
  // reported, never deleted; creating that id again adopts it.
  for (const std::string& name : workspaces_.names()) {
    if (sessions_.find(name) == sessions_.end()) {
      spdlog::warn("state: workspace {} belongs to no session; left in place",
                   workspaces_.path(name));
    }
  }
  return {};
}

void SessionManager::sweep_temp_files() {
  std::vector<std::string> ids;
  {
    std::lock_guard lk(mu_);
    for (const auto& [id, e] : sessions_) ids.push_back(id);
  }
  std::size_t removed = 0;
  for (const std::string& id : ids) {
    if (auto ws = workspaces_.open_dir(id)) {
      removed += sandbox::remove_stale_temp_files(ws->get(), started_at_);
    }
  }
  if (removed) spdlog::info("state: removed {} temp files of interrupted writes", removed);
}

SessionInfo SessionManager::info_locked(const Entry& e) const {
  SessionInfo info;
  info.id = e.id;
  info.state = e.state;
  info.backend = e.backend;
  info.workspace = e.box_workspace;
  info.created_at = e.created_at;
  info.last_used_at = from_unix_ms(e.last_used_ms.load());
  info.spec = e.spec;
  info.uid = e.box_uid;
  info.tenant = e.tenant;
  return info;
}

Status SessionManager::record_locked(Entry& e) {
  if (!store_) return {};
  const StoredSession row{info_locked(e), e.uid};
  auto st = store_->put(row);
  if (!st) {
    spdlog::error("session {}: saving its state failed: {}", e.id, st.error().message);
    return st;
  }
  e.stored_used_ms = to_unix_ms(row.info.last_used_at);
  return {};
}

Status SessionManager::forget_locked(const Entry& e) {
  if (!store_) return {};
  auto st = store_->erase(e.id);
  if (!st) spdlog::error("session {}: deleting its state failed: {}", e.id, st.error().message);
  return st;
}

void SessionManager::publish_locked(std::unique_lock<std::mutex>& lk, const Entry& e,
                                    EventKind kind, EventCause cause, std::string_view actor,
                                    std::string_view detail) {
  const SessionInfo info = info_locked(e);
  // Copies: the strings may live in the entry, which others may change once mu_ is released.
  const std::string who(actor), what(detail);
  lk.unlock();
  publish(SessionEvent{kind, cause, info, who, what});
  lk.lock();
}

std::string_view event_kind_name(EventKind k) {
  switch (k) {
    case EventKind::kCreated: return "created";
    case EventKind::kResumed: return "resumed";
    case EventKind::kSuspended: return "suspended";
    case EventKind::kDestroyed: return "destroyed";
    case EventKind::kUpdated: return "updated";
  }
  return "unknown";
}

std::string_view event_cause_name(EventCause c) {
  switch (c) {
    case EventCause::kApi: return "api";
    case EventCause::kReaper: return "reaper";
    case EventCause::kEviction: return "eviction";
    case EventCause::kRestore: return "restore";
    case EventCause::kStartup: return "startup";
  }
  return "unknown";
}

std::shared_ptr<void> SessionManager::subscribe(EventSubscriber fn) {
  auto holder = std::make_shared<EventSubscriber>(std::move(fn));
  std::lock_guard lk(subs_mu_);
  std::erase_if(subs_, [](const auto& w) { return w.expired(); });
  subs_.push_back(holder);
  return holder;
}

void SessionManager::publish(const SessionEvent& ev) const {
  std::vector<std::shared_ptr<EventSubscriber>> live;
  {
    std::lock_guard lk(subs_mu_);
    for (const auto& w : subs_) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (const auto& s : live) (*s)(ev);
}

std::shared_ptr<SessionManager::Entry> SessionManager::find_settled_locked(
    std::unique_lock<std::mutex>& lk, const std::string& id) {
  for (;;) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return nullptr;
    if (it->second->phase == Phase::kReady) return it->second;
    cv_.wait(lk);
  }
}

uid_t SessionManager::allocate_uid_locked(const std::string& id) {
  // Seed 001: a workspace dir that exists already (the toolbox-server made it under --workdir)
  // belongs to the uid its formula and collision order gave the agent; adopting that uid, when
  // it is in the range and free, keeps the agent's old files writable by it. lstat: a link
  // there is not a workspace.
  struct stat st;
  const std::string dir = workspaces_.path(id);
  if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid >= kFirstUid &&
      st.st_uid < kFirstUid + kUidRange && uids_.emplace(st.st_uid, id).second) {
    spdlog::info("session {}: adopting uid {}, the owner of its existing workspace {}", id,
                 st.st_uid, dir);
    return st.st_uid;
  }
  // Seed 001: FNV32(id) % 60000 + 10000, and on a collision the next free uid, wrapping within
  // the range. The caller has checked that a uid is free.
  uid_t first = first_uid_probe(id) - kFirstUid;
  for (uid_t i = 0; i < kUidRange; ++i) {
    uid_t uid = kFirstUid + (first + i) % kUidRange;
    if (uids_.emplace(uid, id).second) return uid;
  }
  AB_CHECK(false && "uid range exhausted");
  return 0;
}

bool SessionManager::visible(const Entry& e, const Caller& caller) {
  return caller.admin || e.tenant == caller.tenant;
}

std::size_t SessionManager::running_locked() const {
  std::size_t n = 0;
  for (const auto& [id, e] : sessions_) {
    if (e->phase == Phase::kCreating || e->phase == Phase::kSuspending ||
        (e->phase == Phase::kReady && e->state == State::kRunning)) {
      ++n;
    }
  }
  return n;
}

Status SessionManager::check_running_quota_locked(const std::string& id) const {
  if (config_.max_running_boxes == 0) return {};
  if (running_locked() >= config_.max_running_boxes) {
    return fail(Code::kQuota, "session " + id + ": max_running_boxes limit of " +
                                  std::to_string(config_.max_running_boxes) +
                                  " running boxes reached; destroy a session and retry");
  }
  return {};
}

Result<std::shared_ptr<SessionManager::Entry>> SessionManager::create_locked(
    const std::string& id, const SessionSpec& spec, const Caller& caller) {
  std::string backend = spec.backend.empty() ? config_.default_backend : spec.backend;
  const bool to_default_runner = spec.backend.empty() && !config_.default_runner.empty();
  if (to_default_runner) backend = "remote";
  if (config_.backends.find(backend) == config_.backends.end()) {
    return fail(Code::kInvalid, "backend: unknown backend \"" + backend + "\"");
  }
  // The runner's machine has no daemon host paths (as json_codec refuses for backend "remote").
  if (to_default_runner && (!spec.mounts.empty() || !spec.skills.empty())) {
    return fail(Code::kNotSupported,
                std::string(spec.mounts.empty() ? "skills" : "mounts") +
                    " on a remote runner (the daemon's --default-runner serves this session)");
  }
  if (auto st = check_host_workspace_backend(spec, backend); !st) {
    return std::unexpected(st.error());
  }
  if (closed_) return fail(Code::kUnavailable, "session " + id + ": daemon is shutting down");
  if (uids_.size() >= kUidRange) {
    return fail(Code::kQuota, "session " + id + ": no free session uid left");
  }
  if (caller.max_sessions != 0) {
    std::size_t mine = 0;
    for (const auto& [other, oe] : sessions_) mine += oe->tenant == caller.tenant ? 1 : 0;
    if (mine >= caller.max_sessions) {
      return fail(Code::kQuota, "session " + id + ": tenant " + caller.tenant +
                                    " has reached its max_sessions limit of " +
                                    std::to_string(caller.max_sessions) + " sessions");
    }
  }
  if (auto st = check_running_quota_locked(id); !st) return std::unexpected(st.error());
  // What the backend cannot give this box (a remote runner: a network, a limit it does not
  // enforce) is refused now, naming the field, rather than ignored.
  const std::shared_ptr<sandbox::Backend>& be = config_.backends.at(backend);
  sandbox::SpecRequest asked{spec.network.mode, spec.limits,
                             to_default_runner ? config_.default_runner : spec.runner,
                             caller.tenant};
  if (auto st = be->check_spec(asked); !st) return std::unexpected(st.error());
  if (auto st = check_image_spec(spec, *be, backend); !st) return std::unexpected(st.error());
  sandbox::Limits limits = spec.limits;
  if (be->takes_default_limits()) sandbox::fill_unset_limits(&limits, config_.default_limits);
  // A default disk cap does not apply to a host dir (an explicit one was refused already).
  if (workspace_on_host(spec)) limits.disk_mb.reset();
  if (auto st = sandbox::check_limits_together(limits, "limits"); !st) {
    return std::unexpected(st.error());
  }
  auto e = std::make_shared<Entry>();
  e->id = id;
  e->tenant = caller.tenant;
  e->spec = spec;
  e->spec.backend = backend;
  if (to_default_runner) e->spec.runner = config_.default_runner;
  e->spec.limits = std::move(limits);
  e->backend = backend;
  e->uid = allocate_uid_locked(id);
  e->workspace_dir = workspaces_.path(id);
  e->created_at = std::chrono::system_clock::now();
  e->last_used_ms.store(to_unix_ms(e->created_at));
  e->phase = Phase::kCreating;
  sessions_.emplace(id, e);
  return e;
}

namespace {

// The daemon's shared dirs (--shared-dirs), read-only at /shared/<prefix> or their own path.
std::vector<sandbox::BindMount> shared_binds(const ManagerConfig& config) {
  std::vector<sandbox::BindMount> out;
  for (const sandbox::BindMount& m : config.shared_dirs) {
    sandbox::BindMount bm = m;
    if (bm.box_path.empty() || bm.box_path[0] != '/') bm.box_path = kSharedDir + bm.box_path;
    bm.read_only = true;  // shared dirs are never writable from a box
    if (bm.what.empty()) bm.what = "shared dir " + bm.host_path;
    out.push_back(std::move(bm));
  }
  return out;
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

namespace {

// A session's own mounts and skills travel with its archive as <archive>.mounts.json (the archive
// holds the workspace only), so that a restore gives them back.
void write_mounts_sidecar(const std::string& archive, const SessionSpec& spec) {
  if (spec.mounts.empty() && spec.skills.empty()) return;
  SessionSpec keep;
  keep.mounts = spec.mounts;
  keep.skills = spec.skills;
  keep.read_only_skills = spec.read_only_skills;
  const std::string text = encode_spec(keep);
  const std::string path = archive + ".mounts.json";
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  bool ok = fd && ::write(fd.get(), text.data(), text.size()) ==
                      static_cast<ssize_t>(text.size()) &&
            ::fsync(fd.get()) == 0;
  if (!ok) spdlog::warn("{}: writing the session's mounts beside it failed", path);
}

SessionSpec read_mounts_sidecar(const std::string& archive) {
  SessionSpec out;
  std::ifstream f(archive + ".mounts.json", std::ios::binary);
  if (!f) return out;
  std::stringstream ss;
  ss << f.rdbuf();
  auto spec = decode_spec(ss.str());
  if (!spec) {
    spdlog::warn("{}.mounts.json: {}", archive, spec.error().message);
    return out;
  }
  out.mounts = std::move(spec->mounts);
  out.skills = std::move(spec->skills);
  out.read_only_skills = std::move(spec->read_only_skills);
  return out;
}

}  // namespace

Result<std::vector<sandbox::BindMount>> SessionManager::spec_binds(const SessionSpec& spec) const {
  std::vector<sandbox::BindMount> out;
  for (std::size_t i = 0; i < spec.mounts.size(); ++i) {
    const MountSpec& m = spec.mounts[i];
    if (m.mode == "none") continue;  // seed 002: declared but not mounted
    const std::string field = "mounts[" + std::to_string(i) + "]";
    auto host = resolve_host_path(m.host_path, field + ".host_path", config_.allowed_mount_roots);
    if (!host) return std::unexpected(host.error());
    out.push_back({*host, m.mount_path, m.mode == "ro", field});
  }
  for (const auto& [name, dir] : spec.skills) {
    const std::string field = "skills." + name;
    auto host = resolve_host_path(dir, field, config_.allowed_mount_roots);
    if (!host) return std::unexpected(host.error());
    out.push_back({*host, kSkillsDir + name, spec.read_only_skills.count(name) > 0, field});
  }
  return out;
}

std::vector<sandbox::BindMount> SessionManager::global_binds(const SessionSpec& spec) const {
  std::vector<sandbox::BindMount> out;
  auto taken = [&spec](const std::string& box_path) {
    for (const MountSpec& m : spec.mounts) {
      if (m.mount_path == box_path) return true;
    }
    return false;
  };
  if (const std::string& dir = config_.global_skills_dir; !dir.empty()) {
    std::error_code ec;
    std::vector<std::string> names;
    for (const auto& ent : std::filesystem::directory_iterator(dir, ec)) {
      names.push_back(ent.path().filename().string());
    }
    if (ec) spdlog::warn("global_skills_dir {}: {}", dir, ec.message());
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      const std::string host = dir + "/" + name;
      // A skill is a dir with a SKILL.md; its name must be one path component we accept.
      struct stat st;
      if (!is_dir(host) || ::stat((host + "/SKILL.md").c_str(), &st) != 0 ||
          !S_ISREG(st.st_mode) || !check_skill_name(name)) {
        continue;
      }
      // The session's own skill (or mount) of that name wins.
      const std::string target = kSkillsDir + name;
      if (spec.skills.count(name) > 0 || taken(target)) continue;
      out.push_back({host, target, true, "global skill " + name});
    }
  }
  if (const std::string& dir = config_.agents_dir; !dir.empty()) {
    if (!is_dir(dir)) {
      spdlog::warn("agents_dir {}: not a directory (boxes start without /workspace/.agents)", dir);
    } else if (!taken(kAgentsDir)) {
      out.push_back({dir, kAgentsDir, true, "agents_dir"});
    }
  }
  return out;
}

Result<SessionManager::MountsAdded> SessionManager::add_mounts(const std::string& id,
                                                               const SessionSpec& add,
                                                               const Caller& caller) {
  AB_TRY(validate_id(id));
  if (add.mounts.empty() && add.skills.empty()) {
    return fail(Code::kInvalid, "give 'mounts' or 'skills' to add");
  }
  AB_TRY(validate_spec(add));
  // Host paths resolved and checked against the allowed roots (403, 404, 400), before any
  // state is looked at.
  std::vector<sandbox::BindMount> binds = AB_TRY(spec_binds(add));

  std::lock_guard serial(mounts_mu_);
  std::shared_ptr<Entry> e;
  std::shared_ptr<sandbox::Backend> backend;
  {
    std::unique_lock lk(mu_);
    e = find_settled_locked(lk, id);
    if (!e || !visible(*e, caller)) return fail(Code::kNotFound, "no such session: " + id);
    // SECURITY: one mount per target; the box's own dirs are refused by validate_spec already.
    std::map<std::string, std::string> targets;  // box path -> what holds it
    for (std::size_t i = 0; i < e->spec.mounts.size(); ++i) {
      targets.emplace(e->spec.mounts[i].mount_path, "its mounts[" + std::to_string(i) + "]");
    }
    for (const auto& [name, dir] : e->spec.skills) {
      targets.emplace(kSkillsDir + name, "its skill " + name);
    }
    for (const sandbox::BindMount& m : shared_binds(config_)) {
      targets.emplace(m.box_path, "a shared dir of the daemon");
    }
    auto claim = [&](const std::string& target, const std::string& field) -> Status {
      auto [it, fresh] = targets.emplace(target, "this request's " + field);
      if (fresh) return {};
      return fail(Code::kInvalid, field + ": " + target + " is taken in session " + id +
                                      " (by " + it->second + ")");
    };
    for (std::size_t i = 0; i < add.mounts.size(); ++i) {
      AB_TRY(claim(add.mounts[i].mount_path, "mounts[" + std::to_string(i) + "].mount_path"));
    }
    for (const auto& [name, dir] : add.skills) {
      if (e->spec.skills.count(name) > 0) {
        return fail(Code::kInvalid,
                    "skills." + name + ": session " + id + " has a skill named " + name);
      }
      AB_TRY(claim(kSkillsDir + name, "skills." + name));
    }
    backend = config_.backends.at(e->backend);
  }
  // The backend must be able to bind them for this session's user now (a rw mount it cannot
  // idmap fails here, not at the next start). Blocking: without mu_.
  AB_TRY(backend->check_mounts(binds, e->uid, static_cast<gid_t>(e->uid)));

  SessionSpec before;
  std::shared_ptr<sandbox::Sandbox> box;
  {
    std::unique_lock lk(mu_);
    if (find_settled_locked(lk, id) != e) {
      return fail(Code::kNotFound, "no such session: " + id);  // destroyed meanwhile
    }
    before = e->spec;
    for (const MountSpec& m : add.mounts) e->spec.mounts.push_back(m);
    for (const auto& [name, dir] : add.skills) e->spec.skills.emplace(name, dir);
    for (const std::string& name : add.read_only_skills) e->spec.read_only_skills.insert(name);
    if (auto st = record_locked(*e); !st) {
      e->spec = std::move(before);
      return std::unexpected(st.error());
    }
    if (e->state == State::kRunning && e->box) box = lease_locked(e);
  }

  bool live = false;
  if (box) {
    auto added = box->add_mounts(binds);
    box.reset();
    if (!added) {
      // Nothing went into the box: the spec goes back to what it was.
      std::unique_lock lk(mu_);
      if (find_settled_locked(lk, id) == e) {
        e->spec.mounts = before.mounts;
        e->spec.skills = before.skills;
        e->spec.read_only_skills = before.read_only_skills;
        (void)record_locked(*e);
      }
      return std::unexpected(added.error());
    }
    live = *added;
  }
  std::unique_lock lk(mu_);
  e->last_used_ms.store(now_ms());
  return MountsAdded{info_locked(*e), live};
}

Result<SessionManager::BoxStart> SessionManager::start_box(const Entry& e) {
  const bool isolated = config_.backends.at(e.backend)->isolated();
  sandbox::BoxConfig cfg;
  cfg.key = e.id;
  cfg.workspace_dir = e.workspace_dir;
  cfg.limits = e.spec.limits;
  // A templated session: the template's env, under the session's own.
  if (!e.spec.template_name.empty() && config_.templates) {
    cfg.env = config_.templates->session_env(e.spec.template_name, e.spec.template_version);
  }
  for (const auto& [k, v] : e.spec.env) cfg.env[k] = v;
  cfg.uid = e.uid;
  cfg.gid = static_cast<gid_t>(e.uid);
  cfg.runner = e.spec.runner;
  cfg.tenant = e.tenant;
  sandbox::NetworkMode net_mode = AB_TRY(network_mode(e, e.spec.network));
  cfg.egress_policy = std::move(net_mode.egress_policy);
  cfg.egress_hooks = std::move(net_mode.egress_hooks);
  cfg.open_network = net_mode.open;

  cfg.mounts = AB_TRY(spec_binds(e.spec));
  for (const sandbox::BindMount& m : shared_binds(config_)) cfg.mounts.push_back(m);
  for (sandbox::BindMount& m : global_binds(e.spec)) cfg.mounts.push_back(std::move(m));
  AB_TRY(image_box_config(config_.images.get(), config_.data_dir, e.id, e.spec, &cfg));

  BoxStart out;
  if (workspace_on_host(e.spec)) {
    // The client's dir is the workspace: checked against the allowed roots at every start (as
    // mounts are), and never made, chowned or capped here (session/host_workspace.h).
    auto host =
        resolve_host_path(e.spec.primary.host_path, "host_path", config_.allowed_mount_roots);
    if (!host) return std::unexpected(host.error());
    cfg.workspace_dir = *host;
    cfg.workspace_on_host = true;
    cfg.workspace_read_only = e.spec.primary.mode == "ro";
    auto box = config_.backends.at(e.backend)->create(std::move(cfg));
    if (!box) return std::unexpected(box.error());
    out.box = std::shared_ptr<sandbox::Sandbox>(std::move(*box));
    return out;
  }
  // A templated session's cap is on its overlay layer (mount_session below), not the dir.
  const std::uint64_t disk_mb = e.spec.limits.disk_mb.value_or(0);
  auto ws = workspaces_.prepare(e.id, /*must_be_new=*/false, owner_of(isolated, e.uid),
                                e.spec.snapshot.empty() ? disk_mb : 0);
  if (!ws) return std::unexpected(ws.error());
  out.created_dir = ws->created;
  auto drop_new_dir = [&] {
    if (out.created_dir) (void)remove_workspace(e.id);
  };
  if (!e.spec.snapshot.empty()) {
    // The copy-on-write workspace over the template's snapshot; mounted once, kept while the
    // session is suspended, mounted again after a daemon restart.
    const workspace::Owner own =
        owner_of(isolated, e.uid).value_or(workspace::Owner{::geteuid(), ::getegid()});
    Status st = config_.templates
                    ? config_.templates->mount_session(e.id, e.spec.snapshot,
                                                       workspaces_.path(e.id), own.uid, own.gid,
                                                       disk_mb)
                    : Status(fail(Code::kNotSupported, "template (templates)"));
    if (!st) {
      drop_new_dir();
      return std::unexpected(st.error());
    }
  }

  const std::shared_ptr<sandbox::Backend>& backend = config_.backends.at(e.backend);
  auto box = backend->create(std::move(cfg));
  if (!box) {
    drop_new_dir();
    return std::unexpected(box.error());
  }
  out.box = std::shared_ptr<sandbox::Sandbox>(std::move(*box));
  return out;
}

Result<std::shared_ptr<SessionManager::Entry>> SessionManager::finish_start_locked(
    const std::shared_ptr<Entry>& e, Result<BoxStart> started, bool is_new) {
  cv_.notify_all();  // whatever happens below, the entry leaves kCreating
  if (!started) {
    if (is_new) {
      uids_.erase(e->uid);
      sessions_.erase(e->id);
    } else {
      e->phase = Phase::kReady;  // stays suspended; the next use retries
    }
    spdlog::warn("session {}: starting a {} box failed: {}", e->id, e->backend,
                 started.error().message);
    return std::unexpected(started.error());
  }
  if (closed_) {
    // shutdown_all() ran while this box was starting: do not leave it running.
    started->box->shutdown();
    e->phase = Phase::kReady;
    e->state = State::kSuspended;
    (void)record_locked(*e);
    return fail(Code::kUnavailable, "session " + e->id + ": daemon is shutting down");
  }
  e->box = std::move(started->box);
  e->box_workspace = e->box->workspace();
  e->box_uid = e->box->uid();
  if (!e->box_uid && config_.backends.at(e->backend)->isolated()) e->box_uid = e->uid;
  e->state = State::kRunning;
  e->phase = Phase::kReady;
  e->last_used_ms.store(now_ms());
  if (auto st = record_locked(*e); !st && is_new) {
    // A session is created when it is on disk: one the database does not hold would vanish
    // at the next restart, so it is not handed out. (The workspace stays, as an orphan the
    // next start reports; nothing a client was told about is lost.)
    std::shared_ptr<sandbox::Sandbox> box = std::move(e->box);
    uids_.erase(e->uid);
    sessions_.erase(e->id);
    box->shutdown();
    return std::unexpected(st.error());
  }
  spdlog::info("session {}: {} ({} backend, uid {})", e->id, is_new ? "created" : "resumed",
               e->backend, e->uid);
  return e;
}

Result<std::pair<SessionInfo, bool>> SessionManager::create_or_get(const std::string& id,
                                                                   const SessionSpec& asked,
                                                                   const Caller& caller) {
  if (auto st = validate_id(id); !st) return std::unexpected(st.error());
  if (auto st = validate_spec(asked); !st) return std::unexpected(st.error());
  // An image is found or pulled before the manager's lock (a pull takes long).
  SessionSpec spec = asked;
  if (auto st = check_image_backend(config_, spec); !st) return std::unexpected(st.error());
  if (auto st = resolve_image(config_.images.get(), &spec); !st) return std::unexpected(st.error());
  std::unique_lock lk(mu_);
  for (;;) {
    if (auto e = find_settled_locked(lk, id)) {
      // SECURITY: ids are global, so the create cannot succeed; say only that the id is taken.
      if (!visible(*e, caller)) {
        return fail(Code::kExists, "session id " + id + " is already in use");
      }
      if (auto st = check_same_spec(id, e->spec, spec); !st) return std::unexpected(st.error());
      // labels and ttl_sec may change on a re-create; they are the request's now.
      bool changed = false;
      if (!spec.labels.empty() && spec.labels != e->spec.labels) {
        e->spec.labels = spec.labels;
        changed = true;
      }
      if (spec.ttl_sec && spec.ttl_sec != e->spec.ttl_sec) {
        e->spec.ttl_sec = spec.ttl_sec;
        changed = true;
      }
      if (changed) {
        if (auto st = record_locked(*e); !st) return std::unexpected(st.error());
      }
      return std::pair{info_locked(*e), false};
    }
    if (auto st = make_room_locked(lk, id); !st) return std::unexpected(st.error());
    if (sessions_.count(id) != 0) continue;  // made meanwhile, while room was being made
    break;
  }
  SessionSpec resolved = spec;
  if (!spec.template_name.empty()) {
    if (!config_.templates) return fail(Code::kNotSupported, "template (templates)");
    auto r = config_.templates->resolve(spec.template_name);
    if (!r) return std::unexpected(r.error());
    resolved.snapshot = r->snapshot;
    resolved.template_version = r->version;
  }
  auto e = create_locked(id, resolved, caller);
  if (!e) return std::unexpected(e.error());
  lk.unlock();
  auto started = start_box(**e);
  lk.lock();
  auto done = finish_start_locked(*e, std::move(started), /*is_new=*/true);
  if (!done) return std::unexpected(done.error());
  SessionInfo info = info_locked(**done);
  lk.unlock();
  publish(SessionEvent{EventKind::kCreated, EventCause::kApi, info, caller.tenant, ""});
  return std::pair{std::move(info), true};
}

Result<SessionInfo> SessionManager::get(const std::string& id, const Caller& caller) {
  if (auto st = validate_id(id); !st) return std::unexpected(st.error());
  std::unique_lock lk(mu_);
  auto e = find_settled_locked(lk, id);
  // SECURITY: another tenant's session is indistinguishable from a missing one.
  if (!e || !visible(*e, caller)) return fail(Code::kNotFound, "no such session: " + id);
  return info_locked(*e);
}

std::vector<SessionInfo> SessionManager::list(const Caller& caller) {
  std::lock_guard lk(mu_);
  std::vector<SessionInfo> out;
  out.reserve(sessions_.size());
  for (const auto& [id, e] : sessions_) {  // std::map: already sorted by id
    if (e->phase == Phase::kReady && visible(*e, caller)) out.push_back(info_locked(*e));
  }
  return out;
}

Status SessionManager::remove_workspace(const std::string& id) {
  remove_image_root(config_.data_dir, id);
  // A capped workspace is a mount: detach it (and drop its image) before removing the directory,
  // which remove_all below would otherwise refuse as a mount point.
  if (config_.templates) {
    if (auto st = config_.templates->drop_session(id, workspaces_.path(id)); !st) return st;
  }
  if (auto st = workspaces_.drop_disk(id); !st) return st;
  auto root = workspaces_.dup_root();
  if (!root) return std::unexpected(root.error());
  // SECURITY: RootedFs never follows a symlink, so a link the session planted in its workspace
  // cannot make the daemon delete anything outside it.
  sandbox::RootedFs fs(std::move(*root), sandbox::RootMode::kBeneath);
  auto st = fs.remove_all(id);
  if (!st && st.error().code != Code::kNotFound) return st;
  return {};
}

Status SessionManager::destroy(const std::string& id, const Caller& caller) {
  auto r = destroy_impl(id, caller, /*archive=*/false, 0, EventCause::kApi, "");
  if (!r) return std::unexpected(r.error());
  return {};
}

Result<std::string> SessionManager::destroy_archived(const std::string& id, const Caller& caller) {
  return destroy_impl(id, caller, /*archive=*/true, 0, EventCause::kApi, "");
}

Result<std::string> SessionManager::destroy_impl(const std::string& id, const Caller& caller,
                                                 bool archive, std::int64_t if_idle_ttl_ms,
                                                 EventCause cause, std::string_view reason) {
  if (auto st = validate_id(id); !st) return std::unexpected(st.error());
  std::unique_lock lk(mu_);
  auto e = find_settled_locked(lk, id);
  if (!e || !visible(*e, caller)) return fail(Code::kNotFound, "no such session: " + id);
  if (if_idle_ttl_ms > 0 && !idle_locked(*e, now_ms(), if_idle_ttl_ms)) {
    return fail(Code::kExists, "session " + id + " is in use again");
  }
  // The workspace folder here is not the runner's files: an archive of it would be a wrong 2xx.
  if (archive && e->backend == "remote") {
    return fail(Code::kNotSupported, "archive of a remote session (backend remote) is not supported");
  }
  // The client's own dir is never archived (nor deleted): 409 naming why.
  const bool on_host = workspace_on_host(e->spec);
  if (archive && on_host) return std::unexpected(host_workspace_archive_refused(id, e->spec));
  e->phase = Phase::kDestroying;
  std::shared_ptr<sandbox::Sandbox> box = std::move(e->box);
  lk.unlock();

  // Execs that hold the sandbox keep the object alive; shutdown() ends their commands.
  if (box) box->shutdown();
  // The archive is taken with the box down (nothing writes meanwhile) and is durable before
  // the workspace is removed.
  Result<std::string> archived = std::string();
  if (archive && !e->spec.snapshot.empty() && config_.templates) {
    // The archive holds the merged view (snapshot + the session's writes): it restores
    // anywhere, also where the snapshot is gone.
    const workspace::Owner own =
        owner_of(config_.backends.at(e->backend)->isolated(), e->uid)
            .value_or(workspace::Owner{::geteuid(), ::getegid()});
    if (auto st = config_.templates->mount_session(id, e->spec.snapshot, workspaces_.path(id),
                                                   own.uid, own.gid,
                                                   e->spec.limits.disk_mb.value_or(0));
        !st) {
      archived = std::unexpected(st.error());
    }
  }
  if (archive && archived) archived = workspaces_.archive(id);
  if (archive && archived) write_mounts_sidecar(*archived, e->spec);
  Status removed = !archived ? Status(std::unexpected(archived.error()))
                   : on_host ? Status()  // the host dir is the client's: it stays
                             : remove_workspace(id);

  lk.lock();
  cv_.notify_all();
  if (!removed) {
    // Keep the session (suspended) so the caller can see it and retry the delete.
    e->phase = Phase::kReady;
    e->state = State::kSuspended;
    (void)record_locked(*e);
    spdlog::error("session {}: {} failed: {}", id,
                  archived ? "removing the workspace" : "archiving the workspace",
                  removed.error().message);
    return std::unexpected(removed.error());
  }
  uids_.erase(e->uid);
  sessions_.erase(id);
  (void)forget_locked(*e);
  spdlog::info("session {}: destroyed{}", id, archive ? " (archived to " + *archived + ")" : "");
  const bool own = cause == EventCause::kReaper || cause == EventCause::kEviction;
  publish_locked(lk, *e, EventKind::kDestroyed, cause, own ? "" : caller.tenant,
                 archive ? std::string_view(*archived) : reason);
  return *archived;
}

Result<SessionInfo> SessionManager::restore(const std::string& id, const std::string& archive,
                                            const Caller& caller) {
  if (auto st = validate_id(id); !st) return std::unexpected(st.error());
  // Same words whoever owns it: the id is taken, nothing more.
  const auto taken = [&] {
    return fail(Code::kExists, "session " + id + " already exists; restore needs a free id");
  };
  std::unique_lock lk(mu_);
  if (find_settled_locked(lk, id)) return taken();  // API.md: 409 before the archive is looked at
  lk.unlock();
  auto afd = workspaces_.open_archive(archive);
  if (!afd) return std::unexpected(afd.error());
  // With --default-runner the restored session would be remote: its files live on the runner.
  if (!config_.default_runner.empty()) {
    return fail(Code::kNotSupported, "restore of a remote session (backend remote) is not supported");
  }
  // The mounts and skills the session had when it was archived come back with it.
  SessionSpec spec =
      read_mounts_sidecar(archive.front() == '/' ? archive : archives_dir() + "/" + archive);
  lk.lock();
  if (find_settled_locked(lk, id)) return taken();
  auto created = create_locked(id, spec, caller);
  if (!created) return std::unexpected(created.error());
  std::shared_ptr<Entry> e = *created;
  lk.unlock();

  // Slow work on an entry nobody else touches while it is kCreating.
  const bool isolated = config_.backends.at(e->backend)->isolated();
  bool made_dir = false;
  auto fill = [&]() -> Status {
    // The workspace must be new: a restore never merges into, or clobbers, a directory.
    auto ws = workspaces_.prepare(id, /*must_be_new=*/true, owner_of(isolated, e->uid), /*disk_mb=*/0);
    if (!ws) return std::unexpected(ws.error());
    made_dir = true;
    auto stats =
        workspace::extract_archive(afd->get(), ws->dir.get(), config_.restore_limits,
                                   owner_of(isolated, e->uid), archive);
    if (!stats) return std::unexpected(stats.error());
    spdlog::info("session {}: restored {} entries, {} bytes from {}", id, stats->entries,
                 stats->bytes, archive);
    return {};
  };
  Status filled = fill();
  Result<BoxStart> started =
      filled ? start_box(*e) : Result<BoxStart>(std::unexpected(filled.error()));
  // SECURITY: a refused (possibly hostile) archive leaves nothing behind; remove_workspace
  // never follows the symlinks it may have planted.
  if (!started && made_dir) (void)remove_workspace(id);
  lk.lock();
  auto done = finish_start_locked(e, std::move(started), /*is_new=*/true);
  if (!done) return std::unexpected(done.error());
  SessionInfo info = info_locked(**done);
  lk.unlock();
  publish(SessionEvent{EventKind::kCreated, EventCause::kRestore, info, caller.tenant, archive});
  return info;
}

std::shared_ptr<sandbox::Sandbox> SessionManager::lease_locked(const std::shared_ptr<Entry>& e) {
  e->leases.fetch_add(1);
  e->last_used_ms.store(now_ms());
  auto lease = std::make_shared<Lease>();
  lease->entry = e;
  lease->box = e->box;
  sandbox::Sandbox* raw = lease->box.get();
  return std::shared_ptr<sandbox::Sandbox>(std::move(lease), raw);
}

Result<std::shared_ptr<sandbox::Sandbox>> SessionManager::acquire(const std::string& id,
                                                                  bool create_if_missing,
                                                                  const Caller& caller) {
  return acquire_impl(id, create_if_missing, caller, EventCause::kApi);
}

Result<std::shared_ptr<sandbox::Sandbox>> SessionManager::acquire_impl(const std::string& id,
                                                                       bool create_if_missing,
                                                                       const Caller& caller,
                                                                       EventCause cause) {
  if (auto st = validate_id(id); !st) return std::unexpected(st.error());
  std::unique_lock lk(mu_);
  for (;;) {
    std::shared_ptr<Entry> e = find_settled_locked(lk, id);
    bool is_new = false;
    if (e && !visible(*e, caller)) {
      // SECURITY: not even an exec (which creates) may touch another tenant's session; to
      // this caller it does not exist.
      return fail(Code::kNotFound, "no such session: " + id);
    }
    if (e && e->state == State::kRunning) return lease_locked(e);
    if (closed_) return fail(Code::kUnavailable, "session " + id + ": daemon is shutting down");
    if (!e && !create_if_missing) return fail(Code::kNotFound, "no such session: " + id);
    if (e && config_.backends.find(e->backend) == config_.backends.end()) {
      return fail(Code::kUnavailable, "session " + id + ": its backend \"" + e->backend +
                                          "\" is not configured on this daemon");
    }
    if (auto st = make_room_locked(lk, id); !st) return std::unexpected(st.error());
    // Making room may have let go of mu_: look again.
    auto again = sessions_.find(id);
    if ((again == sessions_.end() ? nullptr : again->second) != e ||
        (e && (e->phase != Phase::kReady || e->state != State::kSuspended))) {
      continue;
    }
    if (!e) {
      auto created = create_locked(id, SessionSpec{}, caller);
      if (!created) return std::unexpected(created.error());
      e = *created;
      is_new = true;
    } else {
      // Suspended: any use resumes it (DESIGN.md "Lifecycle").
      e->phase = Phase::kCreating;
    }
    std::optional<SessionInfo> resuming;
    if (!is_new && config_.on_resume) resuming = info_locked(*e);
    lk.unlock();
    auto started = start_box(*e);
    // Before the box is anyone's (the entry is still kCreating): the resume's first command
    // comes after the hook.
    if (started && resuming) config_.on_resume(*resuming, started->box);
    lk.lock();
    auto done = finish_start_locked(e, std::move(started), is_new);
    if (!done) return std::unexpected(done.error());
    publish_locked(lk, **done, is_new ? EventKind::kCreated : EventKind::kResumed, cause,
                   cause == EventCause::kApi ? std::string_view(caller.tenant) : "");
    // Loop: the entry is ready and running now (or was destroyed meanwhile, then re-checked).
  }
}

std::shared_ptr<sandbox::Sandbox> SessionManager::try_acquire_running(const std::string& id,
                                                                      const Caller& caller) {
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return nullptr;  // e.g. a create is committing to the database
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return nullptr;
  const std::shared_ptr<Entry>& e = it->second;
  if (e->phase != Phase::kReady || e->state != State::kRunning || !visible(*e, caller)) {
    return nullptr;
  }
  return lease_locked(e);
}

std::shared_ptr<sandbox::Sandbox> SessionManager::acquire_running(const std::string& id,
                                                                  const Caller& caller) {
  std::unique_lock lk(mu_);
  auto e = find_settled_locked(lk, id);
  if (!e || e->state != State::kRunning || !visible(*e, caller)) return nullptr;
  return lease_locked(e);
}

Status SessionManager::save_managed(const std::string& id, const sandbox::ProcessSpec& spec) {
  std::unique_lock lk(mu_);
  auto e = find_settled_locked(lk, id);
  if (!e) return fail(Code::kNotFound, "no such session: " + id);
  if (store_) {
    if (auto st = store_->put_process(id, spec); !st) {
      spdlog::error("session {}: saving managed process {}: {}", id, spec.key, st.error().message);
      return st;
    }
  }
  e->managed[spec.key] = spec;
  return {};
}

Status SessionManager::forget_managed(const std::string& id, const std::string& key) {
  std::unique_lock lk(mu_);
  auto e = find_settled_locked(lk, id);
  if (!e) return {};  // destroyed: its specs went with it
  if (store_) {
    if (auto st = store_->erase_process(id, key); !st) {
      spdlog::error("session {}: forgetting managed process {}: {}", id, key, st.error().message);
      return st;
    }
  }
  e->managed.erase(key);
  return {};
}

std::vector<sandbox::ProcessSpec> SessionManager::managed_specs(const std::string& id) {
  std::unique_lock lk(mu_);
  auto e = find_settled_locked(lk, id);
  std::vector<sandbox::ProcessSpec> out;
  if (!e) return out;
  for (const auto& [key, spec] : e->managed) out.push_back(spec);
  return out;
}

std::size_t SessionManager::resume_managed() {
  std::vector<std::string> ids;
  {
    std::lock_guard lk(mu_);
    for (const auto& [id, e] : sessions_) {
      if (e->phase == Phase::kReady && e->state == State::kSuspended && !e->managed.empty()) {
        ids.push_back(id);
      }
    }
  }
  std::size_t n = 0;
  for (const std::string& id : ids) {
    auto box =
        acquire_impl(id, /*create_if_missing=*/false, Caller::daemon(), EventCause::kStartup);
    if (!box) {
      spdlog::error("session {}: resuming it for its managed processes: {}", id,
                    box.error().message);
      continue;
    }
    spdlog::info("session {}: resumed at start for its managed processes", id);
    ++n;
  }
  return n;
}

Result<SessionInfo> SessionManager::resume(const std::string& id, const Caller& caller) {
  auto box = acquire(id, /*create_if_missing=*/false, caller);
  if (!box) return std::unexpected(box.error());
  return get(id, caller);
}

Result<SessionInfo> SessionManager::keepalive(const std::string& id, const Caller& caller) {
  if (auto st = validate_id(id); !st) return std::unexpected(st.error());
  std::unique_lock lk(mu_);
  auto e = find_settled_locked(lk, id);
  if (!e || !visible(*e, caller)) return fail(Code::kNotFound, "no such session: " + id);
  e->last_used_ms.store(now_ms());
  return info_locked(*e);
}

void SessionManager::suspend_locked(std::unique_lock<std::mutex>& lk,
                                    const std::shared_ptr<Entry>& e) {
  AB_CHECK(e->phase == Phase::kReady && e->state == State::kRunning);
  e->phase = Phase::kSuspending;
  std::shared_ptr<sandbox::Sandbox> box = std::move(e->box);
  lk.unlock();
  // Commands still running (execs holding a lease included) die with the box; leases keep the
  // object alive until their requests finish.
  box->shutdown();
  box.reset();
  lk.lock();
  e->state = State::kSuspended;
  e->phase = Phase::kReady;
  (void)record_locked(*e);
  cv_.notify_all();
  spdlog::info("session {}: suspended", e->id);
}

Result<SessionInfo> SessionManager::suspend(const std::string& id, const Caller& caller) {
  if (auto st = validate_id(id); !st) return std::unexpected(st.error());
  std::unique_lock lk(mu_);
  auto e = find_settled_locked(lk, id);
  if (!e || !visible(*e, caller)) return fail(Code::kNotFound, "no such session: " + id);
  e->last_used_ms.store(now_ms());
  if (e->state == State::kRunning) {
    suspend_locked(lk, e);
    publish_locked(lk, *e, EventKind::kSuspended, EventCause::kApi, caller.tenant);
  }
  return info_locked(*e);
}

void SessionManager::suspend_for_locked(std::unique_lock<std::mutex>& lk,
                                        const std::shared_ptr<Entry>& e, EventCause cause,
                                        std::string_view reason) {
  suspend_locked(lk, e);
  publish_locked(lk, *e, EventKind::kSuspended, cause, /*actor=*/"", reason);
}

bool SessionManager::idle_locked(const Entry& e, std::int64_t now, std::int64_t ttl_ms) const {
  return e.phase == Phase::kReady && e.leases.load() == 0 && now - e.last_used_ms.load() >= ttl_ms;
}

Status SessionManager::make_room_locked(std::unique_lock<std::mutex>& lk, const std::string& id) {
  for (;;) {
    auto st = check_running_quota_locked(id);
    if (st || !config_.evict_idle) return st;
    // The least recently used running box with nothing in flight.
    std::shared_ptr<Entry> victim;
    const std::int64_t now = now_ms();
    for (const auto& [other, e] : sessions_) {
      if (e->state != State::kRunning || !idle_locked(*e, now, 0)) continue;
      if (!victim || e->last_used_ms.load() < victim->last_used_ms.load()) victim = e;
    }
    if (!victim) return st;
    spdlog::info("session {}: suspended to make room for {} (max_running_boxes {})", victim->id, id,
                 config_.max_running_boxes);
    suspend_for_locked(lk, victim, EventCause::kEviction, "evicted: max_running_boxes reached");
  }
}

std::size_t SessionManager::reap_idle() {
  struct Candidate {
    std::string id;
    std::int64_t ttl_ms;
  };
  std::vector<Candidate> due;
  {
    std::lock_guard lk(mu_);
    const std::int64_t now = now_ms();
    for (const auto& [id, e] : sessions_) {
      std::int64_t ttl = e->spec.ttl_sec ? *e->spec.ttl_sec : config_.default_ttl_sec;
      if (ttl <= 0) continue;
      if (!config_.ttl_destroys && e->state != State::kRunning) continue;
      if (idle_locked(*e, now, ttl * 1000)) due.push_back({id, ttl * 1000});
    }
  }
  std::size_t n = 0;
  for (const Candidate& c : due) {
    std::string reason = "idle for " + std::to_string(c.ttl_ms / 1000) + " s (ttl_sec)";
    if (config_.ttl_destroys) {
      if (destroy_impl(c.id, Caller::daemon(), /*archive=*/false, c.ttl_ms, EventCause::kReaper,
                       reason)) {
        spdlog::info("session {}: destroyed by the reaper ({})", c.id, reason);
        ++n;
      }
      continue;
    }
    std::unique_lock lk(mu_);
    auto it = sessions_.find(c.id);
    if (it == sessions_.end()) continue;
    std::shared_ptr<Entry> e = it->second;
    // Re-checked under the lock: a request that came in since has a lease now.
    if (e->state != State::kRunning || !idle_locked(*e, now_ms(), c.ttl_ms)) continue;
    spdlog::info("session {}: suspending it for the reaper ({})", c.id, reason);
    suspend_for_locked(lk, e, EventCause::kReaper, reason);
    ++n;
  }
  return n;
}

void SessionManager::flush_used() {
  if (!store_) return;
  std::vector<std::pair<std::string, std::int64_t>> batch;
  {
    std::lock_guard lk(mu_);
    for (const auto& [id, e] : sessions_) {
      std::int64_t used = e->last_used_ms.load();
      if (e->phase == Phase::kReady && used != e->stored_used_ms) batch.emplace_back(id, used);
    }
  }
  if (batch.empty()) return;
  if (auto st = store_->touch(batch); !st) {
    spdlog::warn("state: saving last-used times failed: {}", st.error().message);
    return;
  }
  std::lock_guard lk(mu_);
  for (const auto& [id, used] : batch) {
    if (auto it = sessions_.find(id); it != sessions_.end()) it->second->stored_used_ms = used;
  }
}

void SessionManager::reaper_loop() {
  if (store_) sweep_temp_files();
  std::unique_lock lk(reaper_mu_);
  while (!stop_) {
    reaper_cv_.wait_for(lk, config_.reaper_interval, [this] { return stop_; });
    if (stop_) break;
    lk.unlock();
    flush_used();
    (void)reap_idle();
    lk.lock();
  }
}

Result<sandbox::NetworkMode> SessionManager::network_mode(const Entry& e,
                                                          const NetworkSpec& net) const {
  sandbox::NetworkMode mode;
  if (net.mode == "allowlist") {
    auto policy = net::Policy::parse(net.allow);
    if (!policy) return std::unexpected(policy.error());
    mode.egress_policy = std::make_shared<const net::Policy>(std::move(*policy));
    if (config_.on_net_deny) {
      mode.egress_hooks.on_deny = [fn = config_.on_net_deny, id = e.id, tenant = e.tenant](
                                      const net::DenyEvent& d) { fn(id, tenant, d); };
    }
  } else if (net.mode == "open") {
    mode.open = true;
  } else if (net.mode != "none") {
    return fail(Code::kNotSupported, "network.mode \"" + net.mode + "\"");
  }
  return mode;
}

Result<SessionInfo> SessionManager::set_network(const std::string& id, const NetworkSpec& network,
                                                const Caller& caller) {
  if (auto st = validate_id(id); !st) return std::unexpected(st.error());
  SessionSpec probe;
  probe.network = network;
  if (auto st = validate_spec(probe); !st) return std::unexpected(st.error());
  std::lock_guard serial(update_mu_);
  std::unique_lock lk(mu_);
  auto e = find_settled_locked(lk, id);
  if (!e || !visible(*e, caller)) return fail(Code::kNotFound, "no such session: " + id);
  // Running or suspended, a mode the backend cannot serve (any but none on a remote runner) is
  // refused now, not taken and then failing every command.
  if (auto be = config_.backends.find(e->backend); be != config_.backends.end()) {
    sandbox::SpecRequest asked{network.mode, e->spec.limits, e->spec.runner, e->tenant};
    if (auto st = be->second->check_spec(asked); !st) return std::unexpected(st.error());
  }
  sandbox::NetworkMode mode = AB_TRY(network_mode(*e, network));
  if (e->state == State::kRunning && e->box) {
    std::shared_ptr<sandbox::Sandbox> box = lease_locked(e);
    const bool same_mode = network.mode == e->spec.network.mode;
    lk.unlock();
    // Blocking (a mode switch runs ip/nft/ss): without mu_. A new allowlist for an allowlist
    // box only replaces the proxy's policy.
    Status st = same_mode && network.mode != "allowlist" ? Status{}
                : same_mode ? box->set_egress_policy(mode.egress_policy)
                            : box->set_network(mode);
    box.reset();
    lk.lock();
    if (!st) return std::unexpected(st.error());
    if (find_settled_locked(lk, id) != e) return fail(Code::kNotFound, "no such session: " + id);
  }
  e->spec.network = network;
  if (auto st = record_locked(*e); !st) return std::unexpected(st.error());
  e->last_used_ms.store(now_ms());
  publish_locked(lk, *e, EventKind::kUpdated, EventCause::kApi, caller.tenant, "network");
  return info_locked(*e);
}

Result<SessionInfo> SessionManager::update(const std::string& id, const Update& u,
                                           const Caller& caller) {
  AB_TRY(validate_id(id));
  if (u.ttl_sec && *u.ttl_sec < 0) return fail(Code::kInvalid, "field 'ttl_sec': must be >= 0");
  const std::string& lf = u.limits_field;
  if (u.limits) AB_TRY(validate::limits(*u.limits, lf));
  std::lock_guard serial(update_mu_);
  std::unique_lock lk(mu_);
  auto e = find_settled_locked(lk, id);
  if (!e || !visible(*e, caller)) return fail(Code::kNotFound, "no such session: " + id);
  sandbox::Limits limits = e->spec.limits;
  std::vector<std::string> changed;
  std::string box_limits;  // the first limit the running box takes live that changed
  if (u.limits) {
    const sandbox::Limits& w = *u.limits;
    const bool running = e->state == State::kRunning && e->box;
    auto not_live = [&](const char* field, auto want, auto have, const char* why) -> Status {
      if (!want || want == have) return {};
      return fail(Code::kNotSupported,
                  "field '" + lf + "." + field + "' = " + std::to_string(*want) + ": " + why);
    };
    AB_TRY(not_live("disk_mb", w.disk_mb, limits.disk_mb,
                    "the workspace's disk is sized when it is made; it cannot change"));
    if (running) {
      const char* why =
          "fixed while the box runs (suspend the session first; it applies at resume)";
      AB_TRY(not_live("tmp_mb", w.tmp_mb, limits.tmp_mb, why));
      AB_TRY(not_live("max_open_files", w.max_open_files, limits.max_open_files, why));
    }
    auto take = [&](const char* field, auto want, auto& have, bool live) {
      if (!want || want == have) return;
      have = want;
      if (live && box_limits.empty()) box_limits = lf + "." + field;
    };
    take("memory_mb", w.memory_mb, limits.memory_mb, true);
    take("cpu_percent", w.cpu_percent, limits.cpu_percent, true);
    take("max_pids", w.max_pids, limits.max_pids, true);
    take("cpu_time_sec", w.cpu_time_sec, limits.cpu_time_sec, true);
    take("tmp_mb", w.tmp_mb, limits.tmp_mb, false);
    take("max_open_files", w.max_open_files, limits.max_open_files, false);
    AB_TRY(sandbox::check_limits_together(limits, lf));
    if (limits != e->spec.limits) {
      // A limit the backend would not enforce (a remote runner's) is refused, as at create.
      if (auto be = config_.backends.find(e->backend); be != config_.backends.end()) {
        sandbox::SpecRequest asked{e->spec.network.mode, limits, e->spec.runner, e->tenant};
        if (auto st = be->second->check_spec(asked); !st) return std::unexpected(st.error());
      }
      changed.push_back("limits");
    }
  }
  if (u.ttl_sec && u.ttl_sec != e->spec.ttl_sec) changed.push_back("ttl_sec");
  if (u.labels && *u.labels != e->spec.labels) changed.push_back("labels");
  if (!box_limits.empty() && e->state == State::kRunning && e->box) {
    std::shared_ptr<sandbox::Sandbox> box = lease_locked(e);
    lk.unlock();
    // Blocking (lowering memory waits for the kernel's reclaim): without mu_.
    Status st = box->set_limits(limits);
    box.reset();
    lk.lock();
    if (!st && st.error().code == Code::kNotSupported) {
      return fail(Code::kNotSupported, "field '" + box_limits + "': " + st.error().message);
    }
    if (!st) return std::unexpected(st.error());
    if (find_settled_locked(lk, id) != e) return fail(Code::kNotFound, "no such session: " + id);
  }
  if (changed.empty()) return info_locked(*e);
  SessionSpec before = e->spec;
  e->spec.limits = limits;
  if (u.ttl_sec) e->spec.ttl_sec = u.ttl_sec;
  if (u.labels) e->spec.labels = *u.labels;
  if (auto st = record_locked(*e); !st) {
    e->spec = std::move(before);
    return std::unexpected(st.error());
  }
  e->last_used_ms.store(now_ms());
  std::string what;
  for (const std::string& c : changed) what += (what.empty() ? "" : ",") + c;
  publish_locked(lk, *e, EventKind::kUpdated, EventCause::kApi, caller.tenant, what);
  return info_locked(*e);
}

std::map<std::string, net::ProxyCounters> SessionManager::egress_counters() {
  std::vector<std::pair<std::string, std::shared_ptr<sandbox::Sandbox>>> boxes;
  {
    std::lock_guard lk(mu_);
    for (const auto& [id, e] : sessions_) {
      if (e->phase == Phase::kReady && e->state == State::kRunning && e->box) {
        boxes.emplace_back(id, e->box);
      }
    }
  }
  std::map<std::string, net::ProxyCounters> out;
  for (const auto& [id, box] : boxes) {
    if (auto c = box->egress_counters()) out[id] = *c;
  }
  return out;
}

std::map<std::string, std::size_t> SessionManager::count_by_state() {
  std::lock_guard lk(mu_);
  std::map<std::string, std::size_t> out{{std::string(state_name(State::kRunning)), 0},
                                         {std::string(state_name(State::kSuspended)), 0}};
  for (const auto& [id, e] : sessions_) {
    if (e->phase == Phase::kReady) ++out[std::string(state_name(e->state))];
  }
  return out;
}

SessionManager::Liveness SessionManager::liveness() {
  std::unique_lock lk(mu_, std::try_to_lock);
  std::lock_guard last(liveness_mu_);
  if (!lk.owns_lock()) return last_liveness_;
  Liveness out;
  for (const auto& [id, e] : sessions_) {
    if (e->phase != Phase::kReady) continue;
    ++out.sessions;
    if (e->state == State::kRunning) ++out.running;
    out.managed_processes += e->managed.size();
  }
  last_liveness_ = out;
  return out;
}

void SessionManager::shutdown_all() {
  std::vector<std::shared_ptr<sandbox::Sandbox>> boxes;
  std::vector<std::string> capped;
  std::vector<std::string> layered;
  {
    std::lock_guard lk(mu_);
    closed_ = true;
    for (auto& [id, e] : sessions_) {
      if (e->spec.limits.disk_mb) capped.push_back(id);
      if (!e->spec.snapshot.empty()) layered.push_back(id);
      if (e->phase != Phase::kReady || !e->box) continue;
      boxes.push_back(std::move(e->box));
      // Not written: every session comes back suspended at the next start anyway.
      e->state = State::kSuspended;
    }
  }
  // Outside the lock: shutting a box down waits for its processes to die.
  for (auto& b : boxes) b->shutdown();
  if (config_.templates) config_.templates->shutdown();
  // A clean exit leaves no capped workspace mounted (nor its loop device attached): the next
  // start mounts the image again when the session is used.
  for (const std::string& id : layered) {
    if (!config_.templates) break;
    if (auto st = config_.templates->unmount_session(workspaces_.path(id), id); !st) {
      spdlog::warn("session {}: unmounting its overlay: {}", id, st.error().message);
    }
  }
  for (const std::string& id : capped) {
    if (auto st = workspaces_.unmount_disk(id); !st) {
      spdlog::warn("session {}: unmounting its disk: {}", id, st.error().message);
    }
  }
}

}  // namespace agentbox::session
