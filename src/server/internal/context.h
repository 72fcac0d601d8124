#pragma once
// State shared by the connection code (http_server.cc) and the route handlers (handlers.cc).
// Owned by HttpServer; used on the io_context thread, except `sessions`, the sandboxes and the
// shared-dir RootedFs, which are thread-safe and are called from the pool.

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sandbox/health_checks.h"
#include "sandbox/rooted_fs.h"
#include "sandbox/sandbox.h"
#include "server/audit.h"
#include "server/http_server.h"
#include "server/json_codec.h"
#include "server/metrics.h"
#include "server/routes.h"
#include "service/services.h"
#include "service/ws_tickets.h"
#include "session/session_manager.h"

namespace agentbox::server::detail {

namespace asio = boost::asio;

struct SharedFs {
  std::string prefix;
  std::unique_ptr<sandbox::RootedFs> fs;  // RootMode::kBeneath on the shared dir
};

class McpSessions;   // mcp.cc: the MCP surface's Mcp-Session-Ids
class LangbotState;  // langbot.cc: the bound instance, generation fences, relays
class E2bProcesses;  // e2b_process.cc: what E2B's process.Process keeps beside the tables
class RunnerFollow;  // runner_follow.cc: a remote session following its runner (cluster mode)

struct Context {
  asio::io_context* ioc = nullptr;
  asio::thread_pool* pool = nullptr;
  service::Services* svc = nullptr;             // the operations (service/services.h)
  session::SessionManager* sessions = nullptr;  // svc->manager(), for what has no operation yet
  std::shared_ptr<sandbox::Backend> default_backend;
  ServerOptions opts;
  Metrics metrics;
  std::vector<SharedFs> shared;                 // longest prefix first
  bool stopping = false;                        // shutdown() ran: replies say "Connection: close"
  std::shared_ptr<McpSessions> mcp;             // made by the MCP surface on first use
  std::shared_ptr<LangbotState> langbot;        // made by the LangBot surface on first use
  std::shared_ptr<E2bProcesses> e2b_processes;  // made by the E2B surface on first use
  std::shared_ptr<RunnerFollow> runner_follow;  // cluster mode with runners; made at start
  service::WsTickets tickets;  // POST /v1/ws-tickets (dashboard.cc), redeemed by the transport
};

// One parsed request, as the handlers see it.
struct Request {
  std::uint64_t id = 0;  // for logs
  std::string method;
  std::string path;                           // without the query
  std::map<std::string, std::string> query;   // decoded
  std::map<std::string, std::string> params;  // route template parameters, decoded
  std::string body;                           // JSON routes only
  std::string accept;                         // the Accept header (POST /v1/images: NDJSON)
  // A big JSON body, already parsed in the pool by the transport (body_object() takes it).
  std::optional<Result<json>> parsed;
  // The authenticated tenant. SECURITY: the default (no token matched, only on routes that
  // need no auth) is a nameless non-admin that owns no session.
  session::Caller caller{"", false, 0};
  // Cluster mode: sent by another node with a valid X-Agentbox-Forwarded (forward.h); served
  // here, never forwarded again, and GET /v1/sessions lists only this node's sessions.
  bool forwarded = false;
};

struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
};

Reply json_reply(int status, const json& j);
Reply error_reply(const Error& e);

// The Origin of a service/ operation made for `req` through `surface`.
inline service::Origin origin_of(const Request& req, service::Surface surface) {
  return service::Origin(req.caller, req.id, surface);
}

// Helpers shared by the surfaces.
// The request body as a JSON object (parse_object), parsed by the transport when it was big.
Result<json> body_object(Request* req, bool allow_empty = false);
// The body of a route that takes no fields (suspend, resume, keepalive, health, repair): empty or
// an object without fields ({}); a field is EINVAL naming it (API.md "General").
Status empty_body(Request* req);
// The session id of a /v1/sessions/{id}/... route, validated (EINVAL otherwise).
Result<std::string> session_param(const Request& req);
// A required query parameter, e.g. "path".
Result<std::string> required_query(const Request& req, const std::string& name);
// "true"/"1" or "false"/"0"/absent; anything else is EINVAL naming the parameter.
Result<bool> bool_query(const Request& req, const std::string& name);
// The live sandbox of an existing session (ENOENT "no such session"), or a new one when
// create_if_missing. Runs on the pool.
// A session made or resumed here is told by the manager's events (audited from there).
asio::awaitable<Result<std::shared_ptr<sandbox::Sandbox>>> acquire_sandbox(Context* ctx,
                                                                           std::string id,
                                                                           bool create_if_missing,
                                                                           session::Caller caller);

}  // namespace agentbox::server::detail
