#include "service/sessions.h"

#include "common/log.h"
#include "service/blocking.h"
#include "service/placement.h"
#include "service/template_sync.h"

namespace agentbox::service {

using session::Caller;
using session::SessionInfo;
using session::SessionManager;

asio::awaitable<Result<std::pair<SessionInfo, bool>>> Sessions::create(Origin origin,
                                                                       std::string id,
                                                                       session::SessionSpec spec) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  // Cluster mode: the template's version built here first (the create waits for it). When it
  // cannot be, a catalog entry another node made for this node goes (as for any failed create).
  if (auto st = co_await template_ready(d_, spec.template_name); !st) {
    auto job = on_pool(d_.pool, [sm, cl = d_.cluster, id, st]() -> Status {
      return forget_on_failure(cl, sm, id, st);
    });
    co_return std::unexpected((co_await std::move(job)).error());
  }
  auto job = on_pool(d_.pool,
                     [sm, cl = d_.cluster, id, spec = std::move(spec),
                      caller = origin.caller]() -> Result<std::pair<SessionInfo, bool>> {
                       if (auto st = claim_here(cl, sm, id, caller); !st)
                         return std::unexpected(st.error());
                       return forget_on_failure(cl, sm, id, sm->create_or_get(id, spec, caller));
                     });
  auto r = co_await std::move(job);
  // The audit line comes from the manager's kCreated event.
  if (r && r->second) {
    spdlog::info("req={} session {} created ({})", origin.request_id, id,
                 surface_name(origin.surface));
  }
  co_return r;
}

asio::awaitable<Result<std::pair<SessionInfo, bool>>> Sessions::adopt(Origin origin, std::string id,
                                                                      session::SessionSpec spec) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool,
                     [sm, id, spec = std::move(spec),
                      tenant = origin.caller.tenant]() -> Result<std::pair<SessionInfo, bool>> {
                       if (auto had = sm->get(id, Caller::daemon())) {
                         if (had->backend != "remote" || had->tenant != tenant ||
                             had->spec.runner != spec.runner) {
                           return fail(Code::kExists, "session id " + id +
                                                          " is already in use on this node (not "
                                                          "a remote session of runner " +
                                                          spec.runner + ")");
                         }
                         return std::pair{std::move(*had), false};
                       }
                       return sm->create_or_get(id, spec, Caller(tenant, false, 0));
                     });
  auto r = co_await std::move(job);
  if (r && r->second) {
    spdlog::info("req={} session {} adopted (runner {})", origin.request_id, id,
                 r->first.spec.runner);
  }
  co_return r;
}

asio::awaitable<Result<SessionInfo>> Sessions::get(Origin origin, std::string id) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [sm, id, caller = origin.caller]() -> Result<SessionInfo> {
    auto r = sm->get(id, caller);
    if (!r) return std::unexpected(unless_moving_here(sm, id, r.error()));
    return r;
  });
  co_return co_await std::move(job);
}

asio::awaitable<Result<SessionManager::Usage>> Sessions::usage(Origin origin, std::string id) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [sm, id, caller = origin.caller] { return sm->usage(id, caller); });
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

namespace {

std::map<std::string, std::uint64_t> limits_fields(const sandbox::Limits& l) {
  std::map<std::string, std::uint64_t> out;
  for (auto& [name, value] : sandbox::set_limits(l)) out.emplace(std::move(name), value);
  return out;
}

}  // namespace

asio::awaitable<Status> Sessions::ensure(Origin origin, std::string id, session::SessionSpec spec,
                                         std::string limits_field) {
  if (auto st = session::validate_id(id); !st) co_return st;
  if (auto st = co_await template_ready(d_, spec.template_name); !st) co_return st;
  SessionManager* sm = d_.sessions;
  auto job =
      on_pool(d_.pool, [sm, cl = d_.cluster, id, spec, caller = origin.caller]() -> Result<bool> {
        if (sm->get(id, caller)) return false;
        if (auto st = claim_here(cl, sm, id, caller); !st) return std::unexpected(st.error());
        auto r = forget_on_failure(cl, sm, id, sm->create_or_get(id, spec, caller));
        if (!r) return std::unexpected(r.error());
        return true;
      });
  auto made = co_await std::move(job);
  if (!made) co_return std::unexpected(made.error());
  if (*made || spec.limits == sandbox::Limits{}) co_return Status{};
  SessionManager::Update u;
  u.limits = spec.limits;
  u.limits_field = std::move(limits_field);
  auto r = co_await update(std::move(origin), std::move(id), std::move(u));
  if (!r) co_return std::unexpected(r.error());
  co_return Status{};
}

asio::awaitable<Result<SessionInfo>> Sessions::update(Origin origin, std::string id,
                                                      SessionManager::Update update) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  Fields f;
  if (update.limits) f.emplace_back("limits", limits_fields(*update.limits));
  if (update.ttl_sec) f.emplace_back("ttl_sec", std::int64_t{*update.ttl_sec});
  if (update.labels) f.emplace_back("labels", *update.labels);
  SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [sm, id, upd = std::move(update), caller = origin.caller] {
    return sm->update(id, upd, caller);
  });
  auto r = co_await std::move(job);
  if (!r) co_return r;
  d_.bus->emit("session.update", origin, id, f);
  spdlog::info("req={} session {}: updated", origin.request_id, id);
  co_return r;
}

asio::awaitable<Result<SessionInfo>> Sessions::set_ttl(Origin origin, std::string id,
                                                       std::int64_t ttl_sec) {
  SessionManager::Update u;
  u.ttl_sec = ttl_sec;
  co_return co_await update(std::move(origin), std::move(id), std::move(u));
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
  Fields f = {{"mounts", std::move(mounts)},
              {"skills", std::move(skills)},
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
  auto job =
      on_pool(d_.pool,
              [sm, cl = d_.cluster, id, create_if_missing,
               caller = origin.caller]() -> Result<std::shared_ptr<sandbox::Sandbox>> {
                if (create_if_missing) {
                  if (auto st = claim_here(cl, sm, id, caller); !st)
                    return std::unexpected(st.error());
                  return forget_on_failure(cl, sm, id, sm->acquire(id, create_if_missing, caller));
                }
                auto r = sm->acquire(id, create_if_missing, caller);
                if (!r) return std::unexpected(unless_moving_here(sm, id, r.error()));
                return r;
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
  auto job = on_pool(
      d_.pool, [sm, id, caller = origin.caller]() -> Result<std::shared_ptr<sandbox::Sandbox>> {
        return sm->acquire_running(id, caller);
      });
  auto box = co_await std::move(job);
  co_return box ? std::move(*box) : nullptr;
}

}  // namespace agentbox::service
