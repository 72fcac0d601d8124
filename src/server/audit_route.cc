// GET /v1/audit (README "Dashboard", the Operations page): the newest lines of the audit log
// (audit.h), as objects, filtered by event prefix, session and tenant. A tenant sees only its
// own lines; an admin sees every tenant's. Reads the tail of the current file only (the
// rotated files stay on disk for the operator).

#include <algorithm>

#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {
namespace {

constexpr std::size_t kTailBytes = 4u << 20;  // how much of the file one request reads
constexpr long kMaxLimit = 1000;

asio::awaitable<Reply> audit_lines(Context* ctx, Request* req) {
  for (const auto& [k, v] : req->query) {
    if (k != "limit" && k != "event" && k != "session" && k != "tenant") {
      co_return error_reply(Error::make(Code::kInvalid, "unknown query parameter '" + k + "'"));
    }
  }
  long limit = 200;
  if (auto it = req->query.find("limit"); it != req->query.end()) {
    char* end = nullptr;
    limit = std::strtol(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end != '\0' || limit < 1 || limit > kMaxLimit) {
      co_return error_reply(Error::make(
          Code::kInvalid,
          "query parameter 'limit' must be an integer from 1 to " + std::to_string(kMaxLimit)));
    }
  }
  std::shared_ptr<AuditLog> log = ctx->opts.audit;
  if (!log) {
    co_return error_reply(Error::make(Code::kNotSupported, "this daemon keeps no audit log"));
  }
  auto job = run_blocking(ctx->pool, [log] { return log->tail(kTailBytes); });
  auto lines = co_await std::move(job);
  if (!lines) co_return error_reply(lines.error());
  auto q = [&](const char* k) {
    auto it = req->query.find(k);
    return it == req->query.end() ? std::string() : it->second;
  };
  const std::string event = q("event"), session = q("session"), tenant = q("tenant");
  const session::Caller& caller = req->caller;
  json out = json::array();
  for (auto it = lines->rbegin(); it != lines->rend() && out.size() < std::size_t(limit); ++it) {
    json j = json::parse(*it, nullptr, false);
    if (!j.is_object()) continue;
    const std::string t = j.value("tenant", "");
    // SECURITY: a tenant's view of the log is its own lines only.
    if (!caller.admin && t != caller.tenant) continue;
    if (!tenant.empty() && t != tenant) continue;
    if (!session.empty() && j.value("session", "") != session) continue;
    if (!event.empty() && j.value("event", "").rfind(event, 0) != 0) continue;
    out.push_back(std::move(j));
  }
  std::reverse(out.begin(), out.end());
  co_return json_reply(200, {{"lines", std::move(out)}});
}

}  // namespace

std::vector<RouteSpec> audit_routes() {
  return {{RouteId::kAudit, "GET", "/v1/audit", BodyKind::kNone, true, simple<audit_lines>}};
}

}  // namespace agentbox::server::detail
