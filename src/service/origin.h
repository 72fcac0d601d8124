#pragma once
// Who asks for an operation, and through which door (shared/DESIGN.md "Architecture": service/).
// Every operation of service/ takes an Origin instead of an HTTP request: the same exec is the
// same operation whether it came through /v1, seed 001's /exec, LangBot's RPC, E2B's envd or an
// MCP tool, and the daemon's own doings (managed-process revival, auto-repair) are operations
// too. Below service/ nothing knows about callers (session/ knows tenants as Caller).

#include <cstdint>
#include <string_view>
#include <utility>

#include "session/session_manager.h"

namespace agentbox::service {

// The surface an operation came through (for logs; the audit line names the tenant).
enum class Surface { kV1, kSeed001, kLangbot, kE2b, kMcp, kRunner, kDaemon };
std::string_view surface_name(Surface s);  // "v1", "seed001", "langbot", "e2b", "mcp", ...

struct Origin {
  Origin(session::Caller who, std::uint64_t request, Surface via)
      : caller(std::move(who)), request_id(request), surface(via) {}
  // The daemon acting on its own account (revival, auto-repair, builds): an admin of tenant
  // "default" (session::Caller::daemon()).
  static Origin daemon() { return Origin(session::Caller::daemon(), 0, Surface::kDaemon); }

  session::Caller caller;    // the tenant; SECURITY: no default (session_manager.h Caller)
  std::uint64_t request_id;  // the transport's request or frame id, for logs; 0 = none
  Surface surface;
};

}  // namespace agentbox::service
