// The E2B dialect (shared/E2B-MCP.md parts 1-6): everything under /e2b, so that the stock E2B
// SDKs work with E2B_API_URL = E2B_SANDBOX_URL = http://host:port/e2b.
//
// Routing: a request with an E2b-Sandbox-Id header is envd traffic for that sandbox (GET
// /health, /process.Process/*, and the files side's /files and /filesystem.Filesystem/*,
// e2b_files.cc); anything else is the control plane (/sandboxes, /v2/sandboxes). A sandbox is an
// agentbox session; the dialect has no sandbox logic of its own.
//
// Auth: the control plane takes X-API-KEY as an agentbox bearer token (the transport matches it
// against the tenants, http_server.cc); envd takes the sandbox's envdAccessToken in
// X-Access-Token, an HMAC of the session (tenant, id, creation time) under a key kept in the data
// dir: nothing to store, and a session made again under the same id gets a new token.
//
// Errors: the control plane answers {"code":<status>,"message"}; envd's Connect calls answer
// Connect error codes, its REST routes {"code":<status>,"message"}; an unknown sandbox is what
// E2B's edge answers, 502 {"sandboxId","message","code":502} (the SDK reads it as "not running").

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "common/log.h"
#include "common/text_codec.h"
#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/forward.h"
#include "dialects/e2b/e2b.h"
#include "server/internal/surfaces.h"

namespace agentbox::server::detail {

namespace {

using connectrpc::CallKind;
using connectrpc::RpcError;
namespace rpc = connectrpc;

Reply sandbox_not_found(const std::string& id) {
  json j = json::object();
  j["sandboxId"] = id;
  j["message"] = "The sandbox was not found";
  j["code"] = 502;
  return json_reply(502, j);
}

bool is_rpc_path(std::string_view path) {
  return path.rfind("/process.Process/", 0) == 0 || path.rfind("/filesystem.Filesystem/", 0) == 0;
}

// ---- envd access tokens

class TokenKey {
 public:
  // The key in <data_dir>/e2b-envd.key (256 random bits as hex, 0600), made on first use.
  Result<std::string> get(const std::string& data_dir) {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = keys_.find(data_dir); it != keys_.end()) return it->second;
    const std::string path = data_dir + "/e2b-envd.key";
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd && errno == ENOENT) {
      const std::string b = random_hex(32);  // 256 random bits
      const std::string tmp = path + ".tmp";
      UniqueFd w(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
      if (!w) return fail_errno(errno, "open(" + tmp + ")");
      if (::write(w.get(), b.data(), b.size()) != static_cast<ssize_t>(b.size()) ||
          ::fsync(w.get()) != 0) {
        return fail_errno(errno, "write(" + tmp + ")");
      }
      // link() fails when another daemon made one first: then that one is the key.
      if (::link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST) {
        int err = errno;
        ::unlink(tmp.c_str());
        return fail_errno(err, "link(" + path + ")");
      }
      ::unlink(tmp.c_str());
      fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    }
    if (!fd) return fail_errno(errno, "open(" + path + ")");
    char buf[128];
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 32) return fail(Code::kInternal, path + " holds no key (32 bytes or more)");
    return keys_[data_dir] = std::string(buf, static_cast<std::size_t>(n));
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> keys_;  // by data dir
};

TokenKey& token_key() {
  static TokenKey k;
  return k;
}


}  // namespace

// The envdAccessToken of a session (any thread).
Result<std::string> envd_token(Context* ctx, const session::SessionInfo& s) {
  std::string key = AB_TRY(token_key().get(ctx->sessions->config().data_dir));
  auto created = std::chrono::duration_cast<std::chrono::milliseconds>(
                     s.created_at.time_since_epoch())
                     .count();
  std::string msg = "e2b-envd-v1\n" + s.tenant + "\n" + s.id + "\n" + std::to_string(created);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac, &len) == nullptr) {
    return fail(Code::kInternal, "HMAC failed");
  }
  return "ea_" + hex_encode(std::string_view(reinterpret_cast<const char*>(mac), len));
}

// ---- replies in the control plane's and envd REST's convention

Reply e2b_error(int status, std::string message) {
  json j = json::object();
  j["code"] = status;
  j["message"] = std::move(message);
  return json_reply(status, j);
}

Reply control_error(const Error& e) {
  return e2b_error(http_status(e), std::string(code_name(e.code)) + ": " + e.message);
}

// ---- the Connect pieces shared with e2b_files.cc

asio::awaitable<Result<std::shared_ptr<sandbox::Sandbox>>> envd_sandbox(EnvdCall* env) {
  co_return co_await acquire_sandbox(env->call->ctx, env->sandbox_id, /*create_if_missing=*/false,
                                     env->owner);
}

asio::awaitable<std::expected<RpcRequest, RpcError>> read_rpc(EnvdCall* env, CallKind want,
                                                              bool* gone) {
  *gone = false;
  Call* call = env->call;
  RpcRequest r;
  r.kind = want;
  // Headers first: a chunked body's parser takes the head over.
  auto kind = rpc::call_kind(header_value(call, "Content-Type"));
  auto version = rpc::check_protocol_version(header_value(call, "Connect-Protocol-Version"),
                                             has_header(call, "Connect-Protocol-Version"));
  auto timeout = rpc::parse_timeout(header_value(call, "Connect-Timeout-Ms"),
                                    has_header(call, "Connect-Timeout-Ms"));
  std::string ping = header_value(call, "Keepalive-Ping-Interval");
  if (!kind) {
    co_return std::unexpected(RpcError::make(
        rpc::Code::kUnimplemented,
        "Content-Type '" + header_value(call, "Content-Type") +
            "' is not served: agentbox speaks Connect with the JSON codec (application/json, "
            "application/connect+json)",
        415));
  }
  if (*kind != want) {
    co_return std::unexpected(RpcError::make(
        rpc::Code::kInvalidArgument,
        env->path + (want == CallKind::kUnary ? " is a unary method (application/json)"
                                              : " is a server-streaming method "
                                                "(application/connect+json)")));
  }
  if (version) co_return std::unexpected(*version);
  if (!timeout) co_return std::unexpected(timeout.error());
  r.timeout = *timeout;
  if (!ping.empty()) {
    bool digits = ping.size() <= 6;
    int v = 0;
    for (char c : ping) {
      digits = digits && c >= '0' && c <= '9';
      if (digits) v = v * 10 + (c - '0');
    }
    if (!digits || v == 0) {
      co_return std::unexpected(RpcError::make(
          rpc::Code::kInvalidArgument, "Keepalive-Ping-Interval must be a number of seconds"));
    }
    r.keepalive = std::chrono::seconds(v);
  }
  auto body = co_await read_whole_body(call, call->ctx->opts.max_json_bytes);
  if (!body) {
    if (body.error().code == Code::kUnavailable) *gone = true;
    co_return std::unexpected(rpc::from_error(body.error()));
  }
  auto msg = rpc::decode_request(*kind, *body);
  if (!msg) co_return std::unexpected(msg.error());
  r.message = std::move(*msg);
  co_return r;
}

asio::awaitable<bool> reply_rpc_error(EnvdCall* env, CallKind kind, RpcError e) {
  Call* call = env->call;
  if (call->ex.body_pending) call->ex.keep_alive = false;
  if (kind == CallKind::kUnary) co_return co_await send_reply(call, rpc::unary_error(e));
  rpc::StreamWriter w(call);
  co_return co_await w.end(std::move(e));
}

namespace {

// ---- envd

// Authorization: Basic base64("<user>:") names the in-sandbox user; agentbox has one uid per
// session, which answers to "user", "root" and the session's own id.
std::optional<std::string> basic_user(const std::string& header, bool* malformed) {
  *malformed = false;
  if (header.empty()) return std::nullopt;
  constexpr std::string_view kBasic = "basic ";
  if (header.size() <= kBasic.size() || !beast::iequals(header.substr(0, kBasic.size()), kBasic)) {
    *malformed = true;
    return std::nullopt;
  }
  auto dec = base64_decode(header.substr(kBasic.size()), "Authorization");
  if (!dec) {
    *malformed = true;
    return std::nullopt;
  }
  return dec->substr(0, dec->find(':'));
}

asio::awaitable<bool> serve_envd(Call* call, std::string sandbox_id, std::string path) {
  Context* ctx = call->ctx;
  const bool rpc_call = is_rpc_path(path);
  const CallKind kind =
      rpc::call_kind(header_value(call, "Content-Type")).value_or(CallKind::kUnary);
  EnvdCall env;
  env.call = call;
  env.sandbox_id = sandbox_id;
  env.path = path;
  auto refuse = [&](int status, rpc::Code code, std::string message) -> asio::awaitable<bool> {
    if (rpc_call) {
      return reply_rpc_error(&env, kind, RpcError::make(code, std::move(message), status));
    }
    if (call->ex.body_pending) call->ex.keep_alive = false;
    return send_reply(call, e2b_error(status, std::move(message)));
  };
  // The session, as the daemon sees it: envd requests carry no API key, the token names the
  // tenant.
  session::SessionManager* sm = ctx->sessions;
  auto job = run_blocking(ctx->pool, [sm, sandbox_id] {
    return sm->get(sandbox_id, session::Caller::daemon());
  });
  auto info = co_await std::move(job);
  const std::string given = header_value(call, "X-Access-Token");
  if (!info) {
    if (call->ex.body_pending) call->ex.keep_alive = false;
    co_return co_await send_reply(call, sandbox_not_found(sandbox_id));
  }
  auto want = envd_token(ctx, *info);
  if (!want) co_return co_await refuse(500, rpc::Code::kInternal, want.error().message);
  // SECURITY: constant time in the token's content.
  if (given.size() != want->size() ||
      CRYPTO_memcmp(given.data(), want->data(), want->size()) != 0) {
    std::string why = "X-Access-Token is not this sandbox's envdAccessToken";
    if (given.empty()) why = "X-Access-Token is required (the sandbox's envdAccessToken)";
    co_return co_await refuse(401, rpc::Code::kUnauthenticated, std::move(why));
  }
  env.owner = session::Caller(info->tenant, false, 0);
  bool malformed = false;
  auto user = basic_user(header_value(call, "Authorization"), &malformed);
  if (malformed) {
    co_return co_await refuse(401, rpc::Code::kUnauthenticated,
                              "Authorization must be Basic base64(\"<user>:\")");
  }
  if (user && !user->empty() && *user != "user" && *user != "root" && *user != sandbox_id) {
    co_return co_await refuse(401, rpc::Code::kUnauthenticated,
                              "user '" + *user +
                                  "' does not exist in this sandbox (it has one user: 'user', "
                                  "also known as 'root')");
  }
  if (user) env.user = *user;

  const std::string& method = call->ex.req.method;
  if (path == "/health") {
    if (method != "GET") co_return co_await refuse(405, rpc::Code::kUnimplemented, "GET /health only");
    // Running means its box is up; a paused sandbox is not running (E2B: the edge answers 502).
    if (info->state != session::State::kRunning) {
      co_return co_await send_reply(call, sandbox_not_found(sandbox_id));
    }
    Reply r;
    r.status = 204;
    r.content_type.clear();
    co_return co_await send_reply(call, std::move(r));
  }
  if (path == "/files") co_return co_await serve_envd_files(&env);
  constexpr std::string_view kProcess = "/process.Process/";
  constexpr std::string_view kFs = "/filesystem.Filesystem/";
  if (path.rfind(kProcess, 0) == 0 || path.rfind(kFs, 0) == 0) {
    if (method != "POST") {
      co_return co_await refuse(405, rpc::Code::kUnimplemented,
                                "Connect calls are POST (GET is not supported)");
    }
    if (path.rfind(kProcess, 0) == 0) {
      co_return co_await serve_process(&env, path.substr(kProcess.size()));
    }
    co_return co_await serve_filesystem(&env, path.substr(kFs.size()));
  }
  co_return co_await refuse(404, rpc::Code::kUnimplemented,
                            method + " " + path + " is not an envd route agentbox serves");
}

// Every method on /e2b/{path}.
asio::awaitable<bool> e2b_serve(Call* call) {
  const Request& req = call->ex.req;
  std::string path = "/" + req.params.at("path");
  std::string sandbox = header_value(call, "E2b-Sandbox-Id");
  // Cluster mode: a sandbox another node holds is served there, envd and control plane alike
  // (the owner checks envd's X-Access-Token, minted under its own key).
  const std::string target(call->hp->get().target());
  if (!sandbox.empty()) {
    if (auto f = co_await forward_session(call, sandbox, target, false)) co_return *f;
    co_return co_await serve_envd(call, std::move(sandbox), std::move(path));
  }
  // SECURITY: the transport set the caller from Authorization or X-API-KEY; a nameless caller
  // matched no token.
  if (req.caller.tenant.empty()) {
    if (call->ex.body_pending) call->ex.keep_alive = false;
    co_return co_await send_reply(call, e2b_error(401, "missing or invalid X-API-KEY"));
  }
  // /sandboxes/{id}... and /v2/sandboxes/{id}...
  {
    std::string_view p = path;
    if (p.starts_with("/v2/")) p.remove_prefix(3);
    constexpr std::string_view kSandboxes = "/sandboxes/";
    if (p.starts_with(kSandboxes)) {
      p.remove_prefix(kSandboxes.size());
      std::string id(p.substr(0, p.find('/')));
      if (auto f = co_await forward_session(call, std::move(id), target, false)) co_return *f;
    }
  }
  co_return co_await serve_control(call, std::move(path));
}


}  // namespace

std::vector<RouteSpec> e2b_routes() {
  std::vector<RouteSpec> out;
  // Auth is the dialect's own (X-API-KEY, X-Access-Token): needs_auth false, checked in e2b_serve.
  for (std::string_view m : {"GET", "POST", "PUT", "PATCH", "DELETE"}) {
    out.push_back({RouteId::kE2b, m, "/e2b/{path}", BodyKind::kRaw, false, e2b_serve,
                   RouteKind::kHttp, /*subtree=*/true});
  }
  return out;
}

}  // namespace agentbox::server::detail
