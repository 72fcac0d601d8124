// Seed 004's workspace care (API.md "Templates, snapshots, health, packages"):
// POST /v1/sessions/{id}/health, /repair and /packages. (The config's auto_repair on resume is
// session/resume_repair.h: it runs before the resume's first command.)
// The work itself is workspace/health.h and workspace/installers.h; it runs on the worker pool
// (its file calls block; its box commands are awaited there).

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/log.h"
#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "workspace/health.h"
#include "workspace/installers.h"

namespace agentbox::server::detail {
namespace {

using session::Caller;
using session::SessionManager;
using ojson = nlohmann::ordered_json;

json encode_report(const workspace::HealthReport& r) {
  json checks = json::array();
  for (const auto& c : r.checks) {
    json j = {{"name", c.name}, {"ok", c.ok}, {"detail", c.detail}};
    if (c.repair_attempted) {
      j["repaired"] = c.ok;
      j["repair_detail"] = c.repair_detail;
    }
    checks.push_back(std::move(j));
  }
  return {{"healthy", r.healthy}, {"checks", std::move(checks)}};
}

// The session's box (resumed if suspended) and its template's checks.
asio::awaitable<Result<workspace::HealthTarget>> health_target(Context* ctx, const std::string& id,
                                                               Caller caller) {
  SessionManager* sm = ctx->sessions;
  auto job = run_blocking(ctx->pool, [sm, id, caller] { return sm->get(id, caller); });
  auto info = co_await std::move(job);
  if (!info) co_return std::unexpected(info.error());
  workspace::HealthTarget t;
  auto sb = co_await acquire_sandbox(ctx, id, false, caller);
  if (sb) {
    t.box = std::move(*sb);
  } else if (sb.error().code == Code::kNotFound) {
    co_return std::unexpected(sb.error());  // destroyed meanwhile
  } else {
    t.box_error = sb.error().message;
  }
  t.template_checks = template_health_checks(ctx, *info);
  t.configured = !info->spec.template_name.empty();
  co_return t;
}

// Runs `work` on the worker pool (its file calls block) and awaits it.
template <typename T>
asio::awaitable<T> on_pool(Context* ctx, asio::awaitable<T> work) {
  co_return co_await asio::co_spawn(ctx->pool->get_executor(), std::move(work),
                                    asio::use_awaitable);
}

asio::awaitable<Reply> health_or_repair(Context* ctx, Request* req, bool repair) {
  auto sid = session_param(*req);
  if (!sid) co_return error_reply(sid.error());
  std::string id = *sid;
  if (auto st = empty_body(req); !st) co_return error_reply(st.error());
  auto target = co_await health_target(ctx, id, req->caller);
  if (!target) co_return error_reply(target.error());
  workspace::HealthReport report;
  if (repair) {
    auto work = workspace::repair_health(*target);
    report = co_await on_pool(ctx, std::move(work));
    ojson fields = {{"healthy", report.healthy}};
    audit(ctx, "session.repair", req->caller, id, fields);
    spdlog::info("req={} session {}: repair: {}", req->id, id,
                 report.healthy ? "healthy" : "still unhealthy");
  } else {
    auto work = workspace::check_health(*target);
    report = co_await on_pool(ctx, std::move(work));
  }
  co_return json_reply(200, encode_report(report));
}

asio::awaitable<Reply> session_health(Context* ctx, Request* req) {
  co_return co_await health_or_repair(ctx, req, false);
}

asio::awaitable<Reply> session_repair(Context* ctx, Request* req) {
  co_return co_await health_or_repair(ctx, req, true);
}

// POST /v1/sessions/{id}/packages: installs in the session's box (under its network policy: the
// box's own egress), recording them in the manifest with persist.
asio::awaitable<Reply> install_packages(Context* ctx, Request* rq) {
  Request& req = *rq;
  auto sid = session_param(req);
  if (!sid) co_return error_reply(sid.error());
  std::string id = *sid;
  auto body = body_object(&req);
  if (!body) co_return error_reply(body.error());
  auto decoded = decode_install(*body);
  if (!decoded) co_return error_reply(decoded.error());
  auto sb = co_await acquire_sandbox(ctx, id, false, req.caller);
  if (!sb) co_return error_reply(sb.error());
  std::shared_ptr<sandbox::Sandbox> box = std::move(*sb);
  workspace::InstallRequest ireq = std::move(*decoded);
  const std::string manager(workspace::manager_name(ireq.manager));
  const std::vector<std::string> packages = ireq.packages;
  const bool persist = ireq.persist;
  auto work = workspace::install_packages(*box, std::move(ireq));
  auto r = co_await on_pool(ctx, std::move(work));
  if (!r) co_return error_reply(r.error());
  ojson fields = {{"manager", manager}, {"packages", packages}, {"persist", persist},
                  {"exit_code", r->exit_code}, {"recorded", r->recorded}};
  audit(ctx, "session.packages", req.caller, id, fields);
  spdlog::info("req={} session {}: {} install of {} package(s): exit {}", req.id, id, manager,
               packages.size(), r->exit_code);
  json out = {{"exit_code", r->exit_code},     {"stdout", std::move(r->stdout_data)},
              {"stderr", std::move(r->stderr_data)}, {"recorded", r->recorded},
              {"timed_out", r->timed_out}};
  if (!r->error.empty()) out["error"] = r->error;
  co_return json_reply(200, out);
}

}  // namespace

std::vector<RouteSpec> health_routes() {
  using B = BodyKind;
  using R = RouteId;
  return {
      {R::kSessionHealth, "POST", "/v1/sessions/{id}/health", B::kJson, true,
       simple<session_health>},
      {R::kSessionRepair, "POST", "/v1/sessions/{id}/repair", B::kJson, true,
       simple<session_repair>},
      {R::kSessionPackages, "POST", "/v1/sessions/{id}/packages", B::kJson, true,
       simple<install_packages>},
  };
}

}  // namespace agentbox::server::detail
