#pragma once
// The route table of agentboxd. The router is driven by route_specs() itself, so the served
// routes, route_table() and the OpenAPI document (checked against route_table() by a test)
// cannot drift apart. Each entry owns its handler: the table is assembled from one table per
// surface (v1 sessions, exec, files, seed 001, ops, events, not built), each in its own file.
// Matching is plain string work; nothing here knows about Beast.

#include <boost/asio/awaitable.hpp>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace agentbox::server {

enum class RouteId {
  // Sessions
  kSessionCreate,
  kSessionList,
  kSessionGet,
  kSessionDelete,
  kSessionSuspend,
  kSessionResume,
  kSessionKeepalive,
  kSessionRestore,
  kSessionHealth,
  kSessionRepair,
  kSessionNetwork,
  kSessionUpdate,
  kSessionMounts,
  kSessionPackages,
  // Exec
  kExec,
  kExecStream,
  // Files
  kFileGet,
  kFilePut,
  kFileDelete,
  kStat,
  kDir,
  kMkdir,
  kRename,
  // Seed 001
  kSeedExec,
  kSeedExecStream,
  kSeedRead,
  kSeedWrite,
  // Ops
  kHealthz,
  kReadyz,
  kMetrics,
  // Processes and terminals
  kProcessStart,
  kProcessList,
  kProcessGet,
  kProcessDelete,
  kProcessOutput,
  kProcessStdin,
  kProcessSignal,
  kProcessResize,
  kProcessAttach,
  kPty,
  // WebSocket
  kEvents,
  // Dialects
  kMcpPost,
  kMcpDelete,
  kLangbotRpc,
  kLangbotRelay,
  kLangbotRelayLegacy,
  kE2b,  // everything under /e2b (e2b.cc)
  // Templates
  kTemplateCreate,
  kTemplateList,
  kTemplateGet,
  kTemplateDelete,
  kTemplateBuild,
  kTemplateBuildGet,
  kTemplateBuildLog,
  kTemplateSnapshots,
  kTemplateRollback,
  // Dashboard
  kUiRedirect,
  kUiIndex,
  kUiFile,
  kWsTicket,
  kAudit,
  // Runners
  kRunnerWs,
  kRunnerList,
  // Cluster
  kCluster,
  kClusterCordon,
  kClusterUncordon,
  // Routes of API.md not built yet: each answers 501 ENOTSUP naming itself.
  kNotBuilt,
};

// How a route is served.
enum class RouteKind {
  kHttp,       // a request and its response
  kWebSocket,  // GET with an Upgrade: websocket; a plain GET is 426
  kNotBuilt,   // documented in API.md, not in this version: 501 ENOTSUP naming the route
};

namespace detail {
struct Call;  // one request on its connection (internal/transport.h)
}
// A route's handler: answers the request on its connection; returns whether the connection may
// serve another request.
using Handler = boost::asio::awaitable<bool> (*)(detail::Call* call);

// What a route reads as its request body.
enum class BodyKind {
  kNone,  // nothing expected; a small body is read and ignored (bounded like JSON)
  kJson,  // a JSON object, bounded (413 ETOOBIG beyond the JSON cap)
  kRaw,   // streamed by the handler itself (file upload), bounded by the file cap
};

struct RouteSpec {
  RouteId id;
  std::string_view method;
  std::string_view path;  // OpenAPI-style template: "/v1/sessions/{id}/exec"
  BodyKind body;
  bool needs_auth;  // false only for GET /healthz and the dashboard's static files
  Handler handler;
  RouteKind kind = RouteKind::kHttp;
  // The last template parameter takes the rest of the path, slashes included ("/e2b/{path}").
  bool subtree = false;
};

// OpenAPI-style view of the table, for docs and their test.
struct RouteInfo {
  std::string method;
  std::string path;
};

const std::vector<RouteSpec>& route_specs();
std::vector<RouteInfo> route_table();

struct RouteMatch {
  const RouteSpec* route = nullptr;  // null: no route for this method and path
  std::map<std::string, std::string> params;  // template parameters, percent-decoded
  std::vector<std::string> allowed;  // when route is null but the path exists: its methods
};

// `path` is the request target without the query string.
RouteMatch match_route(std::string_view method, std::string_view path);

// Percent-decoding; with plus_as_space "+" is a space (query strings). Malformed escapes are
// EINVAL.
Result<std::string> url_decode(std::string_view s, bool plus_as_space);

// "a=1&b=x%20y" -> {a:1, b:"x y"}; the first of repeated keys wins. Malformed escapes are EINVAL.
Result<std::map<std::string, std::string>> parse_query(std::string_view query);

}  // namespace agentbox::server
