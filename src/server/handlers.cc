// Route handlers whose reply is one small body. Beast-free: they see a parsed Request and return
// a Reply; http_server.cc owns the connection. Blocking work goes to the pool (run_blocking).

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "server/http_error.h"
#include "server/metrics.h"
#include "server/internal/blocking.h"
#include "server/internal/context.h"

namespace agentbox::server::detail {
namespace {

using session::Caller;
using session::SessionInfo;
using session::SessionManager;
using ojson = nlohmann::ordered_json;

// Largest file POST /workspace/read returns inline in JSON.
constexpr std::uint64_t kSeedReadMax = 32u << 20;

Reply session_reply(int status, const SessionInfo& s) {
  return json_reply(status, encode_session(s));
}

asio::awaitable<Result<SessionInfo>> get_session(Context* ctx, std::string id, Caller caller) {
  SessionManager* sm = ctx->sessions;
  auto job1 = run_blocking(ctx->pool, [sm, id, caller] { return sm->get(id, caller); });
  co_return co_await std::move(job1);
}

asio::awaitable<Reply> create_session(Context* ctx, Request req) {
  auto body = parse_object(req.body);
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

asio::awaitable<Reply> list_sessions(Context* ctx, Caller caller) {
  SessionManager* sm = ctx->sessions;
  auto job3 = run_blocking(
      ctx->pool, [sm, caller]() -> Result<std::vector<SessionInfo>> { return sm->list(caller); });
  auto list = co_await std::move(job3);
  if (!list) co_return error_reply(list.error());
  json arr = json::array();
  for (const auto& s : *list) arr.push_back(encode_session(s));
  co_return json_reply(200, {{"sessions", std::move(arr)}});
}

asio::awaitable<Reply> delete_session(Context* ctx, std::string id, Request req) {
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
asio::awaitable<Reply> lifecycle(Context* ctx, RouteId route, std::string id, Request req) {
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
    const char* event = route == RouteId::kSessionSuspend ? "suspend" : "resume";
    spdlog::info("req={} session {}: {}", req.id, id, event);
  }
  co_return session_reply(200, *s);
}

asio::awaitable<Reply> session_health(Context* ctx, std::string id, Caller caller) {
  auto s = co_await get_session(ctx, id, caller);
  if (!s) co_return error_reply(s.error());
  json checks = json::array();
  bool healthy = true;
  auto add = [&](std::string name, bool ok, std::string detail) {
    healthy = healthy && ok;
    checks.push_back({{"name", std::move(name)}, {"ok", ok}, {"detail", std::move(detail)}});
  };
  auto sb = co_await acquire_sandbox(ctx, id, false, caller);
  add("box", sb.has_value(), sb ? "backend " + s->backend + " is up" : sb.error().message);
  if (sb) {
    std::shared_ptr<sandbox::Sandbox> box = *sb;
    auto job5 = run_blocking(ctx->pool, [box] { return box->stat(box->workspace()); });
    auto ws = co_await std::move(job5);
    add("workspace", ws && ws->is_dir,
        ws ? (ws->is_dir ? "workspace is a directory" : "workspace is not a directory")
           : ws.error().message);
  }
  co_return json_reply(200, {{"healthy", healthy}, {"checks", std::move(checks)}});
}

asio::awaitable<Reply> restore_session(Context* ctx, std::string id, Request req) {
  auto body = parse_object(req.body);
  if (!body) co_return error_reply(body.error());
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

asio::awaitable<Reply> files_route(Context* ctx, RouteId route, std::string id, Request req) {
  // Decode everything before touching the session, so bad input is 400 whatever the session.
  std::string path;
  std::string to;
  bool recursive = false;
  if (route == RouteId::kMkdir || route == RouteId::kRename) {
    auto body = parse_object(req.body);
    if (!body) co_return error_reply(body.error());
    if (route == RouteId::kMkdir) {
      auto p = decode_mkdir(*body);
      if (!p) co_return error_reply(p.error());
      path = std::move(*p);
    } else {
      auto r = decode_rename(*body);
      if (!r) co_return error_reply(r.error());
      path = std::move(r->from);
      to = std::move(r->to);
    }
  } else {
    auto p = required_query(req, "path");
    if (!p) co_return error_reply(p.error());
    path = std::move(*p);
    if (route == RouteId::kFileDelete) {
      auto rec = bool_query(req, "recursive");
      if (!rec) co_return error_reply(rec.error());
      recursive = *rec;
    }
  }
  Caller caller = req.caller;
  auto sb = co_await acquire_sandbox(ctx, id, false, caller);
  if (!sb) co_return error_reply(sb.error());
  std::shared_ptr<sandbox::Sandbox> box = std::move(*sb);

  switch (route) {
    case RouteId::kStat: {
      auto job6 = run_blocking(ctx->pool, [box, path] { return box->stat(path); });
      auto r = co_await std::move(job6);
      if (!r) co_return error_reply(r.error());
      co_return json_reply(200, encode_file_info(*r));
    }
    case RouteId::kDir: {
      auto job7 = run_blocking(ctx->pool, [box, path] { return box->read_dir(path); });
      auto r = co_await std::move(job7);
      if (!r) co_return error_reply(r.error());
      co_return json_reply(200, encode_dir(*r));
    }
    case RouteId::kMkdir: {
      auto job8 = run_blocking(ctx->pool, [box, path] { return box->mkdir_all(path); });
      auto r = co_await std::move(job8);
      if (!r) co_return error_reply(r.error());
      ojson fields = {{"path", path}};
      audit(ctx, "file.mkdir", caller, id, fields);
      co_return json_reply(200, {{"path", path}});
    }
    case RouteId::kFileDelete: {
      auto job9 = run_blocking(ctx->pool, [box, path, recursive] {
        return recursive ? box->remove_all(path) : box->remove(path);
      });
      auto r = co_await std::move(job9);
      if (!r) co_return error_reply(r.error());
      ojson fields = {{"path", path}, {"recursive", recursive}};
      audit(ctx, "file.delete", caller, id, fields);
      co_return json_reply(200, {{"path", path}});
    }
    case RouteId::kRename: {
      auto job10 = run_blocking(ctx->pool, [box, path, to] { return box->rename(path, to); });
      auto r = co_await std::move(job10);
      if (!r) co_return error_reply(r.error());
      ojson fields = {{"from", path}, {"to", to}};
      audit(ctx, "file.rename", caller, id, fields);
      co_return json_reply(200, {{"from", path}, {"to", to}});
    }
    default: break;
  }
  co_return error_reply(Error::make(Code::kInternal, "unhandled file route"));
}

// Reads a whole regular file (up to `max` bytes) from an open reader.
Result<std::string> slurp(sandbox::FileReader reader, std::uint64_t max, const std::string& what) {
  if (reader.size > max) {
    return fail(Code::kTooBig, what + " is " + std::to_string(reader.size) +
                                   " bytes; /workspace/read returns at most " +
                                   std::to_string(max) + " (use GET /v1/sessions/{id}/files)");
  }
  std::string out;
  out.resize(static_cast<std::size_t>(reader.size));
  std::size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(reader.fd.get(), out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "read(" + what + ")");
    if (n == 0) break;  // the file shrank meanwhile
    got += static_cast<std::size_t>(n);
  }
  out.resize(got);
  return out;
}

// The shared dir serving `path`, and the path inside it, when `path` starts with its prefix.
const SharedFs* match_shared(const Context* ctx, const std::string& path, std::string* rest) {
  std::string_view p = path;
  while (!p.empty() && p.front() == '/') p.remove_prefix(1);
  for (const auto& s : ctx->shared) {
    if (p == s.prefix) {
      *rest = "";
      return &s;
    }
    if (p.size() > s.prefix.size() && p.substr(0, s.prefix.size()) == s.prefix &&
        p[s.prefix.size()] == '/') {
      *rest = std::string(p.substr(s.prefix.size() + 1));
      return &s;
    }
  }
  return nullptr;
}

asio::awaitable<Reply> seed_read(Context* ctx, Request req) {
  auto body = parse_object(req.body);
  if (!body) co_return error_reply(body.error());
  auto r = decode_seed_read(*body);
  if (!r) co_return error_reply(r.error());
  std::string rest;
  Result<std::string> content = std::unexpected(Error{});
  if (const SharedFs* shared = match_shared(ctx, r->path, &rest)) {
    const sandbox::RootedFs* fs = shared->fs.get();
    std::string what = r->path;
    auto job11 = run_blocking(ctx->pool, [fs, rest, what]() -> Result<std::string> {
      auto reader = fs->open_file(rest);
      if (!reader) return std::unexpected(reader.error());
      return slurp(std::move(*reader), kSeedReadMax, what);
    });
    content = co_await std::move(job11);
  } else {
    auto sb = co_await acquire_sandbox(ctx, r->session_id, false, req.caller);
    if (!sb) co_return error_reply(sb.error());
    std::shared_ptr<sandbox::Sandbox> box = std::move(*sb);
    std::string path = r->path;
    auto job12 = run_blocking(ctx->pool, [box, path]() -> Result<std::string> {
      auto reader = box->open_file(path);
      if (!reader) return std::unexpected(reader.error());
      return slurp(std::move(*reader), kSeedReadMax, path);
    });
    content = co_await std::move(job12);
  }
  if (!content) co_return error_reply(content.error());
  std::size_t size = content->size();
  co_return json_reply(200, {{"content", std::move(*content)}, {"size", size}});
}

asio::awaitable<Reply> seed_write(Context* ctx, Request req) {
  auto body = parse_object(req.body);
  if (!body) co_return error_reply(body.error());
  auto r = decode_seed_write(*body);
  if (!r) co_return error_reply(r.error());
  std::string rest;
  if (match_shared(ctx, r->path, &rest)) {
    co_return error_reply(Error::make(Code::kAccess, "shared dir " + r->path + " is read-only"));
  }
  // Like seed 001's /exec, a write makes the agent's workspace if it has none yet.
  auto sb = co_await acquire_sandbox(ctx, r->session_id, true, req.caller);
  if (!sb) co_return error_reply(sb.error());
  std::shared_ptr<sandbox::Sandbox> box = std::move(*sb);
  std::string session_id = r->session_id;
  std::string written_path = r->path;
  sandbox::WriteOptions opts;
  opts.mkdirs = true;  // seed 001 agents write "repos/site/index.html" into fresh trees
  opts.max_bytes = ctx->opts.max_file_bytes;
  auto job13 = run_blocking(ctx->pool, [box, r = std::move(*r), opts] {
    return box->write_file(r.path, r.content, opts);
  });
  auto n = co_await std::move(job13);
  if (!n) co_return error_reply(n.error());
  ojson fields = {{"path", written_path}, {"size", *n}};
  audit(ctx, "file.put", req.caller, session_id, fields);
  co_return json_reply(200, {{"bytes_written", *n}});
}

asio::awaitable<Reply> readyz(Context* ctx) {
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
  auto job14b = run_blocking(ctx->pool, [sm]() -> Result<json> {
    json usable = json::array();
    for (const auto& [name, b] : sm->config().backends) {
      if (b && b->check_usable()) usable.push_back(name);
    }
    return usable;
  });
  auto usable = co_await std::move(job14b);
  if (!usable) co_return error_reply(usable.error());
  co_return json_reply(200, {{"ready", true},
                             {"backend", backend->name()},
                             {"backends", std::move(*usable)},
                             {"features", features_json()}});
}

asio::awaitable<Reply> metrics(Context* ctx) {
  SessionManager* sm = ctx->sessions;
  auto job15 = run_blocking(ctx->pool, [sm]() -> Result<std::map<std::string, std::size_t>> {
    return sm->count_by_state();
  });
  auto counts = co_await std::move(job15);
  Reply r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = ctx->metrics.render(counts ? *counts : std::map<std::string, std::size_t>{});
  co_return r;
}

}  // namespace

Reply json_reply(int status, const json& j) {
  Reply r;
  r.status = status;
  r.body = to_wire(j);
  return r;
}

Reply error_reply(const Error& e) {
  Reply r;
  r.status = http_status(e);
  r.body = error_body(e);
  return r;
}

void audit(Context* ctx, std::string_view event, const session::Caller& caller,
           std::string_view session, const nlohmann::ordered_json& fields) {
  if (ctx->opts.audit) ctx->opts.audit->record(event, caller.tenant, session, fields);
}

Result<std::string> session_param(const Request& req) {
  auto it = req.params.find("id");
  if (it == req.params.end()) return fail(Code::kInternal, "route has no {id}");
  if (auto st = session::validate_id(it->second); !st) return std::unexpected(st.error());
  return it->second;
}

Result<std::string> required_query(const Request& req, const std::string& name) {
  auto it = req.query.find(name);
  if (it == req.query.end() || it->second.empty()) {
    return fail(Code::kInvalid, "query parameter '" + name + "' is required");
  }
  return it->second;
}

Result<bool> bool_query(const Request& req, const std::string& name) {
  auto it = req.query.find(name);
  if (it == req.query.end()) return false;
  const std::string& v = it->second;
  if (v == "true" || v == "1" || v.empty()) return true;
  if (v == "false" || v == "0") return false;
  return fail(Code::kInvalid, "query parameter '" + name + "' must be true or false");
}

asio::awaitable<Result<std::shared_ptr<sandbox::Sandbox>>> acquire_sandbox(Context* ctx,
                                                                           std::string id,
                                                                           bool create_if_missing,
                                                                           session::Caller caller) {
  SessionManager* sm = ctx->sessions;
  // The common case, a running session, without a hop through the pool and back.
  if (session::validate_id(id)) {
    if (auto box = sm->try_acquire_running(id, caller)) co_return box;
  }
  auto job16 = run_blocking(ctx->pool, [sm, id, create_if_missing, caller] {
    return sm->acquire(id, create_if_missing, caller);
  });
  co_return co_await std::move(job16);
}

asio::awaitable<Reply> handle_simple(Context* ctx, RouteId route, Request req) {
  switch (route) {
    case RouteId::kHealthz: {
      Reply r;
      r.content_type = "text/plain; charset=utf-8";
      r.body = "ok";
      co_return r;
    }
    case RouteId::kReadyz: co_return co_await readyz(ctx);
    case RouteId::kMetrics: co_return co_await metrics(ctx);
    case RouteId::kSessionCreate: co_return co_await create_session(ctx, std::move(req));
    case RouteId::kSessionList: co_return co_await list_sessions(ctx, req.caller);
    case RouteId::kSeedRead: co_return co_await seed_read(ctx, std::move(req));
    case RouteId::kSeedWrite: co_return co_await seed_write(ctx, std::move(req));
    default: break;
  }

  // Everything else is under /v1/sessions/{id}.
  auto id = session_param(req);
  if (!id) co_return error_reply(id.error());
  switch (route) {
    case RouteId::kSessionGet: {
      auto s = co_await get_session(ctx, *id, req.caller);
      if (!s) co_return error_reply(s.error());
      co_return session_reply(200, *s);
    }
    case RouteId::kSessionDelete: co_return co_await delete_session(ctx, *id, std::move(req));
    case RouteId::kSessionSuspend:
    case RouteId::kSessionResume:
    case RouteId::kSessionKeepalive: co_return co_await lifecycle(ctx, route, *id, std::move(req));
    case RouteId::kSessionHealth: co_return co_await session_health(ctx, *id, req.caller);
    case RouteId::kSessionRestore: co_return co_await restore_session(ctx, *id, std::move(req));
    case RouteId::kSessionRepair:
    case RouteId::kPty: {
      auto s = co_await get_session(ctx, *id, req.caller);
      if (!s) co_return error_reply(s.error());
      const char* what = route == RouteId::kSessionRepair ? "repair" : "pty (WebSocket)";
      co_return error_reply(not_implemented(what));
    }
    case RouteId::kStat:
    case RouteId::kDir:
    case RouteId::kMkdir:
    case RouteId::kFileDelete:
    case RouteId::kRename: co_return co_await files_route(ctx, route, *id, std::move(req));
    default: break;
  }
  co_return error_reply(Error::make(Code::kInternal, "no handler for this route"));
}

}  // namespace agentbox::server::detail
