// The templates surface (API.md "Templates, snapshots, health, packages"): template CRUD (YAML
// bodies), builds with their logs, snapshots and rollback: decode, service::Templates, encode.
// Every route is 501 when the daemon runs without templates (a fixture without a data dir).

#include "service/templates.h"

#include <cstdint>

#include "common/log.h"
#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/forward.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "service/services.h"

namespace agentbox::server::detail {
namespace {

using session::BuildInfo;
using session::TemplateInfo;

json encode_snapshot(const session::SnapshotInfo& s, std::uint64_t current) {
  return {
      {"id", s.id},
      {"version", s.version},
      {"created_at", rfc3339(s.created_at)},
      {"bytes", s.bytes},
      {"files", s.files},
      {"current", s.version == current},
      {"build_id", s.build_id},
      // API.md "Images": the image it was built on (its sessions' root), or null.
      {"image", s.image_digest.empty() ? json(nullptr)
                                       : json{{"ref", s.image_ref}, {"digest", s.image_digest}}}};
}

json encode_template(const TemplateInfo& t) {
  const workspace::Template& m = t.tmpl;
  json files = json::array();
  for (const auto& [p, c] : m.files) files.push_back(p);
  json deps_py = m.python.dependencies;
  json deps_node = json::object();
  for (const auto& [n, v] : m.nodejs.dependencies) deps_node[n] = v;
  json health = json::array();
  for (const auto& h : m.health) {
    health.push_back({{"name", h.name}, {"command", h.command}, {"repair", h.repair}});
  }
  json snaps = json::array();
  for (const auto& s : t.snapshots) snaps.push_back(encode_snapshot(s, t.current));
  json j = {{"name", m.name},
            {"version", m.version},
            {"description", m.description},
            {"image", m.image.empty() ? json(nullptr) : json(m.image)},
            {"files", std::move(files)},
            {"setup", m.setup},
            {"env", m.env},
            {"network", m.network},
            {"health", std::move(health)},
            {"created_at", rfc3339(t.created_at)},
            {"updated_at", rfc3339(t.updated_at)},
            {"current_version", t.current ? json(t.current) : json(nullptr)},
            {"snapshots", std::move(snaps)},
            {"warnings", t.warnings}};
  if (m.python.present) {
    j["python"] = {{"version", m.python.version}, {"dependencies", std::move(deps_py)}};
  }
  if (m.nodejs.present) {
    j["nodejs"] = {{"version", m.nodejs.version},
                   {"runtime", m.nodejs.runtime},
                   {"dependencies", std::move(deps_node)}};
  }
  return j;
}

json encode_build(const BuildInfo& b) {
  json j = {{"build_id", b.id},
            {"template", b.template_name},
            {"state", std::string(session::build_state_name(b.state))},
            {"step", b.step},
            {"exit_code", b.exit_code ? json(*b.exit_code) : json(nullptr)},
            {"started_at", rfc3339(b.started_at)}};
  if (b.state != session::BuildState::kRunning) j["ended_at"] = rfc3339(b.ended_at);
  if (!b.error.empty()) j["error"] = b.error;
  if (!b.snapshot.empty()) j["snapshot"] = {{"id", b.snapshot}, {"version", b.version}};
  return j;
}

service::Templates& templates(Context* ctx) {
  return ctx->svc->templates;
}
service::Origin origin(const Request& req) {
  return origin_of(req, service::Surface::kV1);
}
std::string name_param(const Request& req) {
  auto it = req.params.find("name");
  return it == req.params.end() ? std::string() : it->second;
}

asio::awaitable<Reply> create_template(Context* ctx, Request* req) {
  auto r = co_await templates(ctx).put(origin(*req), std::move(req->body));
  if (!r) co_return error_reply(r.error());
  spdlog::info("req={} template {} {}", req->id, r->first.tmpl.name,
               r->second ? "created" : "replaced");
  co_return json_reply(r->second ? 201 : 200, encode_template(r->first));
}

asio::awaitable<Reply> list_templates(Context* ctx, Request* req) {
  auto r = co_await templates(ctx).list(origin(*req));
  if (!r) co_return error_reply(r.error());
  json arr = json::array();
  for (const auto& t : *r) arr.push_back(encode_template(t));
  co_return json_reply(200, {{"templates", std::move(arr)}});
}

asio::awaitable<Reply> get_template(Context* ctx, Request* req) {
  auto r = co_await templates(ctx).get(origin(*req), name_param(*req));
  if (!r) co_return error_reply(r.error());
  co_return json_reply(200, encode_template(*r));
}

asio::awaitable<Reply> delete_template(Context* ctx, Request* req) {
  std::string name = name_param(*req);
  auto r = co_await templates(ctx).remove(origin(*req), name);
  if (!r) co_return error_reply(r.error());
  co_return json_reply(200, {{"name", name}, {"deleted", true}});
}

asio::awaitable<Reply> build_template(Context* ctx, Request* req) {
  auto wait = bool_query(*req, "wait");
  if (!wait) co_return error_reply(wait.error());
  std::string name = name_param(*req);
  auto r = co_await templates(ctx).start_build(origin(*req), name);
  if (!r) co_return error_reply(r.error());
  spdlog::info("req={} template {} build {} started", req->id, name, r->id);
  if (!*wait) {
    co_return json_reply(
        202, {{"build_id", r->id}, {"state", std::string(session::build_state_name(r->state))}});
  }
  auto done = co_await templates(ctx).wait_build(origin(*req), name, r->id);
  if (!done) co_return error_reply(done.error());
  int status = done->state == session::BuildState::kSucceeded ? 201 : 422;
  json body = encode_build(*done);
  if (status != 201) {
    body["error"] = {{"code", "EBUILD"}, {"message", done->error}};
  }
  co_return json_reply(status, body);
}

// Cluster mode: the node a build ran on when it is another one (its state and log are there).
std::optional<cluster::Owner> build_owner(Context* ctx, Request& req) {
  cluster::Cluster* cl = ctx->opts.cluster.get();
  if (cl == nullptr || req.forwarded) return std::nullopt;
  const std::string node = templates(ctx).build_node(req.params["build_id"]);
  if (node.empty()) return std::nullopt;
  for (const cluster::NodeState& n : cl->nodes()) {
    if (n.name == node) return cluster::Owner{n.name, false, n.up, n.advertise, n.last_seen};
  }
  return std::nullopt;
}

asio::awaitable<bool> get_build(Call* call) {
  Context* ctx = call->ctx;
  Request& req = call->ex.req;
  const std::string id = req.params["build_id"];
  if (auto owner = build_owner(ctx, req)) {
    co_return co_await forward_to(call, *owner, "build " + id, std::string(), false);
  }
  auto r = co_await templates(ctx).build(origin(req), name_param(req), id);
  if (!r) co_return co_await send_error(call, r.error());
  co_return co_await send_reply(call, json_reply(200, encode_build(*r)));
}

asio::awaitable<Reply> list_snapshots(Context* ctx, Request* req) {
  auto r = co_await templates(ctx).get(origin(*req), name_param(*req));
  if (!r) co_return error_reply(r.error());
  json arr = json::array();
  for (const auto& s : r->snapshots) arr.push_back(encode_snapshot(s, r->current));
  co_return json_reply(200, {{"snapshots", std::move(arr)}});
}

asio::awaitable<Reply> rollback_template(Context* ctx, Request* req) {
  auto body = body_object(req);
  if (!body) co_return error_reply(body.error());
  if (auto st = check_known_fields(*body, {"version"}); !st) co_return error_reply(st.error());
  auto it = body->find("version");
  if (it == body->end() || !it->is_number_unsigned() || it->get<std::uint64_t>() == 0) {
    co_return error_reply(
        Error::make(Code::kInvalid, "field 'version' is required: a snapshot version number"));
  }
  auto r =
      co_await templates(ctx).rollback(origin(*req), name_param(*req), it->get<std::uint64_t>());
  if (!r) co_return error_reply(r.error());
  co_return json_reply(200, encode_template(*r));
}

// GET .../builds/{build_id}/log[?follow=true]: NDJSON, one {"line": ...} per log line; with
// follow, streamed until the build ends, then {"type": "end", "state", "exit_code"}.
asio::awaitable<bool> build_log(Call* call) {
  Context* ctx = call->ctx;
  Conn* conn = call->conn;
  Exchange* ex = &call->ex;
  auto follow = bool_query(ex->req, "follow");
  if (!follow) co_return co_await send_error(call, follow.error());
  service::Templates& svc = templates(ctx);
  const service::Origin from_who = origin(ex->req);
  const std::string name = name_param(ex->req);
  const std::string id = ex->req.params["build_id"];
  if (auto owner = build_owner(ctx, ex->req)) {
    co_return co_await forward_to(call, *owner, "build " + id, std::string(), false);
  }
  auto exists = co_await svc.build(from_who, name, id);
  if (!exists) co_return co_await send_error(call, exists.error());

  auto started = co_await start_ndjson(call);
  if (!started.ok) co_return false;
  const bool chunked = started.chunked;
  const bool keep = started.keep;

  std::size_t from = 0;
  for (;;) {
    auto wait = *follow ? std::chrono::milliseconds(500) : std::chrono::milliseconds(0);
    auto chunk = co_await svc.build_log(from_who, name, id, from, wait);
    if (!chunk) co_return false;
    std::string out;
    for (const std::string& l : chunk->lines) {
      json line = json::object();
      line["line"] = l;
      out += to_wire(line) + "\n";
    }
    from += chunk->lines.size();
    bool end = chunk->ended || !*follow;
    if (end && chunk->ended) {
      auto b = co_await svc.build(from_who, name, id);
      if (b) {
        json last = encode_build(*b);
        last["type"] = "end";
        out += to_wire(last) + "\n";
      }
    }
    if (!out.empty()) {
      bool wrote = co_await write_stream(ctx, conn, chunked, out);
      if (!wrote) co_return false;
    }
    if (end) break;
  }
  if (!co_await end_stream(ctx, conn, chunked)) co_return false;
  co_return keep;
}

}  // namespace

std::vector<RouteSpec> template_routes() {
  constexpr BodyKind J = BodyKind::kJson;  // bounded; YAML for POST /v1/templates
  constexpr BodyKind N = BodyKind::kNone;
  return {
      {RouteId::kTemplateCreate, "POST", "/v1/templates", J, true, simple<create_template>},
      {RouteId::kTemplateList, "GET", "/v1/templates", N, true, simple<list_templates>},
      {RouteId::kTemplateGet, "GET", "/v1/templates/{name}", N, true, simple<get_template>},
      {RouteId::kTemplateDelete, "DELETE", "/v1/templates/{name}", N, true,
       simple<delete_template>},
      {RouteId::kTemplateBuild, "POST", "/v1/templates/{name}/build", N, true,
       simple<build_template>},
      {RouteId::kTemplateBuildGet, "GET", "/v1/templates/{name}/builds/{build_id}", N, true,
       get_build},
      {RouteId::kTemplateBuildLog, "GET", "/v1/templates/{name}/builds/{build_id}/log", N, true,
       build_log},
      {RouteId::kTemplateSnapshots, "GET", "/v1/templates/{name}/snapshots", N, true,
       simple<list_snapshots>},
      {RouteId::kTemplateRollback, "POST", "/v1/templates/{name}/rollback", J, true,
       simple<rollback_template>},
  };
}

}  // namespace agentbox::server::detail
