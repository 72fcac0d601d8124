// The v1 sessions surface: /v1/sessions and the lifecycle steps of one session.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {
namespace {

using session::Caller;
using session::SessionInfo;
using session::SessionManager;
using ojson = nlohmann::ordered_json;

Reply session_reply(int status, const SessionInfo& s) {
  return json_reply(status, encode_session(s));
}

asio::awaitable<Result<SessionInfo>> get_session(Context* ctx, std::string id, Caller caller) {
  SessionManager* sm = ctx->sessions;
  auto job1 = run_blocking(ctx->pool, [sm, id, caller] { return sm->get(id, caller); });
  co_return co_await std::move(job1);
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
  auto decoded = decode_create_session(*body, default_scope);
  if (!decoded) co_return error_reply(decoded.error());
  SessionManager* sm = ctx->sessions;
  Caller caller = req.caller;
  auto job2 = run_blocking(ctx->pool, [sm, d = std::move(*decoded), caller] {
    return sm->create_or_get(d.id, d.spec, caller);
  });
  auto r = co_await std::move(job2);
  if (!r) co_return error_reply(r.error());
  // The audit line comes from the manager's kCreated event (audit_session_events).
  if (r->second) spdlog::info("req={} session {} created", req.id, r->first.id);
  co_return session_reply(r->second ? 201 : 200, r->first);
}

asio::awaitable<Reply> list_sessions(Context* ctx, Request* req) {
  Caller caller = req->caller;
  SessionManager* sm = ctx->sessions;
  auto job3 = run_blocking(
      ctx->pool, [sm, caller]() -> Result<std::vector<SessionInfo>> { return sm->list(caller); });
  auto list = co_await std::move(job3);
  if (!list) co_return error_reply(list.error());
  json arr = json::array();
  for (const auto& s : *list) arr.push_back(encode_session(s));
  co_return json_reply(200, {{"sessions", std::move(arr)}});
}

asio::awaitable<Reply> delete_session(Context* ctx, Request* rq) {
  Request& req = *rq;
  auto sid = session_param(req);
  if (!sid) co_return error_reply(sid.error());
  std::string id = *sid;
  auto archive = bool_query(req, "archive");
  if (!archive) co_return error_reply(archive.error());
  SessionManager* sm = ctx->sessions;
  Caller caller = req.caller;
  if (*archive) {
    auto job4a =
        run_blocking(ctx->pool, [sm, id, caller] { return sm->destroy_archived(id, caller); });
    auto path = co_await std::move(job4a);
    if (!path) co_return error_reply(path.error());
    spdlog::info("req={} session {} archived to {} and destroyed", req.id, id, *path);
    co_return json_reply(200, {{"id", id}, {"archive", *path}});
  }
  auto job4 = run_blocking(ctx->pool, [sm, id, caller] { return sm->destroy(id, caller); });
  auto st = co_await std::move(job4);
  if (!st) co_return error_reply(st.error());
  spdlog::info("req={} session {} destroyed", req.id, id);
  co_return json_reply(200, {{"id", id}});
}

// suspend, resume, keepalive: a lifecycle step, answered with the session object.
asio::awaitable<Reply> lifecycle(Context* ctx, RouteId route, Request* rq) {
  Request& req = *rq;
  auto sid = session_param(req);
  if (!sid) co_return error_reply(sid.error());
  std::string id = *sid;
  if (auto st = empty_body(&req); !st) co_return error_reply(st.error());
  SessionManager* sm = ctx->sessions;
  Caller caller = req.caller;
  auto job = run_blocking(ctx->pool, [sm, route, id, caller]() -> Result<SessionInfo> {
    if (route == RouteId::kSessionSuspend) return sm->suspend(id, caller);
    if (route == RouteId::kSessionResume) return sm->resume(id, caller);
    return sm->keepalive(id, caller);
  });
  auto s = co_await std::move(job);
  if (!s) co_return error_reply(s.error());
  if (route != RouteId::kSessionKeepalive) {
    // The audit line comes from the manager's event (a no-op step writes none).
    const char* event = route == RouteId::kSessionSuspend ? "suspend" : "resume";
    spdlog::info("req={} session {}: {}", req.id, id, event);
  }
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
  std::string archive = it->get<std::string>();
  SessionManager* sm = ctx->sessions;
  Caller caller = req.caller;
  auto job = run_blocking(ctx->pool,
                          [sm, id, archive, caller] { return sm->restore(id, archive, caller); });
  auto s = co_await std::move(job);
  if (!s) co_return error_reply(s.error());
  spdlog::info("req={} session {} restored from {}", req.id, id, archive);
  co_return session_reply(201, *s);
}

asio::awaitable<Reply> get_session_route(Context* ctx, Request* req) {
  auto id = session_param(*req);
  if (!id) co_return error_reply(id.error());
  auto s = co_await get_session(ctx, *id, req->caller);
  if (!s) co_return error_reply(s.error());
  co_return session_reply(200, *s);
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

// POST /v1/sessions/{id}/network {"mode", "allow"}: the session's egress policy. A running box's
// proxy takes it for new connections; the spec keeps it (resume, restart). A change of mode is
// ENOTSUP (the box's network namespace was made for its mode).
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
  SessionManager* sm = ctx->sessions;
  Caller caller = req.caller;
  auto job = run_blocking(ctx->pool, [sm, sid = *id, spec, caller] {
    return sm->set_network(sid, spec, caller);
  });
  auto s = co_await std::move(job);
  if (!s) co_return error_reply(s.error());
  ojson fields = {{"mode", spec.mode}, {"allow", spec.allow}};
  audit(ctx, "session.network", req.caller, *id, fields);
  spdlog::info("req={} session {}: network policy set ({} entries)", req.id, *id,
               spec.allow.size());
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
  ojson fields = {{"mounts", ojson::array()}, {"skills", add->skills}};
  for (const auto& m : add->mounts) {
    fields["mounts"].push_back({{"host_path", m.host_path}, {"mount_path", m.mount_path},
                                {"mode", m.mode}});
  }
  SessionManager* sm = ctx->sessions;
  Caller caller = req.caller;
  auto job = run_blocking(ctx->pool, [sm, sid = *id, a = std::move(*add), caller] {
    return sm->add_mounts(sid, a, caller);
  });
  auto r = co_await std::move(job);
  if (!r) co_return error_reply(r.error());
  const char* applied = r->live ? "live" : "next_start";
  fields["applied"] = applied;
  audit(ctx, "session.mounts", req.caller, *id, fields);
  spdlog::info("req={} session {}: mounts added ({})", req.id, *id, applied);
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
      {R::kSessionDelete, "DELETE", "/v1/sessions/{id}", B::kNone, true, simple<delete_session>},
      {R::kSessionSuspend, "POST", "/v1/sessions/{id}/suspend", B::kJson, true, simple<suspend>},
      {R::kSessionResume, "POST", "/v1/sessions/{id}/resume", B::kJson, true, simple<resume>},
      {R::kSessionKeepalive, "POST", "/v1/sessions/{id}/keepalive", B::kJson, true,
       simple<keepalive>},
      {R::kSessionRestore, "POST", "/v1/sessions/{id}/restore", B::kJson, true,
       simple<restore_session>},
      {R::kSessionNetwork, "POST", "/v1/sessions/{id}/network", B::kJson, true,
       simple<set_network>},
      {R::kSessionMounts, "POST", "/v1/sessions/{id}/mounts", B::kJson, true,
       simple<add_mounts>},
  };
}

}  // namespace agentbox::server::detail
