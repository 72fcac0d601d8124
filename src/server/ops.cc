// The ops surface: /healthz (no auth), /readyz, /metrics.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "server/http_error.h"
#include "server/metrics.h"
#include "remote/runner_hub.h"
#include "server/internal/blocking.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {
namespace {

using session::Caller;
using session::SessionInfo;
using session::SessionManager;
using ojson = nlohmann::ordered_json;

// LangBot's liveness shape (PROTOCOLS.md 2.1; seed 001 reads only the 200). Answered on the
// network thread without waiting on anything, so it stays a liveness probe under load.
asio::awaitable<Reply> healthz(Context* ctx, Request*) {
  const SessionManager::Liveness l = ctx->sessions->liveness();
  co_return json_reply(200, {{"live", true},
                             {"resources",
                              {{"sessions", l.sessions},
                               {"running_sessions", l.running},
                               {"managed_processes", l.managed_processes}}}});
}

asio::awaitable<Reply> readyz(Context* ctx, Request*) {
  std::shared_ptr<sandbox::Backend> backend = ctx->default_backend;
  auto job14 = run_blocking(ctx->pool, [backend]() -> Status {
    if (!backend) return fail(Code::kUnavailable, "no default backend");
    return backend->check_usable();
  });
  auto st = co_await std::move(job14);
  if (!st) {
    co_return error_reply(
        Error::make(Code::kUnavailable, "backend " + std::string(backend ? backend->name() : "?") +
                                            " is not usable: " + st.error().message));
  }
  // The backends a session may ask for that can run here, and what is (not) built.
  SessionManager* sm = ctx->sessions;
  auto usable_job = run_blocking(ctx->pool, [sm]() -> Result<json> {
    json usable = json::array();
    for (const auto& [name, b] : sm->config().backends) {
      if (b && b->check_usable()) usable.push_back(name);
    }
    return usable;
  });
  auto usable = co_await std::move(usable_job);
  if (!usable) co_return error_reply(usable.error());
  co_return json_reply(200, {{"ready", true},
                             {"backend", backend->name()},
                             {"backends", std::move(*usable)},
                             {"features", features_json()}});
}

asio::awaitable<Reply> metrics(Context* ctx, Request*) {
  SessionManager* sm = ctx->sessions;
  auto job15 = run_blocking(ctx->pool, [sm]() -> Result<std::map<std::string, std::size_t>> {
    return sm->count_by_state();
  });
  auto counts = co_await std::move(job15);
  using Egress = std::map<std::string, net::ProxyCounters>;
  auto job16 = run_blocking(ctx->pool, [sm]() -> Result<Egress> { return sm->egress_counters(); });
  auto egress = co_await std::move(job16);
  Reply r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  RunnerCounters rc;
  if (ctx->opts.runners) {
    remote::RunnerStats s = ctx->opts.runners->stats();
    rc = {s.connections, s.requests, s.failed, s.bytes_out, s.bytes_in};
  }
  r.body = ctx->metrics.render(counts ? *counts : std::map<std::string, std::size_t>{},
                               egress ? *egress : Egress{}, rc);
  co_return r;
}

}  // namespace

std::vector<RouteSpec> ops_routes() {
  using B = BodyKind;
  using R = RouteId;
  return {
      {R::kHealthz, "GET", "/healthz", B::kNone, false, simple<healthz>},
      {R::kReadyz, "GET", "/readyz", B::kNone, true, simple<readyz>},
      {R::kMetrics, "GET", "/metrics", B::kNone, true, simple<metrics>},
  };
}

}  // namespace agentbox::server::detail
