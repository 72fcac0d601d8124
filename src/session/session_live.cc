// The session manager: live changes and the daemon's counters (internal/manager.h).

#include "session/internal/manager.h"

namespace agentbox::session {

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
