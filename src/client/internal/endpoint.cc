#include "client/internal/endpoint.h"

namespace agentbox::client::detail {

Result<Endpoint> parse_server(std::string_view url) {
  const bool tls = url.substr(0, 8) == "https://";
  if (!tls && url.substr(0, 7) != "http://") {
    return fail(Code::kInvalid, "server URL " + std::string(url) + ": expected http://host:port");
  }
  std::string_view rest = url.substr(tls ? 8 : 7);
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.empty() || rest.find('/') != std::string_view::npos ||
      rest.find('@') != std::string_view::npos) {
    return fail(Code::kInvalid,
                "server URL " + std::string(url) + ": expected http://host:port with no path");
  }
  Endpoint ep;
  ep.host_header = std::string(rest);
  std::string_view host = rest, port = tls ? "443" : "80";
  if (rest.front() == '[') {  // [v6]:port
    auto close = rest.find(']');
    if (close == std::string_view::npos) {
      return fail(Code::kInvalid, "server URL " + std::string(url) + ": unbalanced '['");
    }
    host = rest.substr(1, close - 1);
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        return fail(Code::kInvalid, "server URL " + std::string(url) + ": bad port");
      }
      port = after.substr(1);
    }
  } else if (auto colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty() || port.empty() ||
      port.find_first_not_of("0123456789") != std::string_view::npos || port.size() > 5) {
    return fail(Code::kInvalid, "server URL " + std::string(url) + ": bad host or port");
  }
  ep.host = std::string(host);
  ep.port = std::string(port);
  ep.tls = tls;
  return ep;
}

}  // namespace agentbox::client::detail
