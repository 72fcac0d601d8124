// The session manager: a box's start, its binds and mounts added live (internal/manager.h).

#include "session/internal/manager.h"

namespace agentbox::session {

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
      if (!is_dir(host) || ::stat((host + "/SKILL.md").c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
          !check_skill_name(name)) {
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
      return fail(Code::kInvalid, field + ": " + target + " is taken in session " + id + " (by " +
                                      it->second + ")");
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
  if (!e.spec.image_digest.empty() && !e.spec.snapshot.empty() && config_.templates) {
    // A template built on the image: its build's root layer, on top of the image's.
    std::string layer =
        config_.templates->root_layer(e.spec.template_name, e.spec.template_version);
    if (!layer.empty()) cfg.root_layers.push_back(std::move(layer));
  }
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
                    ? config_.templates->mount_session(
                          e.id, e.spec.snapshot, workspaces_.path(e.id), own.uid, own.gid, disk_mb)
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

}  // namespace agentbox::session
