// Fuzz harness: Connect-RPC requests of the E2B envd surface (dialects/e2b/connect.h). The
// first line of the input is the request's headers (Content-Type, Connect-Timeout-Ms,
// Connect-Protocol-Version separated by '|'), the rest its body, decoded as the daemon does:
// call_kind() of the Content-Type, then decode_request() of the body.

#include "dialects/e2b/connect.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

using namespace agentbox::server::connectrpc;

namespace {
std::string_view next_field(std::string_view* line) {
  auto bar = line->find('|');
  std::string_view f = line->substr(0, bar);
  *line = bar == std::string_view::npos ? std::string_view() : line->substr(bar + 1);
  return f;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto nl = in.find('\n');
  std::string_view head = nl == std::string_view::npos ? in : in.substr(0, nl);
  std::string_view body = nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);
  std::string_view content_type = next_field(&head);
  std::string_view timeout = next_field(&head);
  std::string_view version = next_field(&head);
  (void)parse_timeout(timeout, !timeout.empty());
  (void)check_protocol_version(version, !version.empty());
  auto kind = call_kind(content_type);
  // The body under both kinds (a stream body sent as unary, and back).
  (void)decode_request(CallKind::kUnary, body);
  (void)decode_request(CallKind::kServerStream, body);
  if (kind) {
    auto msg = decode_request(*kind, body);
    if (msg) (void)message_frame(*msg);
  }
  return 0;
}
