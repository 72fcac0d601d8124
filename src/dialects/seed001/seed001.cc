// The seed 001 surface, exact: /exec, /exec-stream (served by exec.cc's runner), and
// /workspace/read|write, which also reach the read-only shared dirs.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/log.h"
#include "common/paths.h"
#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/exec.h"
#include "server/internal/forward.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {
namespace {

using session::Caller;
using session::SessionInfo;
using session::SessionManager;
using ojson = nlohmann::ordered_json;

// Largest file POST /workspace/read returns inline in JSON.
constexpr std::uint64_t kSeedReadMax = 32u << 20;

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

// Seed 001's /workspace/read and /workspace/write reach the agent's workspace (and the shared
// dir prefixes, matched before): `path` relative to it, or absolute under it. Anything else
// ("/etc/passwd", "/tmp/x", "../x") is 403, as the seed's lexical check refused it.
Result<std::string> in_workspace(const std::string& path, std::string_view workspace) {
  std::string ws(workspace);
  while (ws.size() > 1 && ws.back() == '/') ws.pop_back();
  const std::string joined = !path.empty() && path.front() == '/' ? path : ws + "/" + path;
  std::string norm = std::filesystem::path(joined).lexically_normal().string();
  while (norm.size() > 1 && norm.back() == '/') norm.pop_back();
  if (!paths::at_or_under(norm, ws)) {
    return fail(Code::kAccess, "path '" + path +
                                   "' is outside the agent's workspace (give a path in it, or "
                                   "under a shared dir prefix)");
  }
  return norm;
}

asio::awaitable<Reply> seed_read(Context* ctx, Request* rq) {
  Request& req = *rq;
  auto body = body_object(&req);
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
    auto confined = in_workspace(r->path, box->workspace());
    if (!confined) co_return error_reply(confined.error());
    std::string path = *confined;
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

asio::awaitable<Reply> seed_write(Context* ctx, Request* rq) {
  Request& req = *rq;
  auto body = body_object(&req);
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
  auto confined = in_workspace(r->path, box->workspace());
  if (!confined) co_return error_reply(confined.error());
  sandbox::WriteOptions opts;
  opts.mkdirs = true;  // seed 001 agents write "repos/site/index.html" into fresh trees
  opts.max_bytes = ctx->opts.max_file_bytes;
  // The path as the client gave it (the audit line names it so); the box resolves it to the
  // same place the confinement check did.
  auto n = co_await ctx->svc->files.write(origin_of(req, service::Surface::kSeed001), r->session_id,
                                          r->path, std::move(r->content), opts);
  if (!n) co_return error_reply(n.error());
  co_return json_reply(200, {{"bytes_written", *n}});
}

// Cluster mode: a request for an agent another node holds is served there (the JSON body the
// transport read is sent on as it is); anything else is `Fn`'s here.
template <asio::awaitable<bool> (*Fn)(Call*)>
asio::awaitable<bool> routed(Call* call) {
  Request& req = call->ex.req;
  if (call->ctx->opts.cluster && !req.forwarded) {
    Result<std::string> agent = fail(Code::kInvalid, "no body");
    if (req.parsed && *req.parsed) {
      agent = decode_seed_agent(**req.parsed);
    } else if (!req.parsed) {
      auto body = parse_object(req.body);
      if (body) agent = decode_seed_agent(*body);
    }
    if (agent) {
      if (auto f = co_await forward_session(call, *agent, "", /*buffered=*/true)) {
        co_return *f;
      }
    }
  }
  co_return co_await Fn(call);
}

}  // namespace

std::vector<RouteSpec> seed001_routes() {
  using B = BodyKind;
  using R = RouteId;
  return {
      {R::kSeedExec, "POST", "/exec", B::kJson, true, routed<seed_exec>},
      {R::kSeedExecStream, "POST", "/exec-stream", B::kJson, true, routed<seed_exec_stream>},
      {R::kSeedRead, "POST", "/workspace/read", B::kJson, true, routed<simple<seed_read>>},
      {R::kSeedWrite, "POST", "/workspace/write", B::kJson, true, routed<simple<seed_write>>},
  };
}

}  // namespace agentbox::server::detail
