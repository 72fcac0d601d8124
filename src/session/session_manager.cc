#include "session/session_manager.h"

#include "session/internal/manager.h"

#include <cstring>

namespace agentbox::session {

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

namespace {

// Operations that must not be seen half done after a crash mark their session id, durably,
// in data_dir/<kind>/ before they start changing the disk, and clear the mark once done:
// - restoring/<id>: a restore extracting. Found at startup without a session row, the restore
//   was interrupted: its half-extracted workspace is removed (never visible, never adopted by a
//   later create of that id).
// - destroying/<id>: a delete (its archive, if any, durable already) removing the workspace.
//   Found at startup, the delete is finished: the half-removed workspace is never served again.
// load_locked() sweeps them.
constexpr std::string_view kRestoring = "restoring";
constexpr std::string_view kDestroying = "destroying";

std::string mark_dir(const std::string& data_dir, std::string_view kind) {
  return data_dir + "/" + std::string(kind);
}

Status mark(const std::string& data_dir, std::string_view kind, const std::string& id) {
  const std::string dir = mark_dir(data_dir, kind);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return fail_errno(errno, "mkdir(" + dir + ")");
  }
  const std::string path = dir + "/" + id;
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd || ::fsync(fd.get()) != 0) return fail_errno(errno, "create " + path);
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd || ::fsync(dfd.get()) != 0) return fail_errno(errno, "fsync(" + dir + ")");
  return {};
}

void clear_mark(const std::string& data_dir, std::string_view kind, const std::string& id) {
  ::unlink((mark_dir(data_dir, kind) + "/" + id).c_str());
}

}  // namespace

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
  // Interrupted restores and deletes (see mark() above), before anything is served.
  for (std::string_view kind : {kRestoring, kDestroying}) {
    // Made now, so that marking needs no new directory block later (a full disk still deletes).
    const std::string dir = mark_dir(config_.data_dir, kind);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      spdlog::warn("state: mkdir({}): {}", dir, std::strerror(errno));
    }
    std::error_code ec;
    for (const auto& m : std::filesystem::directory_iterator(dir, ec)) {
      const std::string id = m.path().filename().string();
      if (!validate_id(id)) continue;
      auto it = sessions_.find(id);
      std::shared_ptr<Entry> e = it == sessions_.end() ? nullptr : it->second;
      // A restore whose session was committed is done; a delete is finished whatever it reached.
      const bool undo = kind == kDestroying || !e;
      if (undo && !(e && workspace_on_host(e->spec))) {
        if (auto st = remove_workspace(id); !st) {
          spdlog::error("state: session {}: removing the workspace of an interrupted {}: {}", id,
                        kind == kRestoring ? "restore" : "delete", st.error().message);
          continue;  // the mark stays: tried again at the next start
        }
      }
      if (kind == kDestroying && e) {
        uids_.erase(e->uid);
        sessions_.erase(id);
        (void)forget_locked(*e);
      }
      if (undo) {
        spdlog::warn("state: session {}: {}", id,
                     kind == kRestoring ? "its restore was interrupted; the partly restored "
                                          "workspace was removed (the session was never created)"
                                        : "its delete was interrupted; the delete was finished");
      }
      std::filesystem::remove(m.path(), ec);
    }
  }
  // An archive is written to ".<name>.tmp-*" and renamed when whole (workspace/archive.cc): a
  // temp name left is an archive that kill -9 interrupted (its session was not deleted).
  std::size_t temps = 0;
  std::error_code aec;
  for (const auto& a : std::filesystem::directory_iterator(workspaces_.archives_dir(), aec)) {
    const std::string name = a.path().filename().string();
    if (name.starts_with(".") && name.find(".tar.zst.tmp-") != std::string::npos &&
        ::unlink(a.path().c_str()) == 0) {
      ++temps;
    }
  }
  if (temps > 0) {
    spdlog::warn("state: removed {} unfinished archives of interrupted deletes", temps);
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
  bool ok = fd &&
            ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            ::fsync(fd.get()) == 0;
  if (!ok) spdlog::warn("{}: writing the session's mounts beside it failed", path);
}

SessionSpec read_mounts_sidecar(const std::string& archive) {
  SessionSpec out;
  // A session moved here from another node of a cluster (server/cluster_move.cc): its whole
  // spec came beside the archive, which holds its merged view (so no snapshot under it). The
  // archive directory is the daemon's own (open_archive confines restores to it).
  if (std::ifstream moved(archive + ".spec.json", std::ios::binary); moved) {
    std::stringstream ms;
    ms << moved.rdbuf();
    auto spec = decode_spec(ms.str());
    if (spec) {
      spec->snapshot.clear();
      return std::move(*spec);
    }
    spdlog::warn("{}.spec.json: {}", archive, spec.error().message);
  }
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

Result<std::pair<SessionInfo, bool>> SessionManager::create_or_get(const std::string& id,
                                                                   const SessionSpec& asked,
                                                                   const Caller& caller) {
  if (auto st = validate_id(id); !st) return std::unexpected(st.error());
  if (auto st = validate_spec(asked); !st) return std::unexpected(st.error());
  // An image is found or pulled before the manager's lock (a pull takes long).
  SessionSpec spec = asked;
  if (auto st = template_image(config_.templates.get(), &spec); !st) {
    return std::unexpected(st.error());
  }
  default_image(config_, &spec);
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
    if (r->image_digest != spec.image_digest && asked.image_ref.empty()) {
      // The current version changed since template_image (a rollback, a build): its image.
      resolved.image_ref = r->image_ref;
      resolved.image_digest = r->image_digest;
    }
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
    return fail(Code::kNotSupported,
                "archive of a remote session (backend remote) is not supported");
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
    const workspace::Owner own = owner_of(config_.backends.at(e->backend)->isolated(), e->uid)
                                     .value_or(workspace::Owner{::geteuid(), ::getegid()});
    if (auto st =
            config_.templates->mount_session(id, e->spec.snapshot, workspaces_.path(id), own.uid,
                                             own.gid, e->spec.limits.disk_mb.value_or(0));
        !st) {
      archived = std::unexpected(st.error());
    }
  }
  if (archive && archived) archived = workspaces_.archive(id);
  if (archive && archived) write_mounts_sidecar(*archived, e->spec);
  // Past this point the delete is finished at the next start if the daemon dies in it (a half
  // removed workspace must not come back as the session's).
  Status removed = !archived ? Status(std::unexpected(archived.error()))
                   : on_host ? Status()  // the host dir is the client's: it stays
                             : mark(config_.data_dir, kDestroying, id);
  if (removed && !on_host) removed = remove_workspace(id);

  lk.lock();
  cv_.notify_all();
  if (!removed) {
    // Keep the session (suspended) so the caller can see it and retry the delete.
    e->phase = Phase::kReady;
    e->state = State::kSuspended;
    (void)record_locked(*e);
    clear_mark(config_.data_dir, kDestroying, id);  // as before: kept for a retry
    spdlog::error("session {}: {} failed: {}", id,
                  archived ? "removing the workspace" : "archiving the workspace",
                  removed.error().message);
    return std::unexpected(removed.error());
  }
  uids_.erase(e->uid);
  sessions_.erase(id);
  (void)forget_locked(*e);
  clear_mark(config_.data_dir, kDestroying, id);
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
    return fail(Code::kNotSupported,
                "restore of a remote session (backend remote) is not supported");
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
    auto ws =
        workspaces_.prepare(id, /*must_be_new=*/true, owner_of(isolated, e->uid), /*disk_mb=*/0);
    if (!ws) return std::unexpected(ws.error());
    made_dir = true;
    auto stats = workspace::extract_archive(afd->get(), ws->dir.get(), config_.restore_limits,
                                            owner_of(isolated, e->uid), archive);
    if (!stats) return std::unexpected(stats.error());
    spdlog::info("session {}: restored {} entries, {} bytes from {}", id, stats->entries,
                 stats->bytes, archive);
    return {};
  };
  Status filled = mark(config_.data_dir, kRestoring, id);
  if (filled) filled = fill();
  Result<BoxStart> started =
      filled ? start_box(*e) : Result<BoxStart>(std::unexpected(filled.error()));
  // SECURITY: a refused (possibly hostile) archive leaves nothing behind; remove_workspace
  // never follows the symlinks it may have planted.
  if (!started && made_dir) (void)remove_workspace(id);
  lk.lock();
  auto done = finish_start_locked(e, std::move(started), /*is_new=*/true);
  clear_mark(config_.data_dir, kRestoring, id);  // committed, or nothing of it is left
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

}  // namespace agentbox::session
