// The v1 sessions surface: /v1/sessions and the lifecycle steps of one session.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/cluster_v1.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {
namespace {

using session::SessionInfo;

Reply session_reply(int status, const SessionInfo& s) {
  return json_reply(status, encode_session(s));
}

service::Origin v1(const Request& req) {
  return origin_of(req, service::Surface::kV1);
}

asio::awaitable<Reply> create_session(Context* ctx, Request* rq) {
  Request& req = *rq;
  auto body = body_object(&req);
  if (!body) co_return error_reply(body.error());
  // The tenant's default scope, else the daemon's (seed 002 presets).
  std::string default_scope = ctx->opts.default_scope;
  for (const TenantConfig& t : ctx->opts.tenants) {
    if (t.name == req.caller.tenant && !t.default_scope.empty()) default_scope = t.default_scope;
  }
  // Cluster mode: "node" is honoured, and a new id placed on another node is made there.
  std::string node;
  if (ctx->opts.cluster) {
    auto n = take_node_field(&*body);
    if (!n) co_return error_reply(n.error());
    node = std::move(*n);
  }
  auto decoded = decode_create_session(*body, default_scope);
  if (!decoded) co_return error_reply(decoded.error());
  if (ctx->opts.cluster && !req.forwarded) {
    if (node.empty() && decoded->spec.backend == "remote") {
      node = co_await runner_node(ctx, rq, decoded->spec.runner);
    }
    if (auto fwd = co_await place_create(ctx, rq, decoded->id, node, body->dump())) {
      co_return std::move(*fwd);
    }
  }
  auto r =
      co_await ctx->svc->sessions.create(v1(req), std::move(decoded->id), std::move(decoded->spec));
  if (!r) co_return error_reply(r.error());
  co_return session_reply(r->second ? 201 : 200, r->first);
}

// ?limit=N (1..1000): at most N sessions; absent: all of them.
Result<std::size_t> limit_query(const Request& req) {
  auto it = req.query.find("limit");
  if (it == req.query.end()) return std::size_t{0};
  const std::string& v = it->second;
  std::size_t n = 0;
  bool ok = !v.empty() && v.size() <= 4;
  for (char c : v) {
    if (c < '0' || c > '9') ok = false;
    if (ok) n = n * 10 + static_cast<std::size_t>(c - '0');
  }
  if (!ok || n < 1 || n > 1000) {
    return fail(Code::kInvalid, "query parameter 'limit' must be 1 to 1000");
  }
  return n;
}

// GET /v1/sessions[?limit=N][&after=ID]: the caller's sessions sorted by id; a page is the
// first `limit` whose id sorts after `after`, and "next" is the id to pass as `after` for the
// following page (null on the last one).
asio::awaitable<Reply> list_sessions(Context* ctx, Request* req) {
  auto limit = limit_query(*req);
  if (!limit) co_return error_reply(limit.error());
  auto after_it = req->query.find("after");
  const std::string after = after_it == req->query.end() ? "" : after_it->second;
  auto list = co_await ctx->svc->sessions.list(v1(*req));
  if (!list) co_return error_reply(list.error());
  json all = json::array();
  for (const auto& s : *list) all.push_back(encode_session(s));
  // Cluster mode: the whole cluster's sessions (each node's own, asked of it).
  if (ctx->opts.cluster && !req->forwarded) co_await add_peer_sessions(ctx, req, &all);
  std::sort(all.begin(), all.end(), [](const json& x, const json& y) {
    return x["id"].get<std::string>() < y["id"].get<std::string>();
  });
  json arr = json::array();
  json next = nullptr;
  for (auto& s : all) {
    if (!after.empty() && s["id"].get<std::string>() <= after) continue;
    if (*limit != 0 && arr.size() == *limit) {
      next = arr.back()["id"];
      break;
    }
    arr.push_back(std::move(s));
  }
  co_return json_reply(200, {{"sessions", std::move(arr)}, {"next", std::move(next)}});
}

asio::awaitable<Reply> delete_session(Context* ctx, Request* rq) {
  Request& req = *rq;
  auto sid = session_param(req);
  if (!sid) co_return error_reply(sid.error());
  std::string id = *sid;
  auto archive = bool_query(req, "archive");
  if (!archive) co_return error_reply(archive.error());
  auto path = co_await ctx->svc->sessions.destroy(v1(req), id, *archive);
  if (!path) co_return error_reply(path.error());
  if (*archive) co_return json_reply(200, {{"id", id}, {"archive", *path}});
  co_return json_reply(200, {{"id", id}});
}

// suspend, resume, keepalive: a lifecycle step, answered with the session object.
asio::awaitable<Reply> lifecycle(Context* ctx, RouteId route, Request* rq) {
  Request& req = *rq;
  auto sid = session_param(req);
  if (!sid) co_return error_reply(sid.error());
  if (auto st = empty_body(&req); !st) co_return error_reply(st.error());
  service::Sessions& ss = ctx->svc->sessions;
  // The audit line comes from the manager's event (a no-op step writes none).
  Result<SessionInfo> s = fail(Code::kInternal, "lifecycle step");
  if (route == RouteId::kSessionSuspend) {
    s = co_await ss.suspend(v1(req), *sid);
  } else if (route == RouteId::kSessionResume) {
    s = co_await ss.resume(v1(req), *sid);
  } else {
    s = co_await ss.keepalive(v1(req), *sid);
  }
  if (!s) co_return error_reply(s.error());
  co_return session_reply(200, *s);
}

asio::awaitable<Reply> restore_session(Context* ctx, Request* rq) {
  Request& req = *rq;
  auto sid = session_param(req);
  if (!sid) co_return error_reply(sid.error());
  std::string id = *sid;
  auto body = body_object(&req);
  if (!body) co_return error_reply(body.error());
  if (auto st = check_known_fields(*body, {"archive"}); !st) co_return error_reply(st.error());
  auto it = body->find("archive");
  if (it == body->end() || it->is_null()) {
    co_return error_reply(Error::make(Code::kInvalid, "field 'archive' is required"));
  }
  if (!it->is_string()) {
    co_return error_reply(Error::make(Code::kInvalid, "field 'archive' must be a string"));
  }
  auto s = co_await ctx->svc->sessions.restore(v1(req), id, it->get<std::string>());
  if (!s) co_return error_reply(s.error());
  co_return session_reply(201, *s);
}

asio::awaitable<Reply> get_session_route(Context* ctx, Request* req) {
  auto id = session_param(*req);
  if (!id) co_return error_reply(id.error());
  auto s = co_await ctx->svc->sessions.get(v1(*req), *id);
  if (!s) co_return error_reply(s.error());
  co_return session_reply(200, *s);
}

// GET /v1/sessions/{id}/usage (API.md "Usage"): the box's figures while it runs; a suspended
// session uses no memory and no tasks, and has no CPU counter until it runs again.
asio::awaitable<Reply> session_usage(Context* ctx, Request* req) {
  auto id = session_param(*req);
  if (!id) co_return error_reply(id.error());
  auto u = co_await ctx->svc->sessions.usage(v1(*req), *id);
  if (!u) co_return error_reply(u.error());
  const bool running = u->box.has_value();
  json body = {{"id", u->info.id},
               {"state", running ? "running" : "suspended"},
               {"sampled_at", rfc3339(std::chrono::system_clock::now())},
               {"memory_bytes", running ? u->box->memory_bytes : 0},
               {"cpu_usec", nullptr},
               {"pids", running ? u->box->pids : 0},
               {"workspace_bytes", nullptr}};
  if (running && u->box->cpu_usec) body["cpu_usec"] = *u->box->cpu_usec;
  if (u->workspace_bytes) body["workspace_bytes"] = *u->workspace_bytes;
  co_return json_reply(200, body);
}

asio::awaitable<Reply> suspend(Context* ctx, Request* req) {
  co_return co_await lifecycle(ctx, RouteId::kSessionSuspend, req);
}
asio::awaitable<Reply> resume(Context* ctx, Request* req) {
  co_return co_await lifecycle(ctx, RouteId::kSessionResume, req);
}
asio::awaitable<Reply> keepalive(Context* ctx, Request* req) {
  co_return co_await lifecycle(ctx, RouteId::kSessionKeepalive, req);
}

// POST /v1/sessions/{id}/network {"mode", "allow"}: the session's network mode and allowlist. A
// running box switches live for new connections (SessionManager::set_network); the spec keeps
// it (resume, restart).
asio::awaitable<Reply> set_network(Context* ctx, Request* rq) {
  Request& req = *rq;
  auto id = session_param(req);
  if (!id) co_return error_reply(id.error());
  auto body = body_object(&req);
  if (!body) co_return error_reply(body.error());
  if (auto st = check_known_fields(*body, {"mode", "allow"}); !st) {
    co_return error_reply(st.error());
  }
  if (!body->contains("mode")) {
    co_return error_reply(Error::make(Code::kInvalid, "field 'mode' is required"));
  }
  session::NetworkSpec spec;
  if (auto st = decode_network(json{{"network", *body}}, &spec); !st) {
    co_return error_reply(st.error());
  }
  auto s = co_await ctx->svc->sessions.set_network(v1(req), *id, std::move(spec));
  if (!s) co_return error_reply(s.error());
  co_return session_reply(200, *s);
}

// PATCH /v1/sessions/{id} {"limits", "ttl_sec", "labels"}: a live change (SessionManager::
// update); the reply is the session with what is now in force.
asio::awaitable<Reply> update_session(Context* ctx, Request* rq) {
  Request& req = *rq;
  auto id = session_param(req);
  if (!id) co_return error_reply(id.error());
  auto body = body_object(&req);
  if (!body) co_return error_reply(body.error());
  auto u = decode_session_patch(*body);
  if (!u) co_return error_reply(u.error());
  auto s = co_await ctx->svc->sessions.update(v1(req), *id, std::move(*u));
  if (!s) co_return error_reply(s.error());
  co_return session_reply(200, *s);
}

// POST /v1/sessions/{id}/mounts {"mounts", "skills", "skill_mode"}: more mounts and skills for
// an existing session, recorded in its spec and put into the running box when that can be done
// safely (SessionManager::add_mounts); "applied" says whether they are there now ("live") or
// from the next start ("next_start").
asio::awaitable<Reply> add_mounts(Context* ctx, Request* rq) {
  Request& req = *rq;
  auto id = session_param(req);
  if (!id) co_return error_reply(id.error());
  auto body = body_object(&req);
  if (!body) co_return error_reply(body.error());
  auto add = decode_add_mounts(*body);
  if (!add) co_return error_reply(add.error());
  auto r = co_await ctx->svc->sessions.add_mounts(v1(req), *id, std::move(*add));
  if (!r) co_return error_reply(r.error());
  const char* applied = r->live ? "live" : "next_start";
  co_return json_reply(200, {{"session", encode_session(r->info)}, {"applied", applied}});
}

}  // namespace

std::vector<RouteSpec> session_routes() {
  using B = BodyKind;
  using R = RouteId;
  return {
      {R::kSessionCreate, "POST", "/v1/sessions", B::kJson, true, simple<create_session>},
      {R::kSessionList, "GET", "/v1/sessions", B::kNone, true, simple<list_sessions>},
      {R::kSessionGet, "GET", "/v1/sessions/{id}", B::kNone, true, simple<get_session_route>},
      {R::kSessionUsage, "GET", "/v1/sessions/{id}/usage", B::kNone, true, simple<session_usage>},
      {R::kSessionDelete, "DELETE", "/v1/sessions/{id}", B::kNone, true, simple<delete_session>},
      {R::kSessionUpdate, "PATCH", "/v1/sessions/{id}", B::kJson, true, simple<update_session>},
      {R::kSessionSuspend, "POST", "/v1/sessions/{id}/suspend", B::kJson, true, simple<suspend>},
      {R::kSessionResume, "POST", "/v1/sessions/{id}/resume", B::kJson, true, simple<resume>},
      {R::kSessionKeepalive, "POST", "/v1/sessions/{id}/keepalive", B::kJson, true,
       simple<keepalive>},
      {R::kSessionRestore, "POST", "/v1/sessions/{id}/restore", B::kJson, true,
       simple<restore_session>},
      {R::kSessionNetwork, "POST", "/v1/sessions/{id}/network", B::kJson, true,
       simple<set_network>},
      {R::kSessionMounts, "POST", "/v1/sessions/{id}/mounts", B::kJson, true, simple<add_mounts>},
  };
}

}  // namespace agentbox::server::detail
