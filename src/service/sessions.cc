#include "service/sessions.h"

#include "common/log.h"
#include "service/blocking.h"

namespace agentbox::service {

using session::Caller;
using session::SessionInfo;
using session::SessionManager;

asio::awaitable<Result<std::pair<SessionInfo, bool>>> Sessions::create(Origin origin,
                                                                      std::string id,
                                                                      session::SessionSpec spec) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [sm, id, spec = std::move(spec), caller = origin.caller] {
    return sm->create_or_get(id, spec, caller);
  });
  auto r = co_await std::move(job);
  // The audit line comes from the manager's kCreated event.
  if (r && r->second) {
    spdlog::info("req={} session {} created ({})", origin.request_id, id,
                 surface_name(origin.surface));
  }
  co_return r;
}

asio::awaitable<Result<SessionInfo>> Sessions::get(Origin origin, std::string id) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [sm, id, caller = origin.caller] { return sm->get(id, caller); });
  co_return co_await std::move(job);
}

asio::awaitable<Result<std::vector<SessionInfo>>> Sessions::list(Origin origin) {
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [sm, caller = origin.caller]() -> Result<std::vector<SessionInfo>> {
    return sm->list(caller);
  });
  co_return co_await std::move(job);
}

asio::awaitable<Result<SessionInfo>> Sessions::suspend(Origin origin, std::string id) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [sm, id, caller = origin.caller] { return sm->suspend(id, caller); });
  auto r = co_await std::move(job);
  if (r) spdlog::info("req={} session {}: suspend", origin.request_id, id);
  co_return r;
}

asio::awaitable<Result<SessionInfo>> Sessions::resume(Origin origin, std::string id) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [sm, id, caller = origin.caller] { return sm->resume(id, caller); });
  auto r = co_await std::move(job);
  if (r) spdlog::info("req={} session {}: resume", origin.request_id, id);
  co_return r;
}

asio::awaitable<Result<SessionInfo>> Sessions::keepalive(Origin origin, std::string id) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  auto job =
      on_pool(d_.pool, [sm, id, caller = origin.caller] { return sm->keepalive(id, caller); });
  co_return co_await std::move(job);
}

asio::awaitable<Result<std::string>> Sessions::destroy(Origin origin, std::string id,
                                                       bool archive) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [sm, id, archive, caller = origin.caller]() -> Result<std::string> {
    if (archive) return sm->destroy_archived(id, caller);
    if (auto st = sm->destroy(id, caller); !st) return std::unexpected(st.error());
    return std::string();
  });
  auto r = co_await std::move(job);
  if (r && archive) {
    spdlog::info("req={} session {} archived to {} and destroyed", origin.request_id, id, *r);
  } else if (r) {
    spdlog::info("req={} session {} destroyed", origin.request_id, id);
  }
  co_return r;
}

asio::awaitable<Result<SessionInfo>> Sessions::restore(Origin origin, std::string id,
                                                       std::string archive) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [sm, id, archive, caller = origin.caller] {
    return sm->restore(id, archive, caller);
  });
  auto r = co_await std::move(job);
  if (r) spdlog::info("req={} session {} restored from {}", origin.request_id, id, archive);
  co_return r;
}

asio::awaitable<Result<SessionInfo>> Sessions::set_network(Origin origin, std::string id,
                                                           session::NetworkSpec network) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [sm, id, network, caller = origin.caller] {
    return sm->set_network(id, network, caller);
  });
  auto r = co_await std::move(job);
  if (!r) co_return r;
  Fields f = {{"mode", network.mode}, {"allow", network.allow}};
  d_.bus->emit("session.network", origin, id, f);
  spdlog::info("req={} session {}: network policy {} ({} entries)", origin.request_id, id,
               network.mode, network.allow.size());
  co_return r;
}

asio::awaitable<Result<SessionManager::MountsAdded>> Sessions::add_mounts(
    Origin origin, std::string id, session::SessionSpec add) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  std::vector<FieldRecord> mounts;
  for (const auto& m : add.mounts) {
    mounts.push_back({{"host_path", m.host_path}, {"mount_path", m.mount_path}, {"mode", m.mode}});
  }
  std::map<std::string, std::string> skills = add.skills;
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [sm, id, add = std::move(add), caller = origin.caller] {
    return sm->add_mounts(id, add, caller);
  });
  auto r = co_await std::move(job);
  if (!r) co_return r;
  const char* applied = r->live ? "live" : "next_start";
  Fields f = {{"mounts", std::move(mounts)}, {"skills", std::move(skills)},
              {"applied", std::string(applied)}};
  d_.bus->emit("session.mounts", origin, id, f);
  spdlog::info("req={} session {}: mounts added ({})", origin.request_id, id, applied);
  co_return r;
}

asio::awaitable<Result<Lease>> Sessions::lease(Origin origin, std::string id,
                                               bool create_if_missing) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  // The common case, a running session, without a hop through the pool and back.
  if (auto box = sm->try_acquire_running(id, origin.caller)) co_return Lease{id, std::move(box)};
  // A session made or resumed here is told by the manager's events (audited from there).
  auto job = on_pool(d_.pool, [sm, id, create_if_missing, caller = origin.caller] {
    return sm->acquire(id, create_if_missing, caller);
  });
  auto box = co_await std::move(job);
  if (!box) co_return std::unexpected(box.error());
  co_return Lease{std::move(id), std::move(*box)};
}

asio::awaitable<std::shared_ptr<sandbox::Sandbox>> Sessions::lease_running(Origin origin,
                                                                           std::string id) {
  if (!session::validate_id(id)) co_return nullptr;
  SessionManager* sm = d_.sessions;
  if (auto box = sm->try_acquire_running(id, origin.caller)) co_return box;
  auto job = on_pool(d_.pool, [sm, id, caller = origin.caller]()
                                  -> Result<std::shared_ptr<sandbox::Sandbox>> {
    return sm->acquire_running(id, caller);
  });
  auto box = co_await std::move(job);
  co_return box ? std::move(*box) : nullptr;
}

}  // namespace agentbox::service
