// Cluster mode's /v1 surface (API.md "Cluster"): GET /v1/cluster, the admin's cordons, and the
// parts of POST and GET /v1/sessions that span nodes (internal/cluster_v1.h).

#include <fstream>
#include <string>

#include "common/log.h"
#include "remote/runner_hub.h"
#include "server/internal/blocking.h"
#include "server/internal/cluster_v1.h"
#include "server/internal/forward.h"
#include "server/internal/runner_follow.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "service/services.h"

namespace agentbox::server::detail {

cluster::NodeLoad node_load(session::SessionManager& sm) {
  cluster::NodeLoad l;
  auto live = sm.liveness();
  l.sessions = live.sessions;
  l.running_boxes = live.running;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::uint64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      l.free_memory_mb = kib / 1024;
      break;
    }
  }
  return l;
}

Result<std::string> take_node_field(json* body) {
  auto it = body->find("node");
  if (it == body->end() || it->is_null()) {
    if (it != body->end()) body->erase(it);
    return std::string();
  }
  if (!it->is_string() || it->get<std::string>().empty()) {
    return fail(Code::kInvalid, "field 'node' must be a node name");
  }
  std::string node = it->get<std::string>();
  body->erase(it);
  return node;
}

asio::awaitable<std::optional<Reply>> place_create(Context* ctx, Request* req, std::string id,
                                                   std::string node, std::string body) {
  auto owner = co_await ctx->svc->sessions.place(origin_of(*req, service::Surface::kV1), id,
                                                 std::move(node));
  if (!owner) co_return error_reply(owner.error());
  if (owner->self) co_return std::nullopt;
  co_return co_await forward_small(ctx, owner->advertise, "POST", "/v1/sessions", std::move(body),
                                   req->caller);
}

asio::awaitable<std::string> runner_node(Context* ctx, Request* req, std::string user) {
  cluster::Cluster* cl = ctx->opts.cluster.get();
  if (user.empty() || cl == nullptr || !ctx->opts.runners) co_return std::string();
  if (auto conn = ctx->opts.runners->find(user); conn && conn->open()) co_return cl->node();
  // The catalog's record, written by the node that holds the connection (runner_follow.cc).
  if (auto rec = cl->record("runners", user)) {
    const std::string named = runner_record_node(*rec);
    for (const cluster::NodeState& n : cl->peers_up()) {
      if (n.name == named) co_return named;
    }
  }
  // No record (yet): it is written a moment after the registration and reaches this node's
  // cache by the watch, so a create right after a runner registered elsewhere asks the peers.
  for (const cluster::NodeState& n : cl->peers_up()) {
    Reply r = co_await forward_small(ctx, n.advertise, "GET", "/v1/runners", "", req->caller);
    auto j = json::parse(r.body, nullptr, false);
    if (r.status != 200 || !j.is_object() || !j.contains("runners") || !j["runners"].is_array()) {
      continue;
    }
    for (const auto& x : j["runners"]) {
      if (x.is_object() && x.value("user", "") == user && x.value("connected", false)) {
        co_return n.name;
      }
    }
  }
  co_return std::string();
}

asio::awaitable<void> add_peer_sessions(Context* ctx, Request* req, json* arr) {
  for (const cluster::NodeState& n : ctx->opts.cluster->peers_up()) {
    Reply r = co_await forward_small(ctx, n.advertise, "GET", "/v1/sessions", "", req->caller);
    auto j = json::parse(r.body, nullptr, false);
    if (r.status != 200 || !j.is_object() || !j.contains("sessions") || !j["sessions"].is_array()) {
      spdlog::warn("req={} GET /v1/sessions: node {} did not answer its list (HTTP {})", req->id,
                   n.name, r.status);
      continue;
    }
    for (auto& s : j["sessions"]) arr->push_back(std::move(s));
  }
}

namespace {

std::string rfc3339_unix(std::int64_t sec) {
  return rfc3339(std::chrono::system_clock::time_point(std::chrono::seconds(sec)));
}

json node_json(const cluster::NodeState& n) {
  return {{"name", n.name},
          {"advertise", n.advertise.empty() ? json(nullptr) : json(n.advertise)},
          {"state", n.state()},
          {"version", n.version},
          {"config_digest", n.config_digest},
          {"sessions", n.load.sessions},
          {"running_boxes", n.load.running_boxes},
          {"free_memory_mb", n.load.free_memory_mb},
          {"last_seen", n.last_seen > 0 ? json(rfc3339_unix(n.last_seen)) : json(nullptr)}};
}

asio::awaitable<Reply> get_cluster(Context* ctx, Request*) {
  cluster::Cluster* cl = ctx->opts.cluster.get();
  if (cl == nullptr) {
    cluster::NodeState self;
    self.name = node_name();
    self.version = cluster::kNodeVersion;
    self.config_digest = ctx->opts.config_digest;
    self.up = true;
    self.last_seen = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    session::SessionManager* sm = ctx->sessions;
    self.load = node_load(*sm);
    co_return json_reply(
        200, {{"mode", "single"}, {"node", self.name}, {"nodes", json::array({node_json(self)})}});
  }
  json nodes = json::array();
  for (const auto& n : cl->nodes()) nodes.push_back(node_json(n));
  co_return json_reply(
      200, {{"mode", "etcd"},
            {"node", cl->node()},
            {"etcd", {{"endpoints", cl->options().etcd}, {"healthy", cl->etcd_healthy()}}},
            {"nodes", std::move(nodes)}});
}

asio::awaitable<Reply> cordon(Context* ctx, Request* req, bool on) {
  if (!req->caller.admin) {
    co_return error_reply(Error::make(Code::kAccess, "cordoning a node needs an admin token"));
  }
  if (auto st = empty_body(req); !st) co_return error_reply(st.error());
  cluster::Cluster* cl = ctx->opts.cluster.get();
  if (cl == nullptr) {
    co_return error_reply(
        Error::make(Code::kInvalid, "this daemon is not in a cluster (no cluster: configuration)"));
  }
  std::string name = req->params["name"];
  auto job = run_blocking(ctx->pool, [cl, name, on] { return cl->set_cordon(name, on); });
  auto st = co_await std::move(job);
  if (!st) co_return error_reply(st.error());
  const service::Fields fields = {{"node", name}};
  ctx->svc->bus().emit(on ? "cluster.cordon" : "cluster.uncordon",
                       service::Origin(req->caller, req->id, service::Surface::kV1), "", fields);
  for (const auto& n : cl->nodes()) {
    if (n.name == name) {
      json j = node_json(n);
      j["state"] = on ? "cordoned" : (n.up ? "up" : "down");
      co_return json_reply(200, j);
    }
  }
  co_return json_reply(200, {{"name", name}, {"state", on ? "cordoned" : "up"}});
}

asio::awaitable<Reply> cordon_on(Context* ctx, Request* req) {
  co_return co_await cordon(ctx, req, true);
}
asio::awaitable<Reply> cordon_off(Context* ctx, Request* req) {
  co_return co_await cordon(ctx, req, false);
}

}  // namespace

std::vector<RouteSpec> cluster_routes() {
  using B = BodyKind;
  using R = RouteId;
  return {
      {R::kCluster, "GET", "/v1/cluster", B::kNone, true, simple<get_cluster>},
      {R::kClusterCordon, "POST", "/v1/cluster/nodes/{name}/cordon", B::kJson, true,
       simple<cordon_on>},
      {R::kClusterUncordon, "POST", "/v1/cluster/nodes/{name}/uncordon", B::kJson, true,
       simple<cordon_off>},
      // The cluster's other routes share kCluster (the transport treats none of them specially).
      {R::kCluster, "POST", "/v1/sessions/{id}/move", B::kJson, true, simple<move_session>},
      {R::kCluster, "POST", "/v1/cluster/sessions/{id}/receive", B::kRaw, true, receive_session},
      {R::kCluster, "POST", "/v1/cluster/sessions/{id}/adopt", B::kJson, true,
       simple<adopt_session>},
  };
}

}  // namespace agentbox::server::detail
