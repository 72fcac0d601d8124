#pragma once
// What the E2B dialect's files (e2b.cc: routing, control plane, envd auth, process.Process;
// e2b_files.cc: REST /files and filesystem.Filesystem) share. shared/E2B-MCP.md parts 1-6.
//
// Everything is under /e2b (E2B_API_URL = E2B_SANDBOX_URL = http://host:port/e2b). A request
// with an E2b-Sandbox-Id header is envd traffic for that sandbox (= agentbox session),
// authenticated by its X-Access-Token (the per-sandbox envdAccessToken); any other request is
// the control plane, authenticated by X-API-KEY (an agentbox bearer token: tenants apply).
//
// An envd request reaches its service with the sandbox known and its token checked: `EnvdCall`
// names the session and its owner. Connect-RPC calls read their request with read_rpc() and
// answer with reply_rpc_error() / connectrpc::unary_ok / connectrpc::StreamWriter.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "dialects/e2b/connect.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {

// The envd version the create/connect replies advertise: the highest whose gated features
// (E2B-MCP.md 1.5) all work here. 0.5.7 turns on octet-stream/gzip uploads (the files side),
// 0.5.2 closeStdin, 0.4.0 "no default user", 0.3.0 the stdin option.
inline constexpr std::string_view kEnvdVersion = "0.5.7";

struct EnvdCall {
  Call* call = nullptr;
  std::string sandbox_id;        // the agentbox session
  session::Caller owner{"", false, 0};  // the session's tenant (envd carries no API key)
  std::string path;              // below /e2b: "/files", "/process.Process/Start", ...
  std::string user;              // Authorization: Basic "<user>:", "" when not sent
};

// The sandbox of an envd call, resumed when paused. ENOENT when it is gone.
asio::awaitable<Result<std::shared_ptr<sandbox::Sandbox>>> envd_sandbox(EnvdCall* env);

// A Connect request as read from the wire.
struct RpcRequest {
  connectrpc::CallKind kind = connectrpc::CallKind::kUnary;
  json message;
  std::optional<std::chrono::milliseconds> timeout;  // Connect-Timeout-Ms
  std::chrono::seconds keepalive{90};                // Keepalive-Ping-Interval (streams)
};

// Reads the body of an RPC and decodes it; `want` is the method's kind (a unary method called
// as a stream, or the reverse, is invalid_argument). Errors are for reply_rpc_error(), except
// the client leaving: then `*gone` is set and nothing may be sent.
asio::awaitable<std::expected<RpcRequest, connectrpc::RpcError>> read_rpc(
    EnvdCall* env, connectrpc::CallKind want, bool* gone);

// Answers an RPC with an error in its call kind's form (unary: status + JSON body; stream: 200
// and the end-of-stream envelope). Returns whether the connection stays open.
asio::awaitable<bool> reply_rpc_error(EnvdCall* env, connectrpc::CallKind kind,
                                      connectrpc::RpcError e);

// The control plane's and envd REST's error replies: {"code":<status>,"message"}; an agentbox
// error keeps its code's status (ENOENT 404, EEXIST 409, ...) and names its code.
Reply e2b_error(int status, std::string message);
Reply control_error(const Error& e);

// The envdAccessToken of a session (any thread).
Result<std::string> envd_token(Context* ctx, const session::SessionInfo& s);

// e2b_control.cc: the control plane (no E2b-Sandbox-Id), for an authenticated caller.
asio::awaitable<bool> serve_control(Call* call, std::string path);

// e2b_process.cc: /process.Process/<method>.
asio::awaitable<bool> serve_process(EnvdCall* env, std::string method);

// e2b_files.cc: GET|POST /files; e2b_filesystem.cc: /filesystem.Filesystem/<method>. Each
// answers the call.
asio::awaitable<bool> serve_envd_files(EnvdCall* env);
asio::awaitable<bool> serve_filesystem(EnvdCall* env, std::string method);

// The path and user rules of both file sides (e2b_files.cc).
// The E2B home of every sandbox (upstream: the user's home): relative paths resolve here.
inline constexpr std::string_view kE2bHome = "/workspace";
// An envd path as an absolute in-box path: relative ones and "~" are under /workspace.
Result<std::string> box_path(std::string_view p);
std::string parent_of(const std::string& abs);
std::string base_of(const std::string& abs);
// The in-box user name of a uid: the session's own is "user" (E2B's default user).
std::string user_name(const sandbox::Sandbox& sb, uid_t id);
// ?username= and Authorization's user name a user; agentbox has one per sandbox: the reason
// another name is refused, nullopt when it is fine.
std::optional<std::string> bad_user(const EnvdCall* env, const std::string& username);

}  // namespace agentbox::server::detail
