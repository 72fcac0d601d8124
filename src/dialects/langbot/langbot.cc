// LangBot's Box runtime (shared/PROTOCOLS.md part 2, read from langbot-plugin-sdk's own code):
// the action RPC `GET /rpc/ws` and the managed-process relay
// `GET /v1/sessions/{physical_id}/managed-process[/{process_id}]/ws`, so that LangBot uses
// agentboxd as its Box runtime with only `box.runtime.endpoint` changed.
//
// A thin translation: every action is an operation of service/ as the REST routes call it
// (Sessions, Exec, Processes; the processes surface's attach for the relay). What is LangBot's
// own is kept in this folder (internal.h lists its files):
// - auth: X-LangBot-Instance-Id (the first /rpc/ws binds it unless langbot.trusted_instance is
//   set; any other id is 401 "Unauthorized"), X-LangBot-Box-Control-Token against
//   langbot.control_token (a daemon with tokens and no control token refuses /rpc/ws);
// - tenancy: a tenant action's context names a placement; its sessions are agentbox sessions
//   named by LangBot's physical ids, ws-<sha256(instance\0workspace)[:24]>-g<gen>-<logical>,
//   owned by the tenant langbot.tenant; replies carry logical ids. The generation fence: an
//   older generation is refused, a newer one stops the older one's actions and relays and
//   deletes its sessions;
// - the envelope ({seq_id, action, data, context} in, {seq_id, code, message, data,
//   chunk_status} out, dumped as Python's json.dumps does) and the error classes the client maps
//   back from the message prefix (BoxValidationError: ... and the others).
// The skill store, admission grants and __file_chunk are refused with a BoxError naming them.
//
// Threading: everything runs on the io_context thread (actions are coroutines spawned there);
// blocking session work goes to the pool.

#include <boost/asio/co_spawn.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/log_errors.h"
#include "common/validate.h"
#include "dialects/langbot/internal.h"
#include "server/internal/processes.h"
#include "server/internal/surfaces.h"
#include "server/json_codec.h"
#include "server/websocket.h"
#include "service/services.h"

namespace agentbox::server::detail {
namespace langbot {
namespace {

asio::awaitable<LbResult<bool>> fence(Act* a) {
  LangbotState* st = a->st;
  const Placement& p = *a->place;
  if (st->gens.find(p.ns) == st->gens.end()) {
    // First sight of this placement since the daemon started: the fence is what the namespace's
    // sessions say (they outlive a restart; the map does not), so an older placement stays
    // refused after a restart too.
    auto have = co_await list_prefixed(a->ctx, a->origin(), p.ns + "-g");
    std::int64_t newest = -1;
    if (have) {
      for (const auto& s : *have) newest = std::max(newest, generation_of(p.ns, s.id));
    }
    if (newest >= 1) st->gens.emplace(p.ns, newest);  // unless another action set it meanwhile
  }
  auto it = st->gens.find(p.ns);
  if (it != st->gens.end() && p.gen < it->second) {
    co_return lb_fail("PermissionError", "Stale Box placement generation");
  }
  if (it != st->gens.end() && p.gen == it->second) co_return true;
  st->gens[p.ns] = p.gen;
  for (const auto& other : st->actions) {
    if (other->ns == p.ns && other->gen < p.gen) other->stop();
  }
  for (auto& r : st->relays) {
    if (r.ns != p.ns || r.gen >= p.gen) continue;
    if (auto ws = r.ws.lock())
      ws->close(beast::websocket::close_code::policy_error, "stale placement generation");
  }
  std::erase_if(st->relays, [](const LangbotRelay& r) { return r.ws.expired(); });
  auto list = co_await list_prefixed(a->ctx, a->origin(), p.ns + "-g");
  if (list) {
    for (const auto& s : *list) {
      std::int64_t g = generation_of(p.ns, s.id);
      if (g < 0 || g >= p.gen) continue;
      auto st2 = co_await a->ctx->svc->sessions.destroy(a->origin(), s.id, false);
      if (!st2 && st2.error().code != Code::kNotFound) {
        spdlog::warn("langbot: deleting stale session {}: {}", s.id, st2.error().message);
      }
    }
  }
  co_return true;
}

// One connection of /rpc/ws; or one action another node forwarded (its reply to `sink`).
struct RpcConn {
  std::weak_ptr<WsSession> ws;
  std::set<std::shared_ptr<LangbotAction>> actions;
  std::function<void(ojson)> sink;
};

void send_frame(const std::shared_ptr<RpcConn>& rc, const ojson& frame) {
  if (rc->sink) {
    rc->sink(frame);
    return;
  }
  if (auto ws = rc->ws.lock()) ws->send(py_dumps(frame));
}

// `forwarded`: another node sent it (POST /v1/cluster/langbot): run here, never forwarded on.
asio::awaitable<void> run_action(Context* ctx, std::shared_ptr<RpcConn> rc, json seq_id,
                                 std::string action, json data, json context, bool forwarded) {
  LangbotState* st = lb_state(ctx);
  const ActionDef* def = find_action(action);
  auto ctl = std::make_shared<LangbotAction>(co_await asio::this_coro::executor);
  Act a{ctx,    st,  langbot_caller(ctx), std::nullopt, std::move(data),
        action, ctl, st->next_request++};
  LbResult<ojson> result = lb_fail("BoxError", "unset");
  bool registered = false;
  if (def == nullptr) {
    result = lb_fail("ValueError", "Action " + action + " not found");
  } else if (!a.data.is_object()) {
    result = lb_fail("BoxValidationError", "data must be an object");
  } else if (def->tenant && (context.is_null())) {
    result = lb_fail("PermissionError", "Box tenant action requires a trusted Workspace context");
  } else {
    bool go = true;
    // A node that never had LangBot's /rpc/ws binds the instance the first node checked.
    if (forwarded && st->bound.empty() && context.is_object() &&
        context.contains("instance_uuid") && context["instance_uuid"].is_string()) {
      st->bound = context["instance_uuid"].get<std::string>();
      spdlog::info("langbot: instance {} bound (an action forwarded by another node)", st->bound);
    }
    if (!context.is_null()) {
      auto place = decode_context(context, st->bound);
      if (!place) {
        result = std::unexpected(place.error());
        go = false;
      } else if (def->tenant) {
        a.place = std::move(*place);
      }
    }
    if (go && a.place) {
      ctl->ns = a.place->ns;
      ctl->gen = a.place->gen;
      auto fenced = co_await fence(&a);
      if (!fenced) {
        result = std::unexpected(fenced.error());
        go = false;
      }
    }
    // Cluster mode: an action on a session another node holds runs there, as a whole.
    if (go && a.place && !forwarded) {
      if (auto there = co_await forward_action(&a, context)) {
        send_frame(rc, reply_frame(seq_id, there->code, std::move(there->message),
                                   std::move(there->data)));
        co_return;
      }
    }
    if (go) {
      st->actions.insert(ctl);
      rc->actions.insert(ctl);
      registered = true;
      result = co_await def->fn(&a);
      // The lists are the cluster's.
      if (result && a.place && !forwarded) co_await add_peer_results(&a, context, &*result);
    }
  }
  if (registered) {
    st->actions.erase(ctl);
    rc->actions.erase(ctl);
  }
  if (result) {
    send_frame(rc, reply_frame(seq_id, 0, "success", std::move(*result)));
  } else {
    send_frame(rc, reply_frame(seq_id, 1, error_message(result.error()), ojson::object()));
  }
}

// One text frame from LangBot.
void on_frame(Context* ctx, const std::shared_ptr<RpcConn>& rc, std::string data) {
  json m = json::parse(data, nullptr, false);
  if (!m.is_object()) {
    send_frame(rc,
               reply_frame(nullptr, 1,
                           error_message({"BoxValidationError", "a frame must be a JSON object"}),
                           ojson::object()));
    return;
  }
  if (m.contains("code")) return;  // a response: this runtime sends no requests
  json seq_id = m.contains("seq_id") ? m["seq_id"] : json(nullptr);
  if (!seq_id.is_number_integer()) {
    send_frame(rc, reply_frame(seq_id, 1,
                               error_message({"BoxValidationError", "seq_id must be an integer"}),
                               ojson::object()));
    return;
  }
  if (!m.contains("action") || !m["action"].is_string()) {
    send_frame(
        rc, reply_frame(seq_id, 1, error_message({"BoxValidationError", "action must be a string"}),
                        ojson::object()));
    return;
  }
  if (rc->actions.size() >= kMaxInFlight) {
    send_frame(rc, reply_frame(seq_id, 1, "Runtime connection is busy (max 128 concurrent actions)",
                               ojson::object()));
    return;
  }
  json payload = m.contains("data") ? m["data"] : json::object();
  json context = m.contains("context") ? m["context"] : json(nullptr);
  asio::co_spawn(*ctx->ioc,
                 run_action(ctx, rc, std::move(seq_id), m["action"].get<std::string>(),
                            std::move(payload), std::move(context), false),
                 LogErrors{"langbot action"});
}

// GET /rpc/ws
asio::awaitable<bool> rpc_ws(Call* call) {
  Context* ctx = call->ctx;
  Conn* conn = call->conn;
  LangbotState* st = lb_state(ctx);
  std::string instance;
  if (!authenticated(call, &instance) || (!st->bound.empty() && instance != st->bound)) {
    spdlog::warn("langbot: /rpc/ws refused (instance header, control token or binding)");
    co_return co_await send_reply(call, unauthorized());
  }
  auto ws = std::make_shared<WsSession>(std::move(conn->stream), ws_options(ctx->opts));
  log_request(call, 101);
  auto ec = co_await ws->accept(call->hp->release());
  if (ec) co_return false;
  if (st->bound.empty()) {
    st->bound = instance;
    spdlog::info("langbot: instance {} bound", instance);
  } else if (st->bound != instance) {
    // Another instance bound first while this handshake ran: this one is not trusted.
    ws->close(beast::websocket::close_code::policy_error, "Unauthorized");
    co_await ws->run([](std::string, bool) {});
    co_return false;
  }
  auto rc = std::make_shared<RpcConn>();
  rc->ws = ws;
  std::weak_ptr<WsSession> weak = ws;
  conn->on_shutdown = [weak] {
    if (auto s = weak.lock()) s->close(beast::websocket::close_code::going_away, "shutting down");
  };
  auto on_message = [ctx, rc, weak](std::string data, bool binary) {
    if (binary) {
      // As aiohttp's server: TEXT frames only.
      if (auto s = weak.lock())
        s->close(beast::websocket::close_code::unknown_data, "text frames only");
      return;
    }
    on_frame(ctx, rc, std::move(data));
  };
  co_await ws->run(on_message);
  conn->on_shutdown = nullptr;
  for (const auto& a : rc->actions) a->stop();
  co_return false;
}

// ---- the relay

Reply relay_error(std::string cls, std::string message) {
  json j = {{"error", {{"code", std::move(cls)}, {"message", std::move(message)}}}};
  return json_reply(400, j);
}

// A canonical positive integer: "1", "12", never "01", "+1", " 1".
std::optional<std::int64_t> canonical_int(std::string_view s) {
  if (s.empty() || s.size() > 18 || s[0] == '0') return std::nullopt;
  std::int64_t n = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  return n;
}

// GET /v1/sessions/{id}/managed-process[/{process_id}]/ws
asio::awaitable<bool> relay(Call* call) {
  Context* ctx = call->ctx;
  LangbotState* st = lb_state(ctx);
  Request& req = call->ex.req;
  std::string instance;
  const std::string workspace = header(call, "X-LangBot-Workspace-Id");
  auto gen = canonical_int(header(call, "X-LangBot-Placement-Generation"));
  const std::string physical = req.params.at("id");
  auto pit = req.params.find("process_id");
  const std::string process_id = pit == req.params.end() ? std::string("default") : pit->second;
  // SECURITY: the relay never binds an instance; everything short of a placement of the bound
  // instance, current, holding this session is 401.
  bool ok = authenticated(call, &instance) && !st->bound.empty() && instance == st->bound &&
            !workspace.empty() && workspace.size() <= 256 && gen.has_value();
  std::optional<Placement> place;
  if (ok) {
    place = make_placement(instance, workspace, *gen);
    auto g = st->gens.find(place->ns);
    ok = g != st->gens.end() && g->second == *gen && physical.starts_with(place->prefix) &&
         physical.size() > place->prefix.size();
  }
  if (!ok) co_return co_await send_reply(call, unauthorized());
  session::Caller caller = langbot_caller(ctx);
  const service::Origin origin(caller, 0, service::Surface::kLangbot);
  auto lease = co_await ctx->svc->sessions.lease(origin, physical, false);
  if (!lease) {
    LbError e = session_error(lease.error(), physical);
    co_return co_await send_reply(call, relay_error(e.cls, e.text));
  }
  sandbox::ProcessTable* table = lease->box->processes();
  auto info =
      table ? table->get(process_id) : Result<sandbox::ProcessInfo>(fail(Code::kNotFound, ""));
  auto stopped = st->stopped.find(physical + "/" + process_id);
  if (!info || !validate::is_process_tag(process_id) ||
      (stopped != st->stopped.end() && stopped->second == info->pid)) {
    co_return co_await send_reply(
        call, relay_error("BoxManagedProcessNotFoundError",
                          "managed process " + process_id + " not found in session " + physical));
  }
  if (info->state != sandbox::ProcessState::kRunning || !info->stdin_open) {
    co_return co_await send_reply(call,
                                  relay_error("BoxManagedProcessConflictError",
                                              "managed process " + process_id + " is not running"));
  }
  {
    auto probe = table->attach(std::to_string(info->pid));  // released at once
    if (!probe) {
      co_return co_await send_reply(
          call, relay_error("BoxManagedProcessConflictError",
                            "managed process " + process_id + " already has an attacher"));
    }
  }
  AttachHooks hooks;
  {
    // The client offers a comma-separated list; LangBot offers "mcp".
    const std::string offered = header(call, "Sec-WebSocket-Protocol");
    std::size_t start = 0;
    for (;;) {
      std::size_t comma = offered.find(',', start);
      std::string one = py_strip(std::string_view(offered).substr(
          start, comma == std::string::npos ? std::string::npos : comma - start));
      if (one == "mcp") hooks.subprotocol = "mcp";
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  hooks.ignore_binary = true;
  std::string ns = place->ns;
  std::int64_t g = place->gen;
  hooks.opened = [st, ns, g](std::weak_ptr<WsSession> ws) {
    std::erase_if(st->relays, [](const LangbotRelay& r) { return r.ws.expired(); });
    st->relays.push_back({ns, g, std::move(ws)});
  };
  const service::Fields fields = {{"pid", std::int64_t{info->pid}}};
  ctx->svc->bus().emit("process.attach", origin, physical, fields);
  co_return co_await attach_to_process(call, std::move(lease->box), physical, std::move(*info),
                                       std::move(hooks));
}

// POST /v1/cluster/langbot {"action","data","context"}: one action another node's /rpc/ws
// received for a session this node holds; the reply frame it makes, as JSON.
asio::awaitable<Reply> forwarded_action(Context* ctx, Request* req) {
  if (!req->forwarded) {
    co_return error_reply(Error::make(
        Code::kAccess, "POST /v1/cluster/langbot is for the nodes of a cluster, not for clients"));
  }
  auto body = body_object(req);
  if (!body) co_return error_reply(body.error());
  if (!body->contains("action") || !(*body)["action"].is_string()) {
    co_return error_reply(Error::make(Code::kInvalid, "field 'action' must be a string"));
  }
  json data = body->contains("data") ? (*body)["data"] : json::object();
  json context = body->contains("context") ? (*body)["context"] : json(nullptr);
  auto rc = std::make_shared<RpcConn>();
  auto frame = std::make_shared<ojson>();
  rc->sink = [frame](ojson f) { *frame = std::move(f); };
  co_await run_action(ctx, rc, json(0), (*body)["action"].get<std::string>(), std::move(data),
                      std::move(context), true);
  for (const auto& a : rc->actions) a->stop();
  Reply r;
  r.body = frame->dump();
  co_return r;
}

}  // namespace

}  // namespace langbot

std::vector<RouteSpec> langbot_routes() {
  using B = BodyKind;
  using R = RouteId;
  constexpr RouteKind W = RouteKind::kWebSocket;
  // needs_auth false: LangBot authenticates with its own headers (checked here), never a bearer
  // token.
  return {
      {R::kLangbotRpc, "GET", "/rpc/ws", B::kNone, false, langbot::rpc_ws, W},
      {R::kLangbotRelay, "GET", "/v1/sessions/{id}/managed-process/{process_id}/ws", B::kNone,
       false, langbot::relay, W},
      {R::kLangbotRelayLegacy, "GET", "/v1/sessions/{id}/managed-process/ws", B::kNone, false,
       langbot::relay, W},
      // Node to node (cluster mode): the owner's half of a forwarded action. The cluster's
      // routes share kCluster (the transport treats none of them specially).
      {R::kCluster, "POST", "/v1/cluster/langbot", B::kJson, true,
       simple<langbot::forwarded_action>},
  };
}

}  // namespace agentbox::server::detail
