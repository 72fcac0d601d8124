#pragma once
// The MCP surface's JSON-RPC decoding (mcp.cc), free of the transport so it can be fuzzed
// (tests/fuzz/mcp.cc): one POST body into a message, and a tools/call's params. A refusal
// carries the HTTP status, the JSON-RPC id (null when unknown), the JSON-RPC error code and the
// message mcp.cc answers with.

#include <expected>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace agentbox::server::detail {

// JSON-RPC error codes.
inline constexpr int kMcpParseError = -32700;
inline constexpr int kMcpInvalidRequest = -32600;
inline constexpr int kMcpMethodNotFound = -32601;
inline constexpr int kMcpInvalidParams = -32602;

struct McpRefusal {
  int status = 400;
  nlohmann::json id;
  int code = kMcpInvalidRequest;
  std::string message;
};

struct McpMessage {
  nlohmann::json msg;          // the whole message (an object)
  nlohmann::json id;           // null when absent
  std::string method;          // "" when absent
  bool is_request = false;     // has an id and a method (else a notification or a response)
  std::string asked_protocol;  // initialize's params.protocolVersion when a string, else ""
};

// One POST body: a JSON object with "jsonrpc": "2.0"; batches, malformed JSON and a non-string
// method are refused.
std::expected<McpMessage, McpRefusal> parse_mcp_message(std::string_view body);

struct McpToolCall {
  std::string name;
  nlohmann::json args;  // an object ({} when absent or null)
};
// params of a tools/call: name (a string) and arguments (an object, or absent/null).
std::expected<McpToolCall, McpRefusal> parse_tool_call(const McpMessage& m);

}  // namespace agentbox::server::detail
