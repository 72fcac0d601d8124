#pragma once
// The server URL of ClientOptions, taken apart once for the HTTP client and the WebSocket client.

#include <string>
#include <string_view>

#include "common/error.h"

namespace agentbox::client::detail {

struct Endpoint {
  std::string host;  // without brackets
  std::string port;
  std::string host_header;
  bool tls = false;  // https://
};

// "http://host:port" or "https://host:port" (no path; IPv6 in brackets; the port 80 or 443 when
// none). EINVAL naming the URL otherwise.
Result<Endpoint> parse_server(std::string_view url);

}  // namespace agentbox::client::detail
