// The daemon's config: values of one field (a listen address, an Origin) checked and parsed.

#include <arpa/inet.h>

#include <string>

#include "common/validate.h"
#include "server/config.h"

namespace agentbox::server {

Result<std::pair<std::string, std::uint16_t>> parse_listen(std::string_view listen) {
  std::string_view host;
  std::string_view port;
  if (!listen.empty() && listen.front() == '[') {
    auto close = listen.find(']');
    if (close == std::string_view::npos || close + 1 >= listen.size() || listen[close + 1] != ':') {
      return fail(Code::kInvalid,
                  "listen address '" + std::string(listen) + "' must look like [IPv6]:PORT");
    }
    host = listen.substr(1, close - 1);
    port = listen.substr(close + 2);
  } else {
    auto colon = listen.rfind(':');
    if (colon == std::string_view::npos) {
      return fail(Code::kInvalid,
                  "listen address '" + std::string(listen) + "' must look like ADDR:PORT");
    }
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != port.npos) {
    return fail(Code::kInvalid, "listen port in '" + std::string(listen) + "' is not a number");
  }
  unsigned long p = std::strtoul(std::string(port).c_str(), nullptr, 10);
  if (p > 65535) {
    return fail(Code::kInvalid, "listen port in '" + std::string(listen) + "' is over 65535");
  }
  std::string h(host);
  if (h == "localhost") h = "127.0.0.1";
  unsigned char buf[16];
  if (inet_pton(AF_INET, h.c_str(), buf) != 1 && inet_pton(AF_INET6, h.c_str(), buf) != 1) {
    return fail(Code::kInvalid,
                "listen address '" + std::string(host) + "' must be an IP address or localhost");
  }
  return std::make_pair(h, static_cast<std::uint16_t>(p));
}

bool is_loopback_address(std::string_view address) {
  std::string a(address);
  if (a == "localhost") return true;
  unsigned char buf[16];
  if (inet_pton(AF_INET, a.c_str(), buf) == 1) return buf[0] == 127;
  if (inet_pton(AF_INET6, a.c_str(), buf) == 1) {
    static const unsigned char kLoop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    if (std::equal(buf, buf + 16, kLoop6)) return true;
    // ::ffff:127.x.y.z
    static const unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return std::equal(buf, buf + 12, kMapped) && buf[12] == 127;
  }
  return false;
}

Status check_origin(std::string_view origin) {
  // What a browser sends in Origin: scheme "://" host [":" port], lower case, nothing after.
  auto bad = [&](const char* why) {
    return fail(Code::kInvalid, "allowed origin " + validate::quote(origin) + " " + why +
                                    " (expected scheme://host[:port], e.g. https://app.example.org)");
  };
  auto sep = origin.find("://");
  if (sep == std::string_view::npos || sep == 0) return bad("has no scheme");
  std::string_view scheme = origin.substr(0, sep);
  std::string_view host = origin.substr(sep + 3);
  if (scheme.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789+.-") != scheme.npos) {
    return bad("has a scheme that is not lower-case letters");
  }
  if (host.empty()) return bad("has no host");
  if (host.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789.-:[]") != host.npos) {
    return bad("must be lower case with no path, query or '*'");
  }
  return {};
}

}  // namespace agentbox::server
