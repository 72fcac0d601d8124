// The session manager: suspend, resume, keepalive, the reaper, managed processes' specs
// (internal/manager.h).

#include "session/internal/manager.h"

namespace agentbox::session {

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

}  // namespace agentbox::session
