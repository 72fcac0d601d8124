// The files side of the E2B dialect (shared/E2B-MCP.md 3.3, 3.4): REST /files and
// filesystem.Filesystem. Not built in this file yet: each answers, in its own convention, that
// it is not built (REST: 501 JSON; Connect: unimplemented naming the method).

#include "server/internal/e2b.h"

namespace agentbox::server::detail {

asio::awaitable<bool> serve_envd_files(EnvdCall* env) {
  json j = {{"code", 501},
            {"message", env->call->ex.req.method + " " + env->path +
                            " is not built in agentbox's E2B dialect yet"}};
  if (env->call->ex.body_pending) env->call->ex.keep_alive = false;
  Reply r = json_reply(501, j);
  co_return co_await send_reply(env->call, std::move(r));
}

asio::awaitable<bool> serve_filesystem(EnvdCall* env, std::string method) {
  auto kind = connectrpc::call_kind(header_value(env->call, "Content-Type"))
                  .value_or(connectrpc::CallKind::kUnary);
  connectrpc::RpcError e = connectrpc::RpcError::make(
      connectrpc::Code::kUnimplemented,
      "filesystem.Filesystem/" + method + " is not built in agentbox's E2B dialect yet");
  co_return co_await reply_rpc_error(env, kind, std::move(e));
}

}  // namespace agentbox::server::detail
