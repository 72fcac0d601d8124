// Route handlers whose reply is one small body. Beast-free: they see a parsed Request and return
// a Reply; http_server.cc owns the connection. Blocking work goes to the pool (run_blocking).

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unistd.h>

#include "common/log.h"
#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/context.h"

namespace agentbox::server::detail {
namespace {

using session::SessionInfo;
using session::SessionManager;

// Largest file POST /workspace/read returns inline in JSON.
constexpr std::uint64_t kSeedReadMax = 32u << 20;

Reply session_reply(int status, const SessionInfo& s) {
  return json_reply(status, encode_session(s));
}

asio::awaitable<Result<SessionInfo>> get_session(Context* ctx, std::string id) {
  SessionManager* sm = ctx->sessions;
  auto job1 = run_blocking(ctx->pool, [sm, id] { return sm->get(id); });
  co_return co_await std::move(job1);
}

asio::awaitable<Reply> create_session(Context* ctx, Request req) {
  auto body = parse_object(req.body);
  if (!body) co_return error_reply(body.error());
  auto decoded = decode_create_session(*body);
  if (!decoded) co_return error_reply(decoded.error());
  SessionManager* sm = ctx->sessions;
  auto job2 = run_blocking(
      ctx->pool, [sm, d = std::move(*decoded)] { return sm->create_or_get(d.id, d.spec); });
  auto r = co_await std::move(job2);
  if (!r) co_return error_reply(r.error());
  if (r->second) spdlog::info("req={} session {} created", req.id, r->first.id);
  co_return session_reply(r->second ? 201 : 200, r->first);
}

asio::awaitable<Reply> list_sessions(Context* ctx) {
  SessionManager* sm = ctx->sessions;
  auto job3 = run_blocking(
      ctx->pool, [sm]() -> Result<std::vector<SessionInfo>> { return sm->list(); });
  auto list = co_await std::move(job3);
  if (!list) co_return error_reply(list.error());
  json arr = json::array();
  for (const auto& s : *list) arr.push_back(encode_session(s));
  co_return json_reply(200, {{"sessions", std::move(arr)}});
}

asio::awaitable<Reply> delete_session(Context* ctx, std::string id, Request req) {
  auto archive = bool_query(req, "archive");
  if (!archive) co_return error_reply(archive.error());
  if (*archive) {
    auto s = co_await get_session(ctx, id);
    if (!s) co_return error_reply(s.error());
    co_return error_reply(not_implemented("archive on delete"));
  }
  SessionManager* sm = ctx->sessions;
  auto job4 = run_blocking(ctx->pool, [sm, id] { return sm->destroy(id); });
  auto st = co_await std::move(job4);
  if (!st) co_return error_reply(st.error());
  spdlog::info("req={} session {} destroyed", req.id, id);
  co_return json_reply(200, {{"id", id}});
}

// resume and keepalive: any use brings a session up and marks it used.
asio::awaitable<Reply> touch_session(Context* ctx, std::string id) {
  auto sb = co_await acquire_sandbox(ctx, id, /*create_if_missing=*/false);
  if (!sb) co_return error_reply(sb.error());
  auto s = co_await get_session(ctx, id);
  if (!s) co_return error_reply(s.error());
  co_return session_reply(200, *s);
}

asio::awaitable<Reply> session_health(Context* ctx, std::string id) {
  auto s = co_await get_session(ctx, id);
  if (!s) co_return error_reply(s.error());
  json checks = json::array();
  bool healthy = true;
  auto add = [&](std::string name, bool ok, std::string detail) {
    healthy = healthy && ok;
    checks.push_back({{"name", std::move(name)}, {"ok", ok}, {"detail", std::move(detail)}});
  };
  auto sb = co_await acquire_sandbox(ctx, id, false);
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
  auto s = co_await get_session(ctx, id);
  if (s) co_return error_reply(Error::make(Code::kExists, "session " + id + " already exists"));
  if (s.error().code != Code::kNotFound) co_return error_reply(s.error());
  co_return error_reply(not_implemented("restore from archive"));
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
  auto sb = co_await acquire_sandbox(ctx, id, false);
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
      co_return json_reply(200, {{"path", path}});
    }
    case RouteId::kFileDelete: {
      auto job9 = run_blocking(ctx->pool, [box, path, recursive] {
        return recursive ? box->remove_all(path) : box->remove(path);
      });
      auto r = co_await std::move(job9);
      if (!r) co_return error_reply(r.error());
      co_return json_reply(200, {{"path", path}});
    }
    case RouteId::kRename: {
      auto job10 = run_blocking(ctx->pool, [box, path, to] { return box->rename(path, to); });
      auto r = co_await std::move(job10);
      if (!r) co_return error_reply(r.error());
      co_return json_reply(200, {{"from", path}, {"to", to}});
    }
    default:
      break;
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
    auto sb = co_await acquire_sandbox(ctx, r->session_id, false);
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
  auto sb = co_await acquire_sandbox(ctx, r->session_id, true);
  if (!sb) co_return error_reply(sb.error());
  std::shared_ptr<sandbox::Sandbox> box = std::move(*sb);
  sandbox::WriteOptions opts;
  opts.mkdirs = true;  // seed 001 agents write "repos/site/index.html" into fresh trees
  opts.max_bytes = ctx->opts.max_file_bytes;
  auto job13 = run_blocking(ctx->pool, [box, r = std::move(*r), opts] {
    return box->write_file(r.path, r.content, opts);
  });
  auto n = co_await std::move(job13);
  if (!n) co_return error_reply(n.error());
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
    co_return error_reply(Error::make(
        Code::kUnavailable, "backend " + std::string(backend ? backend->name() : "?") +
                                " is not usable: " + st.error().message));
  }
  co_return json_reply(200, {{"ready", true}, {"backend", backend->name()}});
}

asio::awaitable<Reply> metrics(Context* ctx) {
  SessionManager* sm = ctx->sessions;
  auto job15 = run_blocking(
      ctx->pool,
      [sm]() -> Result<std::map<std::string, std::size_t>> { return sm->count_by_state(); });
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

asio::awaitable<Result<std::shared_ptr<sandbox::Sandbox>>> acquire_sandbox(
    Context* ctx, std::string id, bool create_if_missing) {
  SessionManager* sm = ctx->sessions;
  auto job16 = run_blocking(ctx->pool, [sm, id, create_if_missing] {
    return sm->acquire(id, create_if_missing);
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
    case RouteId::kReadyz:
      co_return co_await readyz(ctx);
    case RouteId::kMetrics:
      co_return co_await metrics(ctx);
    case RouteId::kSessionCreate:
      co_return co_await create_session(ctx, std::move(req));
    case RouteId::kSessionList:
      co_return co_await list_sessions(ctx);
    case RouteId::kSeedRead:
      co_return co_await seed_read(ctx, std::move(req));
    case RouteId::kSeedWrite:
      co_return co_await seed_write(ctx, std::move(req));
    default:
      break;
  }

  // Everything else is under /v1/sessions/{id}.
  auto id = session_param(req);
  if (!id) co_return error_reply(id.error());
  switch (route) {
    case RouteId::kSessionGet: {
      auto s = co_await get_session(ctx, *id);
      if (!s) co_return error_reply(s.error());
      co_return session_reply(200, *s);
    }
    case RouteId::kSessionDelete:
      co_return co_await delete_session(ctx, *id, std::move(req));
    case RouteId::kSessionResume:
    case RouteId::kSessionKeepalive:
      co_return co_await touch_session(ctx, *id);
    case RouteId::kSessionHealth:
      co_return co_await session_health(ctx, *id);
    case RouteId::kSessionRestore:
      co_return co_await restore_session(ctx, *id, std::move(req));
    case RouteId::kSessionSuspend:
    case RouteId::kSessionRepair:
    case RouteId::kPty: {
      auto s = co_await get_session(ctx, *id);
      if (!s) co_return error_reply(s.error());
      const char* what = route == RouteId::kSessionSuspend ? "suspend"
                         : route == RouteId::kSessionRepair ? "repair"
                                                            : "pty (WebSocket)";
      co_return error_reply(not_implemented(what));
    }
    case RouteId::kStat:
    case RouteId::kDir:
    case RouteId::kMkdir:
    case RouteId::kFileDelete:
    case RouteId::kRename:
      co_return co_await files_route(ctx, route, *id, std::move(req));
    default:
      break;
  }
  co_return error_reply(Error::make(Code::kInternal, "no handler for this route"));
}

}  // namespace agentbox::server::detail
