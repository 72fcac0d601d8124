#pragma once
// The route tables of the surfaces; route_specs() (routes.cc) is their concatenation. Each
// surface lives in its own file and owns its handlers.

#include <vector>

#include "server/routes.h"
#include "session/events.h"
#include "session/session_manager.h"
#include "sandbox/health_checks.h"

namespace agentbox::server::detail {

struct Context;

std::vector<RouteSpec> session_routes();    // v1_sessions.cc: /v1/sessions...
std::vector<RouteSpec> exec_routes();       // exec.cc: /v1/sessions/{id}/exec[/stream]
std::vector<RouteSpec> file_routes();       // files.cc: files, stat, dir, mkdir, rename
std::vector<RouteSpec> seed001_routes();    // seed001.cc: /exec, /exec-stream, /workspace/*
std::vector<RouteSpec> ops_routes();        // ops.cc: /healthz, /readyz, /metrics
std::vector<RouteSpec> process_routes();   // processes.cc: /v1/sessions/{id}/processes..., /pty
std::vector<RouteSpec> event_routes();      // events.cc: GET /v1/events (WebSocket)
std::vector<RouteSpec> runner_routes();     // runners.cc: GET /ws/{user}, GET /v1/runners
std::vector<RouteSpec> mcp_routes();        // mcp.cc: /v1/sessions/{id}/mcp (MCP, streamable HTTP)
std::vector<RouteSpec> langbot_routes();    // langbot.cc: /rpc/ws, LangBot's managed-process relay
std::vector<RouteSpec> e2b_routes();        // e2b.cc: /e2b/{path} (E2B control plane and envd)
std::vector<RouteSpec> health_routes();     // health.cc: health, repair, packages
std::vector<RouteSpec> template_routes();   // templates.cc: /v1/templates...
std::vector<RouteSpec> audit_routes();      // audit_route.cc: GET /v1/audit
std::vector<RouteSpec> dashboard_routes();  // dashboard.cc: /ui/, POST /v1/ws-tickets
std::vector<RouteSpec> cluster_routes();    // cluster_routes.cc: /v1/cluster, cordons
std::vector<RouteSpec> image_routes();      // images.cc: /v1/images...
std::vector<RouteSpec> not_built_routes();  // not_built.cc: API.md routes not built yet (501)
// not_built.cc: the handler of a not-built route (501 ENOTSUP naming the route).
boost::asio::awaitable<bool> not_built(Call* call);

}  // namespace agentbox::server::detail
