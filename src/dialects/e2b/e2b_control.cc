// The E2B control plane (shared/E2B-MCP.md 2) onto agentbox sessions: a sandbox is a session of
// the caller's tenant (X-API-KEY is its agentbox token).
//
//   POST /sandboxes, POST /v2/sandboxes        create: a new session "e2b-<hex>"; timeout ->
//                                              ttl_sec, metadata -> labels, envVars -> env
//   GET /sandboxes, GET /v2/sandboxes          list (state, metadata filters; limit/nextToken)
//   GET /sandboxes/{id}                        get
//   DELETE /sandboxes/{id}                     kill = destroy
//   POST [/v2]/sandboxes/{id}/connect          resume if paused (201) or 200; timeout -> ttl
//   POST /sandboxes/{id}/resume                the older resume
//   POST /sandboxes/{id}/timeout               ttl_sec = timeout
//   POST /sandboxes/{id}/pause                 suspend (409 when paused already)
//
// `timeout` is agentbox's ttl_sec: idle seconds (no API use, no command running) after which
// the daemon's reaper suspends the session (or destroys it, with the daemon's ttl_destroys), not
// E2B's wall-clock end. templateID: "base" (E2B's default) is the default box; another names a
// template of the daemon or an image alias of its config (`image_aliases:`); else it is refused
// naming it. Fields that would change what the sandbox is and that agentbox does not do (network, volumeMounts, mcp, autoResume, ...) are
// refused (501) naming the field, never ignored.

#include <algorithm>

#include "common/log.h"
#include "common/text_codec.h"
#include "server/internal/blocking.h"
#include "server/internal/forward.h"
#include "dialects/e2b/e2b.h"

namespace agentbox::server::detail {
namespace {

using session::Caller;
using session::SessionInfo;
using session::SessionManager;

constexpr std::string_view kDefaultTemplate = "base";
constexpr std::int64_t kDefaultTimeoutSec = 300;    // E2B's default
constexpr std::int64_t kMaxTimeoutSec = 86400 * 30;

std::string new_sandbox_id() { return "e2b-" + random_hex(10); }

// The templateID of a sandbox: its template, the image alias of its image (its reference when
// no alias names it), or "base".
std::string template_of(Context* ctx, const SessionInfo& s) {
  if (!s.spec.template_name.empty()) return s.spec.template_name;
  if (!s.spec.image_ref.empty()) {
    const auto& store = ctx->svc->images.store();
    std::string alias = store ? store->alias_of(s.spec.image_ref) : std::string();
    return alias.empty() ? s.spec.image_ref : alias;
  }
  return std::string(kDefaultTemplate);
}

// The Sandbox reply of create and connect.
Result<json> sandbox_json(Context* ctx, const SessionInfo& s) {
  json j = json::object();
  j["sandboxID"] = s.id;
  j["templateID"] = template_of(ctx, s);
  j["clientID"] = "agentbox";
  j["alias"] = template_of(ctx, s);
  j["envdVersion"] = std::string(kEnvdVersion);
  j["envdAccessToken"] = AB_TRY(envd_token(ctx, s));
  j["domain"] = nullptr;
  return j;
}

// The SandboxDetail of get, and (without domain) of list.
json detail_json(Context* ctx, const SessionInfo& s) {
  json j = json::object();
  j["sandboxID"] = s.id;
  j["templateID"] = template_of(ctx, s);
  j["alias"] = template_of(ctx, s);
  j["clientID"] = "agentbox";
  j["startedAt"] = rfc3339(s.created_at);
  std::int64_t ttl = s.spec.ttl_sec.value_or(0);
  // The earliest the reaper may act: idle since last use for ttl seconds. No TTL: far away.
  auto end = ttl > 0 ? s.last_used_at + std::chrono::seconds(ttl)
                     : s.created_at + std::chrono::hours(24 * 365 * 10);
  j["endAt"] = rfc3339(end);
  j["state"] = s.state == session::State::kRunning ? "running" : "paused";
  const auto& l = s.spec.limits;
  j["cpuCount"] = l.cpu_percent ? std::max<std::uint32_t>(1, (*l.cpu_percent + 99) / 100) : 0;
  j["memoryMB"] = l.memory_mb.value_or(0);
  j["diskSizeMB"] = l.disk_mb.value_or(0);
  j["envdVersion"] = std::string(kEnvdVersion);
  j["metadata"] = s.spec.labels;
  return j;
}

Reply no_content() {
  Reply r;
  r.status = 204;
  r.content_type.clear();
  return r;
}

Reply reply_of(const Result<json>& j, int status) {
  if (!j) return control_error(j.error());
  return json_reply(status, *j);
}

// ---- bodies

Result<json> body_json(const std::string& body) {
  if (body.empty()) return json::object();
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail(Code::kInvalid, "request body is not valid JSON");
  if (!j.is_object()) return fail(Code::kInvalid, "request body must be a JSON object");
  return j;
}

Result<std::optional<std::int64_t>> timeout_field(const json& b) {
  auto it = b.find("timeout");
  if (it == b.end() || it->is_null()) return std::optional<std::int64_t>{};
  if (!it->is_number_integer()) return fail(Code::kInvalid, "'timeout' must be an integer (seconds)");
  auto v = it->get<std::int64_t>();
  if (v < 0 || v > kMaxTimeoutSec) {
    return fail(Code::kInvalid,
                "'timeout' must be from 0 to " + std::to_string(kMaxTimeoutSec) + " seconds");
  }
  return std::optional<std::int64_t>(v);
}

Result<std::map<std::string, std::string>> string_map(const json& b, const char* name) {
  std::map<std::string, std::string> out;
  auto it = b.find(name);
  if (it == b.end() || it->is_null()) return out;
  if (!it->is_object()) return fail(Code::kInvalid, std::string("'") + name + "' must be an object of strings");
  for (auto e = it->begin(); e != it->end(); ++e) {
    if (!e.value().is_string()) {
      return fail(Code::kInvalid, std::string("'") + name + "." + e.key() + "' must be a string");
    }
    out[e.key()] = e.value().get<std::string>();
  }
  return out;
}

struct Create {
  std::string template_id;
  session::SessionSpec spec;
};

Result<Create> decode_create(const json& b) {
  Create c;
  // What the SDKs send and agentbox does: E2B-MCP.md 2.
  static constexpr std::string_view kKnown[] = {
      "templateID", "timeout", "metadata", "envVars", "secure", "allow_internet_access",
      "autoPause", "autoPauseMemory"};
  for (auto it = b.begin(); it != b.end(); ++it) {
    if (std::find(std::begin(kKnown), std::end(kKnown), it.key()) != std::end(kKnown)) continue;
    if (it->is_null() || (it->is_boolean() && !it->get<bool>())) continue;  // off: nothing asked
    return fail(Code::kNotSupported,
                "'" + it.key() + "' is not supported by agentbox's E2B dialect");
  }
  auto tmpl = b.find("templateID");
  if (tmpl != b.end() && !tmpl->is_null() && !tmpl->is_string()) {
    return fail(Code::kInvalid, "'templateID' must be a string");
  }
  c.template_id = tmpl != b.end() && tmpl->is_string() ? tmpl->get<std::string>() : "";
  if (c.template_id.empty()) c.template_id = kDefaultTemplate;
  auto timeout = AB_TRY(timeout_field(b));
  c.spec.ttl_sec = timeout.value_or(kDefaultTimeoutSec);
  c.spec.labels = AB_TRY(string_map(b, "metadata"));
  c.spec.env = AB_TRY(string_map(b, "envVars"));
  for (const char* flag : {"secure", "autoPause", "autoPauseMemory"}) {
    auto it = b.find(flag);
    if (it != b.end() && !it->is_null() && !it->is_boolean()) {
      return fail(Code::kInvalid, std::string("'") + flag + "' must be a boolean");
    }
  }
  // secure: every sandbox has an envdAccessToken anyway. autoPause: a timeout suspends (pauses)
  // unless the daemon is set to destroy (ttl_destroys), so true is what agentbox does; false is
  // only E2B's default spelled out.
  // allow_internet_access (older SDKs always send true): the session has the daemon's default
  // network; asking for none is what agentbox can promise, anything else is refused above
  // unless it is the SDK's default `true`, which the daemon's network policy then decides.
  if (auto it = b.find("allow_internet_access"); it != b.end() && !it->is_null()) {
    if (!it->is_boolean()) return fail(Code::kInvalid, "'allow_internet_access' must be a boolean");
    if (!it->get<bool>()) c.spec.network.mode = "none";
  }
  return c;
}

// ---- the pool jobs (plain functions: no lambda is made inside a co_await)


// The control plane's operations (service::Sessions; coroutines on the io thread).

service::Origin e2b_origin(const Request& req, const Caller& caller) {
  return service::Origin(caller, req.id, service::Surface::kE2b);
}

// connect: resumes a paused sandbox; a timeout sets its TTL. 201 when it was resumed.
asio::awaitable<Result<std::pair<json, bool>>> connect_sandbox(Context* ctx, service::Origin o,
                                                              std::string id,
                                                              std::optional<std::int64_t> timeout) {
  service::Sessions& ss = ctx->svc->sessions;
  auto s = co_await ss.get(o, id);
  if (!s) co_return std::unexpected(s.error());
  bool resumed = false;
  if (s->state != session::State::kRunning) {
    s = co_await ss.resume(o, id);
    if (!s) co_return std::unexpected(s.error());
    resumed = true;
  }
  if (timeout) {
    s = co_await ss.set_ttl(o, id, *timeout);
    if (!s) co_return std::unexpected(s.error());
  }
  s = co_await ss.keepalive(o, id);
  if (!s) co_return std::unexpected(s.error());
  auto j = sandbox_json(ctx, *s);
  if (!j) co_return std::unexpected(j.error());
  co_return std::pair{std::move(*j), resumed};
}

asio::awaitable<Status> set_timeout(Context* ctx, service::Origin o, std::string id,
                                    std::int64_t timeout) {
  service::Sessions& ss = ctx->svc->sessions;
  auto s = co_await ss.set_ttl(o, id, timeout);
  if (!s) co_return std::unexpected(s.error());
  s = co_await ss.keepalive(o, id);
  if (!s) co_return std::unexpected(s.error());
  co_return Status{};
}

// templateID: "base" is the default box; another names a template of the daemon or, failing
// that, an image by the config's `image_aliases:` (API.md "Images"; pulled on first use).
Status resolve_template_id(Context* ctx, Create* c) {
  if (c->template_id == kDefaultTemplate) return {};
  if (const auto& tm = ctx->svc->templates.store(); tm && tm->get(c->template_id)) {
    c->spec.template_name = c->template_id;
    return {};
  }
  if (const auto& store = ctx->svc->images.store(); store) {
    if (std::string ref = store->alias(c->template_id); !ref.empty()) {
      c->spec.image_ref = std::move(ref);
      return {};
    }
  }
  return fail(Code::kInvalid, "template '" + c->template_id +
                                  "' does not exist: not 'base', a template of this daemon or an "
                                  "image alias of its config (image_aliases)");
}

asio::awaitable<Result<json>> create_sandbox(Context* ctx, service::Origin o, Create c) {
  if (auto st = resolve_template_id(ctx, &c); !st) co_return std::unexpected(st.error());
  for (int attempt = 0;; ++attempt) {
    auto r = co_await ctx->svc->sessions.create(o, new_sandbox_id(), c.spec);
    if (!r) co_return std::unexpected(r.error());
    if (!r->second) {
      if (attempt < 3) continue;  // an id taken already: 80 random bits, never in practice
      co_return fail(Code::kInternal, "could not pick a free sandbox id");
    }
    co_return sandbox_json(ctx, r->first);
  }
}

asio::awaitable<Status> pause_sandbox(Context* ctx, service::Origin o, std::string id) {
  service::Sessions& ss = ctx->svc->sessions;
  auto s = co_await ss.get(o, id);
  if (!s) co_return std::unexpected(s.error());
  if (s->state != session::State::kRunning) {
    co_return fail(Code::kExists, "sandbox " + id + " is paused already");
  }
  auto p = co_await ss.suspend(o, id);
  if (!p) co_return std::unexpected(p.error());
  co_return Status{};
}

struct ListQuery {
  bool running = true;
  bool paused = true;
  std::map<std::string, std::string> metadata;
  std::size_t limit = 100;
  std::string after;  // nextToken: the last id of the previous page
};

// `raw_query`: the request's query string, for the repeated `state` keys openapi-fetch sends
// (state=running&state=paused; Request::query keeps only the first).
Result<ListQuery> decode_list(const Request& req, std::string_view raw_query) {
  ListQuery q;
  std::string states;
  while (!raw_query.empty()) {
    auto amp = raw_query.find('&');
    std::string_view pair = raw_query.substr(0, amp);
    raw_query = amp == std::string_view::npos ? std::string_view{} : raw_query.substr(amp + 1);
    if (pair.rfind("state=", 0) != 0) continue;
    auto v = url_decode(pair.substr(6), true);
    if (!v) return std::unexpected(v.error());
    if (!v->empty()) states += (states.empty() ? "" : ",") + *v;
  }
  if (!states.empty()) {
    q.running = q.paused = false;
    std::string_view s = states;
    while (!s.empty()) {
      auto comma = s.find(',');
      std::string_view one = s.substr(0, comma);
      s = comma == std::string_view::npos ? std::string_view{} : s.substr(comma + 1);
      if (one == "running") {
        q.running = true;
      } else if (one == "paused") {
        q.paused = true;
      } else {
        return fail(Code::kInvalid, "state '" + std::string(one) + "' is not running or paused");
      }
    }
  }
  if (auto it = req.query.find("metadata"); it != req.query.end() && !it->second.empty()) {
    auto m = parse_query(it->second);  // "k=v&k2=v2", itself URL-encoded
    if (!m) return std::unexpected(m.error());
    q.metadata = std::move(*m);
  }
  if (auto it = req.query.find("limit"); it != req.query.end() && !it->second.empty()) {
    const std::string& v = it->second;
    bool ok = v.size() <= 4;
    for (char c : v) ok = ok && c >= '0' && c <= '9';
    if (!ok || std::stoi(v) < 1 || std::stoi(v) > 1000) {
      return fail(Code::kInvalid, "limit must be from 1 to 1000");
    }
    q.limit = static_cast<std::size_t>(std::stoi(v));
  }
  if (auto it = req.query.find("nextToken"); it != req.query.end()) q.after = it->second;
  for (const auto& [k, v] : req.query) {
    static constexpr std::string_view kKnown[] = {"state", "metadata", "limit", "nextToken",
                                                  "query"};
    if (std::find(std::begin(kKnown), std::end(kKnown), k) == std::end(kKnown)) {
      return fail(Code::kNotSupported, "list filter '" + k + "' is not supported");
    }
  }
  return q;
}

Result<std::pair<json, std::string>> list_job(Context* ctx, ListQuery q, Caller caller) {
  json arr = json::array();
  std::string next;
  for (const SessionInfo& s : ctx->sessions->list(caller)) {  // sorted by id
    if (!q.after.empty() && s.id <= q.after) continue;
    bool running = s.state == session::State::kRunning;
    if (running ? !q.running : !q.paused) continue;
    bool match = true;
    for (const auto& [k, v] : q.metadata) {
      auto it = s.spec.labels.find(k);
      match = match && it != s.spec.labels.end() && it->second == v;
    }
    if (!match) continue;
    if (arr.size() == q.limit) {
      next = arr.back()["sandboxID"].get<std::string>();
      break;
    }
    arr.push_back(detail_json(ctx, s));
  }
  return std::pair{std::move(arr), std::move(next)};
}

// ---- routing

struct Path {
  std::vector<std::string> segs;
};

std::vector<std::string> split(const std::string& path) {
  std::vector<std::string> out;
  std::size_t i = 1;  // after the leading "/"
  while (i <= path.size()) {
    auto slash = path.find('/', i);
    if (slash == std::string::npos) slash = path.size();
    out.push_back(path.substr(i, slash - i));
    i = slash + 1;
  }
  return out;
}

// A route of E2B's API that agentbox does not serve (metrics, snapshots, templates, volumes,
// ...) is 501 naming it; a path that is no E2B route at all is 404.
Reply not_served(const Request& req, const std::string& path) {
  static constexpr std::string_view kE2bRoots[] = {"sandboxes", "templates", "volumes",
                                                   "snapshots", "secrets",   "teams",
                                                   "nodes",     "health",    "access-tokens",
                                                   "api-keys"};
  std::vector<std::string> s = split(path);
  if (!s.empty() && s[0] == "v2") s.erase(s.begin());
  if (!s.empty() && std::find(std::begin(kE2bRoots), std::end(kE2bRoots), s[0]) != std::end(kE2bRoots)) {
    return e2b_error(501, req.method + " " + path + " is not served by agentbox's E2B dialect");
  }
  return e2b_error(404, req.method + " " + path + " is not a route of the E2B API");
}

// Cluster mode: the list is the whole cluster's. Every other up node answers the same query
// for its own sandboxes (each its first `limit` after the token); merged by id, the first
// `limit` of all are the page, and the token follows its last when more remain.
asio::awaitable<void> add_peer_sandboxes(Context* ctx, Request* req, std::string path,
                                         std::string raw_query, std::size_t limit,
                                         std::pair<json, std::string>* page) {
  json& arr = page->first;
  bool more = !page->second.empty();
  const std::string target = "/e2b" + path + (raw_query.empty() ? "" : "?" + raw_query);
  for (const cluster::NodeState& n : ctx->opts.cluster->peers_up()) {
    Reply r = co_await forward_small(ctx, n.advertise, "GET", target, "", req->caller);
    auto j = json::parse(r.body, nullptr, false);
    if (r.status != 200 || !j.is_array()) {
      spdlog::warn("req={} e2b list: node {} did not answer its list (HTTP {})", req->id, n.name,
                   r.status);
      continue;
    }
    for (auto& x : j) arr.push_back(std::move(x));
    more = more || j.size() >= limit;
  }
  std::sort(arr.begin(), arr.end(), [](const json& a, const json& b) {
    return a.value("sandboxID", "") < b.value("sandboxID", "");
  });
  page->second.clear();
  if (arr.size() > limit) {
    arr.erase(arr.begin() + static_cast<std::ptrdiff_t>(limit), arr.end());
    more = true;
  }
  if (more && !arr.empty()) page->second = arr.back()["sandboxID"].get<std::string>();
}

}  // namespace

asio::awaitable<bool> serve_control(Call* call, std::string path) {
  Context* ctx = call->ctx;
  Request& req = call->ex.req;
  const Caller caller = req.caller;
  std::string raw_query;  // before the body: a chunked body's parser takes the head over
  {
    std::string_view target = call->hp->get().target();
    if (auto q = target.find('?'); q != std::string_view::npos) raw_query = target.substr(q + 1);
  }
  auto body = co_await read_whole_body(call, ctx->opts.max_json_bytes);
  if (!body) {
    if (body.error().code == Code::kUnavailable) co_return false;
    call->ex.keep_alive = false;
    co_return co_await send_reply(call, control_error(body.error()));
  }
  std::vector<std::string> s = split(path);
  // "/v2/sandboxes..." and "/sandboxes..." are the same routes here.
  if (!s.empty() && s[0] == "v2") s.erase(s.begin());
  const std::string& m = req.method;
  if (s.empty() || s[0] != "sandboxes" || s.size() > 3) {
    co_return co_await send_reply(call, not_served(req, path));
  }
  if (s.size() == 1) {
    if (m == "POST") {
      auto b = body_json(*body);
      if (!b) co_return co_await send_reply(call, control_error(b.error()));
      auto c = decode_create(*b);
      if (!c) co_return co_await send_reply(call, control_error(c.error()));
      auto r = co_await create_sandbox(ctx, e2b_origin(req, caller), std::move(*c));
      if (r) spdlog::info("req={} e2b sandbox {} created", req.id, (*r)["sandboxID"].get<std::string>());
      co_return co_await send_reply(call, reply_of(r, 201));
    }
    if (m == "GET") {
      auto q = decode_list(req, raw_query);
      if (!q) co_return co_await send_reply(call, control_error(q.error()));
      auto job = run_blocking(ctx->pool, [ctx, q = *q, caller] {
        return list_job(ctx, q, caller);
      });
      auto r = co_await std::move(job);
      if (!r) co_return co_await send_reply(call, control_error(r.error()));
      if (ctx->opts.cluster && !req.forwarded) {
        co_await add_peer_sandboxes(ctx, &req, path, raw_query, q->limit, &*r);
      }
      Reply rep = json_reply(200, r->first);
      if (!r->second.empty()) rep.headers.emplace_back("X-Next-Token", r->second);
      co_return co_await send_reply(call, std::move(rep));
    }
    co_return co_await send_reply(call, not_served(req, path));
  }
  const std::string id = s[1];
  if (auto st = session::validate_id(id); !st) {
    co_return co_await send_reply(call, e2b_error(404, "sandbox " + id + " not found"));
  }
  // The SDK reads `code == 404` in the body as "not found": the session's ENOENT gives it.
  if (s.size() == 2) {
    if (m == "GET") {
      auto info = co_await ctx->svc->sessions.get(e2b_origin(req, caller), id);
      Result<json> r =
          info ? Result<json>(detail_json(ctx, *info)) : std::unexpected(info.error());
      co_return co_await send_reply(call, reply_of(r, 200));
    }
    if (m == "DELETE") {
      auto r = co_await ctx->svc->sessions.destroy(e2b_origin(req, caller), id, false);
      if (!r) co_return co_await send_reply(call, control_error(r.error()));
      co_return co_await send_reply(call, no_content());
    }
    co_return co_await send_reply(call, not_served(req, path));
  }
  const std::string& action = s[2];
  if (m != "POST") co_return co_await send_reply(call, not_served(req, path));
  auto b = body_json(*body);
  if (!b) co_return co_await send_reply(call, control_error(b.error()));
  if (action == "connect" || action == "resume") {
    auto timeout = timeout_field(*b);
    if (!timeout) co_return co_await send_reply(call, control_error(timeout.error()));
    std::optional<std::int64_t> t = *timeout;
    auto r = co_await connect_sandbox(ctx, e2b_origin(req, caller), id, t);
    if (!r) co_return co_await send_reply(call, control_error(r.error()));
    int status = r->second ? 201 : 200;
    co_return co_await send_reply(call, json_reply(status, r->first));
  }
  if (action == "timeout") {
    auto timeout = timeout_field(*b);
    if (!timeout) co_return co_await send_reply(call, control_error(timeout.error()));
    if (!*timeout) {
      co_return co_await send_reply(call, e2b_error(400, "'timeout' (seconds) is required"));
    }
    std::int64_t t = **timeout;
    auto r = co_await set_timeout(ctx, e2b_origin(req, caller), id, t);
    if (!r) co_return co_await send_reply(call, control_error(r.error()));
    co_return co_await send_reply(call, no_content());
  }
  if (action == "pause") {
    if (auto it = b->find("memory"); it != b->end() && !it->is_null() && !it->is_boolean()) {
      co_return co_await send_reply(call, e2b_error(400, "'memory' must be a boolean"));
    }
    auto r = co_await pause_sandbox(ctx, e2b_origin(req, caller), id);
    if (!r) co_return co_await send_reply(call, control_error(r.error()));
    co_return co_await send_reply(call, no_content());
  }
  co_return co_await send_reply(call, not_served(req, path));
}

}  // namespace agentbox::server::detail
