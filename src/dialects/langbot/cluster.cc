// LangBot's actions in cluster mode (README "Cluster"): one /rpc/ws connection carries actions
// for sessions on any node. Each action is forwarded on its own, once decoded (its placement
// checked and fenced here): a session another node holds has the whole action run there
// (POST /v1/cluster/langbot, signed like every forwarded request), and its reply frame comes
// back as the answer to this connection's seq_id. The lists (box_get_sessions, box_status) are
// the cluster's.

#include <algorithm>
#include <string>

#include "common/log.h"
#include "dialects/langbot/internal.h"
#include "server/internal/blocking.h"
#include "server/internal/forward.h"
#include "service/placement.h"
#include "service/services.h"

namespace agentbox::server::detail::langbot {
namespace {

ThereReply error_reply_of(const LbError& e) {
  ThereReply r;
  r.code = 1;
  r.message = error_message(e);
  return r;
}

// How long the owner may take: a box_exec runs its command meanwhile.
std::chrono::seconds time_for(const Act* a) {
  std::int64_t t = 30;
  if (auto it = a->data.find("timeout_sec"); it != a->data.end() && it->is_number_integer()) {
    t = std::clamp<std::int64_t>(it->get<std::int64_t>(), 0, 24 * 3600);
  }
  return std::chrono::seconds(t + 60);
}

// The action, run on node `advertise`: its reply frame's code, message and data.
asio::awaitable<ThereReply> run_there(Act* a, json context, std::string node,
                                      std::string advertise) {
  json body = {{"action", a->action}, {"data", a->data}, {"context", std::move(context)}};
  Reply r = co_await forward_small(a->ctx, advertise, "POST", "/v1/cluster/langbot", body.dump(),
                                   a->caller, time_for(a));
  ojson f = ojson::parse(r.body, nullptr, false);
  if (r.status != 200 || !f.is_object() || !f.contains("code") || !f["code"].is_number_integer()) {
    std::string why = "HTTP " + std::to_string(r.status);
    auto j = json::parse(r.body, nullptr, false);
    if (j.is_object() && j.contains("error") && j["error"].is_object()) {
      why += ": " + j["error"].value("message", "");
    }
    co_return error_reply_of(
        {"BoxBackendUnavailableError", "node " + node + " did not run " + a->action + ": " + why});
  }
  ThereReply out;
  out.code = f["code"].get<int>();
  out.message = f.value("message", "");
  if (f.contains("data") && f["data"].is_object()) out.data = std::move(f["data"]);
  co_return out;
}

}  // namespace

asio::awaitable<std::optional<ThereReply>> forward_action(Act* a, json context) {
  Context* ctx = a->ctx;
  cluster::Cluster* cl = ctx->opts.cluster.get();
  if (cl == nullptr || !a->place) co_return std::nullopt;
  auto sid = a->data.find("session_id");
  if (sid == a->data.end() || !sid->is_string()) co_return std::nullopt;
  auto physical = physical_id(*a->place, sid->get<std::string>());
  if (!physical) co_return std::nullopt;  // the action itself says what is wrong
  std::optional<cluster::Owner> owner = cl->owner(*physical);
  if (!owner) {
    session::SessionManager* sm = ctx->sessions;
    std::string id = *physical;
    auto job = run_blocking(ctx->pool, [cl, sm, id]() -> Result<std::optional<cluster::Owner>> {
      if (sm->get(id, session::Caller::daemon())) return std::optional<cluster::Owner>();
      return cl->lookup(id);
    });
    auto looked = co_await std::move(job);
    if (looked) owner = std::move(*looked);
  }
  // A session the catalog does not know yet is placed like any new one (the node with the most
  // free capacity) by the actions that make it.
  if (!owner && (a->action == "box_exec" || a->action == "box_create_session")) {
    auto placed = co_await ctx->svc->sessions.place(a->origin(), *physical, "");
    if (!placed) co_return error_reply_of(lb_error(placed.error(), About::kSession));
    owner = std::move(*placed);
  }
  if (!owner || owner->self) co_return std::nullopt;
  if (!owner->up) {
    co_return error_reply_of(
        lb_error(service::elsewhere_error(*physical, *owner), About::kSession));
  }
  co_return co_await run_there(a, std::move(context), owner->node, owner->advertise);
}

asio::awaitable<void> add_peer_results(Act* a, json context, ojson* result) {
  cluster::Cluster* cl = a->ctx->opts.cluster.get();
  const bool sessions = a->action == "box_get_sessions";
  if (cl == nullptr || (!sessions && a->action != "box_status")) co_return;
  for (const cluster::NodeState& n : cl->peers_up()) {
    ThereReply r = co_await run_there(a, context, n.name, n.advertise);
    if (r.code != 0) {
      spdlog::warn("langbot: {} on node {}: {}", a->action, n.name, r.message);
      continue;
    }
    if (sessions && r.data.contains("sessions") && r.data["sessions"].is_array()) {
      for (auto& s : r.data["sessions"]) (*result)["sessions"].push_back(std::move(s));
    }
    if (!sessions && r.data.contains("active_sessions") &&
        r.data["active_sessions"].is_number_unsigned() &&
        (*result)["active_sessions"].is_number_unsigned()) {
      (*result)["active_sessions"] = (*result)["active_sessions"].get<std::uint64_t>() +
                                     r.data["active_sessions"].get<std::uint64_t>();
    }
  }
}

}  // namespace agentbox::server::detail::langbot
