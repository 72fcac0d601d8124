// Seed 004's workspace care (API.md "Templates, snapshots, health, packages"):
// POST /v1/sessions/{id}/health, /repair and /packages. The operations are service/health.h;
// this file decodes and encodes. (The config's auto_repair on resume is
// service/resume_repair.h: it runs before the resume's first command.)

#include "common/log.h"
#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "sandbox/health_checks.h"
#include "sandbox/installers.h"

namespace agentbox::server::detail {
namespace {

json encode_report(const sandbox::HealthReport& r) {
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

service::Origin v1(const Request& req) { return origin_of(req, service::Surface::kV1); }

asio::awaitable<Reply> health_or_repair(Context* ctx, Request* req, bool repair) {
  auto sid = session_param(*req);
  if (!sid) co_return error_reply(sid.error());
  if (auto st = empty_body(req); !st) co_return error_reply(st.error());
  Result<sandbox::HealthReport> report = fail(Code::kInternal, "health");
  if (repair) {
    report = co_await ctx->svc->health.repair(v1(*req), *sid);
  } else {
    report = co_await ctx->svc->health.check(v1(*req), *sid);
  }
  if (!report) co_return error_reply(report.error());
  co_return json_reply(200, encode_report(*report));
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
  auto r = co_await ctx->svc->health.install(v1(req), id, std::move(*decoded));
  if (!r) co_return error_reply(r.error());
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
