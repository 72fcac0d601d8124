// The MCP surface's JSON-RPC decoding (mcp_message.h).

#include "dialects/mcp/mcp_message.h"

namespace agentbox::server::detail {

using nlohmann::json;

std::expected<McpMessage, McpRefusal> parse_mcp_message(std::string_view body) {
  json msg = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (msg.is_discarded()) {
    return std::unexpected(
        McpRefusal{400, nullptr, kMcpParseError, "malformed JSON in request body"});
  }
  if (msg.is_array()) {
    return std::unexpected(
        McpRefusal{400, nullptr, kMcpInvalidRequest, "JSON-RPC batches are not supported"});
  }
  if (!msg.is_object() || msg.value("jsonrpc", json()) != "2.0") {
    return std::unexpected(
        McpRefusal{400, nullptr, kMcpInvalidRequest, "not a JSON-RPC 2.0 message"});
  }
  McpMessage m;
  m.is_request = msg.contains("id") && msg.contains("method");
  m.id = msg.contains("id") ? msg["id"] : json(nullptr);
  if (msg.contains("method")) {
    if (!msg["method"].is_string()) {
      return std::unexpected(
          McpRefusal{400, m.id, kMcpInvalidRequest, "'method' must be a string"});
    }
    m.method = msg["method"].get<std::string>();
  }
  if (msg.contains("params") && msg["params"].is_object()) {
    const json& params = msg["params"];
    auto v = params.find("protocolVersion");
    if (v != params.end() && v->is_string()) m.asked_protocol = v->get<std::string>();
  }
  m.msg = std::move(msg);
  return m;
}

std::expected<McpToolCall, McpRefusal> parse_tool_call(const McpMessage& m) {
  const json& msg = m.msg;
  auto p = msg.find("params");
  if (p == msg.end() || !p->is_object()) {
    return std::unexpected(
        McpRefusal{200, m.id, kMcpInvalidParams, "tools/call needs params.name"});
  }
  auto name = p->find("name");
  if (name == p->end() || !name->is_string()) {
    return std::unexpected(
        McpRefusal{200, m.id, kMcpInvalidParams, "tools/call needs params.name"});
  }
  McpToolCall tc{name->get<std::string>(), json::object()};
  auto args = p->find("arguments");
  if (args != p->end() && !args->is_null()) {
    if (!args->is_object()) {
      return std::unexpected(
          McpRefusal{200, m.id, kMcpInvalidParams, "params.arguments must be an object"});
    }
    tc.args = *args;
  }
  return tc;
}

}  // namespace agentbox::server::detail
