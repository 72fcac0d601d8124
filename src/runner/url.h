#pragma once
// URLs the runner dials: --server (ws:// or wss://) and download_file's (http:// or https://).

#include <optional>
#include <string>
#include <string_view>

namespace agentbox::runner {

struct Url {
  bool tls = false;
  std::string host;    // without [] for IPv6
  std::string port;    // default 80 / 443
  std::string target;  // path and query, "/" when absent
};

// `plain` and `tls` are the schemes ("ws", "wss" or "http", "https"); nullopt for anything else
// or an empty host.
std::optional<Url> parse_url(std::string_view s, std::string_view plain, std::string_view tls);

}  // namespace agentbox::runner
