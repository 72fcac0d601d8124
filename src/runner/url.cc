#include "runner/url.h"

namespace agentbox::runner {

std::optional<Url> parse_url(std::string_view s, std::string_view plain, std::string_view tls) {
  Url u;
  std::string_view rest;
  auto scheme_is = [&](std::string_view scheme) {
    return s.size() > scheme.size() + 3 && s.substr(0, scheme.size()) == scheme &&
           s.substr(scheme.size(), 3) == "://";
  };
  if (scheme_is(plain)) {
    rest = s.substr(plain.size() + 3);
  } else if (scheme_is(tls)) {
    u.tls = true;
    rest = s.substr(tls.size() + 3);
  } else {
    return std::nullopt;
  }
  std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  u.target = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (!authority.empty() && authority[0] == '[') {
    std::size_t close = authority.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    u.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size() && authority[close + 1] == ':') {
      u.port = authority.substr(close + 2);
    }
  } else if (std::size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    u.host = authority.substr(0, colon);
    u.port = authority.substr(colon + 1);
  } else {
    u.host = authority;
  }
  if (u.port.empty()) u.port = u.tls ? "443" : "80";
  if (u.host.empty()) return std::nullopt;
  return u;
}

}  // namespace agentbox::runner
