// The runners surface (API.md "Runners"): GET /ws/{user}, where remote runners dial in and speak
// xbot's runner protocol (shared/PROTOCOLS.md part 1), and GET /v1/runners. The requests and
// replies themselves go through the hub (runner_hub.h); the `remote` backend uses them.
//
// The handshake (PROTOCOLS.md 1.2): the first frame must be `register` within 10 s; its token is
// checked against the configured runner users (--runner-token USER=TOKEN, config `runners:`), its
// body.user_id must be set and equal the URL's user. A failure is `{"type":"error","body":
// {"message","code"}}` (AUTH_FAILED, INVALID, FORBIDDEN) and the connection closes. On success:
// `register_ok`, and the daemon's global skills and agents are copied to the runner's
// {workspace}/.skills/<name>/ and {workspace}/.agents/ (in the pool, in the background).
//
// After that every frame goes to the connection (RunnerConn::on_frame, on_binary); a frame that
// is not a JSON object with a string "type", or a binary frame that is not a version 3 chunk on a
// connection of version 3, closes that connection (and fails what was in flight on it), nothing
// else.

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/websocket/rfc6455.hpp>

#include "common/log.h"
#include "remote/runner_hub.h"
#include "remote/skill_sync.h"
#include "server/internal/runner_follow.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "server/websocket.h"
#include "service/services.h"

namespace agentbox::server::detail {

using remote::RunnerConn;
using remote::RunnerHub;
using remote::RunnerIdentity;
namespace proto = runner::proto;
namespace {

namespace websocket = beast::websocket;

// A runner's connection events go to the operation bus as any operation's (the audit log
// writes them), on the account of the runner's tenant.
void runner_event(Context* ctx, std::string_view op, std::string tenant,
                  const service::Fields& fields) {
  const service::Origin origin(session::Caller(std::move(tenant), false, 0), 0,
                               service::Surface::kRunner);
  ctx->svc->bus().emit(op, origin, "", fields);
}
using namespace std::chrono_literals;

constexpr std::chrono::seconds kRegisterWait{10};

WsOptions runner_ws_options(const ServerOptions& o) {
  WsOptions w;
  w.max_message_bytes = o.runner_max_frame_bytes;
  w.ping_interval = o.ws_ping_interval;
  // A request carries at most one frame of a file; room for a few of them.
  w.max_queued_bytes = 2 * o.runner_max_frame_bytes;
  return w;
}

struct RunnerSocket {
  std::shared_ptr<RunnerConn> conn;  // set once registered
  bool refused = false;
};

asio::awaitable<bool> runner_ws(Call* call) {
  Context* ctx = call->ctx;
  Conn* conn = call->conn;
  const std::string url_user = call->ex.req.params["user"];
  std::shared_ptr<RunnerHub> hub = ctx->opts.runners;
  auto ws = std::make_shared<WsSession>(std::move(conn->stream), runner_ws_options(ctx->opts));
  log_request(call, 101);
  auto ec = co_await ws->accept(call->hp->release());
  if (ec) co_return false;
  std::weak_ptr<WsSession> weak = ws;
  conn->on_shutdown = [weak] {
    if (auto s = weak.lock()) s->close(websocket::close_code::going_away, "shutting down");
  };
  auto state = std::make_shared<RunnerSocket>();
  // No register within kRegisterWait: closed.
  auto timer = std::make_shared<asio::steady_timer>(ws->get_executor(), kRegisterWait);
  timer->async_wait([weak, state](const beast::error_code& e) {
    if (e || state->conn) return;
    if (auto s = weak.lock()) s->close(websocket::close_code::policy_error, "no register frame");
  });

  auto refuse = [&](const std::string& message, const std::string& code) {
    state->refused = true;
    ws->send(proto::error_frame("", code, message));
    ws->close(websocket::close_code::policy_error, message);
    runner_event(ctx, "runner.refused", hub ? hub->tenant_of(url_user) : "",
                 {{"user", url_user}, {"reason", message}});
    spdlog::info("runner /ws/{}: refused: {}", url_user, message);
  };

  auto on_message = [&, ctx](std::string data, bool binary) {
    if (state->refused) return;
    if (state->conn) {
      const bool good =
          binary ? state->conn->on_binary(std::move(data)) : state->conn->on_frame(data);
      if (!good) {
        spdlog::warn("runner {}: a frame that is not a protocol message; closing the connection",
                     url_user);
        state->conn->on_closed("it sent a frame that is not a protocol message");
        hub->detach(state->conn.get());
        ws->close(websocket::close_code::protocol_error, "not a protocol message");
      }
      return;
    }
    auto env = proto::decode_flat_or_envelope(data);
    if (binary || !env || env->type != proto::type::kRegister) {
      refuse("the first frame must be a register message", "INVALID");
      return;
    }
    auto reg = proto::body_as<proto::RegisterBody>(*env);
    if (!reg) return refuse(reg.error().message, "INVALID");
    const std::string user = reg->user_id;
    std::optional<remote::RunnerUser> who;
    if (hub) who = hub->authenticate(url_user, reg->auth_token);
    if (!who) return refuse("authentication failed", "AUTH_FAILED");
    if (user.empty()) return refuse("missing user_id", "INVALID");
    if (user != url_user) return refuse("user_id mismatch", "FORBIDDEN");
    RunnerIdentity id;
    id.user = user;
    id.workspace = reg->workspace;
    id.shell = reg->shell;
    // The version in force (docs/runner-protocol.md): the lower of the runner's and ours (3
    // for today's agentbox-runner, 1 or 2 for an older one, 0 for xbot's runner: none).
    id.version = proto::negotiate(reg->version);
    id.enforces = reg->enforces;
    if (id.workspace.empty() || id.workspace[0] != '/') {
      return refuse("workspace must be an absolute path", "INVALID");
    }
    while (id.workspace.size() > 1 && id.workspace.back() == '/') id.workspace.pop_back();
    auto rc = std::make_shared<RunnerConn>(
        hub.get(), id, who->tenant,
        [weak](std::string f, bool binary) {
          if (auto w = weak.lock()) w->send(std::move(f), binary);
        },
        [weak](std::string reason) {
          if (auto w = weak.lock()) w->close(websocket::close_code::going_away, reason);
        });
    state->conn = rc;
    timer->cancel();
    // xbot's answer; a `version` only to a runner that asked for one (docs/runner-protocol.md):
    // 1: big files travel in chunks (remote_backend.cc); 2: also process streams
    // (remote_processes.cc). Otherwise the plain form.
    proto::RegisterOk ok;
    ok.version = id.version;
    ws->send(proto::frame("", proto::type::kRegisterOk, proto::to_json(ok)));
    // No request may reach the runner before register_ok (xbot's runner takes whatever comes
    // first as the answer to its register): the connection is handed out only once register_ok
    // is queued. send() posts from this thread; so does this, so it runs after that enqueue (a
    // post from a pool thread could overtake it).
    asio::post(ws->get_executor(), [ctx, hub, rc, user, id, tenant = who->tenant] {
      if (!rc->open()) return;  // gone already (both run on this thread: no race)
      hub->attach(rc);
      runner_changed(ctx, user, /*registered=*/true);  // the catalog's runners/<user>
      runner_event(ctx, "runner.register", tenant,
                   {{"user", user},
                    {"workspace", id.workspace},
                    {"version", std::int64_t{id.version}},
                    {"enforces", id.enforces}});
      spdlog::info("runner {} registered (workspace {}, version {})", user, id.workspace,
                   id.version);
      const auto& mc = ctx->sessions->config();
      if (!mc.global_skills_dir.empty() || !mc.agents_dir.empty()) {
        asio::post(*ctx->pool, [rc, skills = mc.global_skills_dir, agents = mc.agents_dir] {
          remote::sync_to_runner(rc, skills, agents);
        });
      }
    });
  };
  co_await ws->run(on_message);
  timer->cancel();
  conn->on_shutdown = nullptr;
  if (state->conn) {
    state->conn->on_closed("connection closed");
    hub->detach(state->conn.get());
    runner_changed(ctx, url_user, /*registered=*/false);
    runner_event(ctx, "runner.disconnect", state->conn->tenant(), {{"user", url_user}});
    spdlog::info("runner {} disconnected", url_user);
  }
  co_return false;  // the connection was the WebSocket's
}

asio::awaitable<Reply> list_runners(Context* ctx, Request* req) {
  json out = json::array();
  if (ctx->opts.runners) {
    const std::string tenant = req->caller.admin ? "" : req->caller.tenant;
    for (const RunnerHub::Listed& l : ctx->opts.runners->list(tenant)) {
      json r = json::object();
      r["user"] = l.user;
      r["connected"] = l.connected;
      r["workspace"] = l.identity.workspace.empty() ? json(nullptr) : json(l.identity.workspace);
      r["shell"] = l.identity.shell.empty() ? json(nullptr) : json(l.identity.shell);
      r["version"] = l.identity.version == 0 ? json(nullptr) : json(l.identity.version);
      r["enforces"] = l.identity.enforces;
      bool seen = l.connected_at.time_since_epoch().count() != 0;
      r["connected_at"] = seen ? json(rfc3339(l.connected_at)) : json(nullptr);
      r["last_seen"] = seen ? json(rfc3339(l.last_seen)) : json(nullptr);
      if (req->caller.admin) r["tenant"] = l.tenant;
      out.push_back(std::move(r));
    }
  }
  co_return json_reply(200, json{{"runners", std::move(out)}});
}

}  // namespace

std::vector<RouteSpec> runner_routes() {
  return {
      // Runners authenticate with the token of their register frame, not a bearer token.
      {RouteId::kRunnerWs, "GET", "/ws/{user}", BodyKind::kNone, false, runner_ws,
       RouteKind::kWebSocket},
      {RouteId::kRunnerList, "GET", "/v1/runners", BodyKind::kNone, true, simple<list_runners>},
  };
}

}  // namespace agentbox::server::detail
