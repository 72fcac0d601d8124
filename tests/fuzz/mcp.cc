// Fuzz harness: MCP JSON-RPC bodies of POST /v1/sessions/{id}/mcp (dialects/mcp/mcp_message.h):
// parse_mcp_message() as mcp_post() calls it, then parse_tool_call() as dispatch() does for a
// tools/call.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dialects/mcp/mcp_message.h"

using namespace agentbox::server::detail;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  auto m = parse_mcp_message(body);
  if (!m) {
    (void)m.error().id.dump();
    return 0;
  }
  auto tc = parse_tool_call(*m);
  if (tc) (void)tc->args.dump();
  (void)m->id.dump();
  return 0;
}
