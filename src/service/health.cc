#include "service/health.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/log.h"
#include "service/blocking.h"
#include "service/resume_repair.h"
#include "service/sessions.h"

namespace agentbox::service {
namespace {

// Runs `work` on the worker pool (its file calls block) and awaits it.
template <typename T>
asio::awaitable<T> pooled(asio::thread_pool* pool, asio::awaitable<T> work) {
  co_return co_await asio::co_spawn(pool->get_executor(), std::move(work), asio::use_awaitable);
}

}  // namespace

// The session's box (resumed if suspended) and its template's checks.
asio::awaitable<Result<sandbox::HealthTarget>> Health::target(const Origin& origin,
                                                              std::string id) {
  Sessions sessions(d_);
  auto info = co_await sessions.get(origin, id);
  if (!info) co_return std::unexpected(info.error());
  sandbox::HealthTarget t;
  auto lease = co_await sessions.lease(origin, id, /*create_if_missing=*/false);
  if (lease) {
    t.box = std::move(lease->box);
  } else if (lease.error().code == Code::kNotFound) {
    co_return std::unexpected(lease.error());  // destroyed meanwhile
  } else {
    t.box_error = lease.error().message;
  }
  auto checks_job = on_pool(
      d_.pool, [tm = templates_.get(), i = *info]() -> Result<std::vector<sandbox::HealthCheck>> {
        return template_health_checks(tm, i);
      });
  auto checks = co_await std::move(checks_job);
  if (checks) t.template_checks = std::move(*checks);
  t.configured = !info->spec.template_name.empty();
  co_return t;
}

asio::awaitable<Result<sandbox::HealthReport>> Health::check(Origin origin, std::string id) {
  auto t = co_await target(origin, std::move(id));
  if (!t) co_return std::unexpected(t.error());
  auto work = sandbox::check_health(*t);
  co_return co_await pooled(d_.pool, std::move(work));
}

asio::awaitable<Result<sandbox::HealthReport>> Health::repair(Origin origin, std::string id) {
  auto t = co_await target(origin, id);
  if (!t) co_return std::unexpected(t.error());
  auto work = sandbox::repair_health(*t);
  sandbox::HealthReport report = co_await pooled(d_.pool, std::move(work));
  Fields f = {{"healthy", report.healthy}};
  d_.bus->emit("session.repair", origin, id, f);
  spdlog::info("req={} session {}: repair: {}", origin.request_id, id,
               report.healthy ? "healthy" : "still unhealthy");
  co_return report;
}

asio::awaitable<Result<sandbox::InstallResult>> Health::install(Origin origin, std::string id,
                                                                sandbox::InstallRequest req) {
  Sessions sessions(d_);
  auto lease = co_await sessions.lease(origin, id, /*create_if_missing=*/false);
  if (!lease) co_return std::unexpected(lease.error());
  const std::string manager(sandbox::manager_name(req.manager));
  const std::vector<std::string> packages = req.packages;
  const bool persist = req.persist;
  std::shared_ptr<sandbox::Sandbox> box = lease->box;
  auto work = sandbox::install_packages(*box, std::move(req));
  auto r = co_await pooled(d_.pool, std::move(work));
  if (!r) co_return r;
  Fields f = {{"manager", manager},
              {"packages", packages},
              {"persist", persist},
              {"exit_code", std::int64_t{r->exit_code}},
              {"recorded", r->recorded}};
  d_.bus->emit("session.packages", origin, id, f);
  spdlog::info("req={} session {}: {} install of {} package(s): exit {}", origin.request_id, id,
               manager, packages.size(), r->exit_code);
  co_return r;
}

}  // namespace agentbox::service
