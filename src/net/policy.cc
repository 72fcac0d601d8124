#include "net/policy.h"

#include <arpa/inet.h>
#include <idn2.h>

#include <algorithm>
#include <charconv>

namespace agentbox::net {
namespace {

namespace ip = boost::asio::ip;

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::optional<IpAddress> parse_v6(std::string_view s) {
  if (s.empty() || s.size() > INET6_ADDRSTRLEN || s.find('%') != std::string_view::npos) {
    return std::nullopt;  // zone ids (fe80::1%eth0) are never a remote target
  }
  in6_addr a6{};
  if (inet_pton(AF_INET6, std::string(s).c_str(), &a6) != 1) return std::nullopt;
  ip::address_v6::bytes_type b;
  std::copy(std::begin(a6.s6_addr), std::end(a6.s6_addr), b.begin());
  ip::address_v6 v6(b);
  // One address, one spelling: ::ffff:127.0.0.1 is 127.0.0.1 for matching and for the ranges.
  if (v6.is_v4_mapped()) return IpAddress(ip::make_address_v4(ip::v4_mapped, v6));
  return IpAddress(v6);
}

// IPv4 in every spelling inet_aton(3) takes (and so getaddrinfo(3) and curl): 1 to 4 parts,
// each decimal, 0x-hex or 0-octal; the last part fills the remaining bytes.
std::optional<IpAddress> parse_v4(std::string_view s) {
  if (s.empty() || s.size() > 64) return std::nullopt;
  // inet_aton stops at whitespace and ignores the rest; only take strings it reads whole.
  for (char c : s) {
    const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
                    c == 'x' || c == 'X' || c == '.';
    if (!ok) return std::nullopt;
  }
  in_addr a4{};
  if (inet_aton(std::string(s).c_str(), &a4) == 0) return std::nullopt;
  return IpAddress(ip::address_v4(ntohl(a4.s_addr)));
}

bool all_digits_or_hex(std::string_view label) {
  if (label.empty()) return false;
  if (label.size() > 2 && label[0] == '0' && (label[1] == 'x' || label[1] == 'X')) {
    label.remove_prefix(2);
    return std::all_of(label.begin(), label.end(),
                       [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
  }
  return std::all_of(label.begin(), label.end(), [](char c) { return c >= '0' && c <= '9'; });
}

struct V4Range {
  uint32_t net;
  int prefix;
  bool private_range;  // may be allowed by allow_private
  const char* what;
};

constexpr uint32_t v4(int a, int b, int c, int d) {
  return (uint32_t(a) << 24) | (uint32_t(b) << 16) | (uint32_t(c) << 8) | uint32_t(d);
}

constexpr V4Range kV4Ranges[] = {
    {v4(0, 0, 0, 0), 8, false, "this-network (0.0.0.0/8)"},
    {v4(127, 0, 0, 0), 8, false, "loopback (127.0.0.0/8)"},
    {v4(169, 254, 0, 0), 16, false, "link-local/metadata (169.254.0.0/16)"},
    {v4(224, 0, 0, 0), 4, false, "multicast (224.0.0.0/4)"},
    {v4(240, 0, 0, 0), 4, false, "reserved/broadcast (240.0.0.0/4)"},
    {v4(192, 0, 0, 0), 24, false, "IETF protocol assignments (192.0.0.0/24)"},
    {v4(192, 0, 2, 0), 24, false, "documentation (192.0.2.0/24)"},
    {v4(198, 51, 100, 0), 24, false, "documentation (198.51.100.0/24)"},
    {v4(203, 0, 113, 0), 24, false, "documentation (203.0.113.0/24)"},
    {v4(198, 18, 0, 0), 15, false, "benchmarking (198.18.0.0/15)"},
    {v4(10, 0, 0, 0), 8, true, "private (10.0.0.0/8)"},
    {v4(172, 16, 0, 0), 12, true, "private (172.16.0.0/12)"},
    {v4(192, 168, 0, 0), 16, true, "private (192.168.0.0/16)"},
    {v4(100, 64, 0, 0), 10, true, "shared/CGNAT (100.64.0.0/10)"},
};

std::optional<std::string> refused_v4(uint32_t a, bool allow_private) {
  for (const V4Range& r : kV4Ranges) {
    const uint32_t mask = r.prefix == 0 ? 0 : ~uint32_t(0) << (32 - r.prefix);
    if ((a & mask) != r.net) continue;
    if (r.private_range && allow_private) return std::nullopt;
    return std::string(r.what);
  }
  return std::nullopt;
}

uint32_t v4_at(const ip::address_v6::bytes_type& b, size_t i) {
  return (uint32_t(b[i]) << 24) | (uint32_t(b[i + 1]) << 16) | (uint32_t(b[i + 2]) << 8) |
         uint32_t(b[i + 3]);
}

bool prefix_is(const ip::address_v6::bytes_type& b, std::initializer_list<uint8_t> p) {
  return std::equal(p.begin(), p.end(), b.begin());
}

Result<uint16_t> parse_port(std::string_view s, std::string_view whole) {
  unsigned v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v == 0 || v > 65535) {
    return fail(Code::kInvalid, "bad port in \"" + std::string(whole) + "\"");
  }
  return static_cast<uint16_t>(v);
}

}  // namespace

std::optional<IpAddress> parse_ip_literal(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return parse_v6(host.substr(1, host.size() - 2));
  }
  if (host.find(':') != std::string_view::npos) return parse_v6(host);
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);  // "127.0.0.1." is 127.0.0.1
  return parse_v4(host);
}

Result<CanonicalHost> canonical_host(std::string_view host) {
  const std::string quoted = "\"" + std::string(host.substr(0, 300)) + "\"";
  if (host.empty()) return fail(Code::kInvalid, "empty host name");
  if (host.size() > 1024) return fail(Code::kInvalid, "host name too long: " + quoted);
  std::string name;
  if (is_ascii(host)) {
    name = lower(host);
  } else {
    // UTS #46 mapping (fullwidth dots and digits, case) then Punycode: what a browser or curl
    // built with libidn2 would look up.
    char* out = nullptr;
    const int rc =
        idn2_to_ascii_8z(std::string(host).c_str(), &out, IDN2_NONTRANSITIONAL | IDN2_NFC_INPUT);
    if (rc != IDN2_OK) {
      return fail(Code::kInvalid,
                  "host name " + quoted + " is not a valid IDN: " + idn2_strerror(rc));
    }
    name = lower(out);
    idn2_free(out);
  }
  if (auto a = parse_ip_literal(name)) return CanonicalHost{a->to_string(), *a};
  if (!name.empty() && name.back() == '.') name.pop_back();
  if (name.empty() || name.size() > 253) return fail(Code::kInvalid, "bad host name " + quoted);
  size_t start = 0;
  std::string_view last;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    std::string_view label(name.data() + start, dot - start);
    if (label.empty() || label.size() > 63) return fail(Code::kInvalid, "bad host name " + quoted);
    for (char c : label) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_')) {
        return fail(Code::kInvalid, "bad character in host name " + quoted);
      }
    }
    last = label;
    start = dot + 1;
  }
  // "1.2.3.09" is no IPv4 address to inet_aton but is one (a broken one) to URL parsers; a name
  // ending in a numeric label is not a DNS name anyone can register.
  if (all_digits_or_hex(last)) {
    return fail(Code::kInvalid, "host name " + quoted + " looks like an IP address");
  }
  return CanonicalHost{std::move(name), std::nullopt};
}

std::vector<std::string> refused_v4_cidrs(bool allow_private) {
  std::vector<std::string> out;
  for (const V4Range& r : kV4Ranges) {
    if (r.private_range && allow_private) continue;
    out.push_back(ip::address_v4(r.net).to_string() + "/" + std::to_string(r.prefix));
  }
  return out;
}

Result<std::pair<uint32_t, int>> parse_open_subnet(std::string_view cidr) {
  const std::string quoted = "\"" + std::string(cidr.substr(0, 64)) + "\"";
  const size_t slash = cidr.find('/');
  if (slash == std::string_view::npos) {
    return fail(Code::kInvalid, "open_subnet " + quoted + " must be an IPv4 a.b.c.d/n");
  }
  boost::system::error_code ec;
  const auto a = ip::make_address_v4(std::string(cidr.substr(0, slash)), ec);
  int prefix = 0;
  const std::string_view p = cidr.substr(slash + 1);
  auto [end, perr] = std::from_chars(p.data(), p.data() + p.size(), prefix);
  if (ec || perr != std::errc() || end != p.data() + p.size() || p.empty()) {
    return fail(Code::kInvalid, "open_subnet " + quoted + " must be an IPv4 a.b.c.d/n");
  }
  if (prefix < 8 || prefix > 28) {
    return fail(Code::kInvalid, "open_subnet " + quoted + ": prefix must be 8..28");
  }
  const uint32_t net = a.to_uint();
  if ((net & ~(~uint32_t(0) << (32 - prefix))) != 0) {
    return fail(Code::kInvalid, "open_subnet " + quoted + " has host bits set");
  }
  return std::pair<uint32_t, int>{net, prefix};
}

std::optional<std::string> refused_address(const IpAddress& a, bool allow_private) {
  if (a.is_v4()) return refused_v4(a.to_v4().to_uint(), allow_private);
  const ip::address_v6 v6 = a.to_v6();
  const auto b = v6.to_bytes();
  if (v6.is_v4_mapped()) return refused_v4(v4_at(b, 12), allow_private);
  if (v6.is_loopback()) return "loopback (::1)";
  if (v6.is_unspecified()) return "unspecified (::)";
  if (prefix_is(b, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})) return "IPv4-compatible (::/96)";
  if (prefix_is(b, {0x00, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0})) {
    if (auto r = refused_v4(v4_at(b, 12), allow_private)) return "NAT64 of " + *r;
    return std::nullopt;
  }
  if (prefix_is(b, {0x00, 0x64, 0xff, 0x9b, 0x00, 0x01})) return "local NAT64 (64:ff9b:1::/48)";
  if (prefix_is(b, {0x20, 0x02})) {
    if (auto r = refused_v4(v4_at(b, 2), allow_private)) return "6to4 of " + *r;
    return std::nullopt;
  }
  if (prefix_is(b, {0x20, 0x01, 0x00, 0x00})) return "Teredo (2001::/32)";
  if (prefix_is(b, {0x20, 0x01, 0x0d, 0xb8})) return "documentation (2001:db8::/32)";
  if (prefix_is(b, {0x01, 0x00, 0, 0, 0, 0, 0, 0})) return "discard (100::/64)";
  if (b[0] == 0xff) return "multicast (ff00::/8)";
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) return "link-local (fe80::/10)";
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) return "site-local (fec0::/10)";
  if ((b[0] & 0xfe) == 0xfc) {
    if (allow_private) return std::nullopt;
    return "private (fc00::/7)";
  }
  return std::nullopt;
}

Result<HostPort> split_host_port(std::string_view authority, std::optional<uint16_t> default_port) {
  const std::string quoted = "\"" + std::string(authority.substr(0, 300)) + "\"";
  HostPort hp;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return fail(Code::kInvalid, "unclosed [ in " + quoted);
    hp.host = std::string(authority.substr(1, close - 1));
    std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return fail(Code::kInvalid, "junk after ] in " + quoted);
      port = rest.substr(1);
      if (port.empty()) return fail(Code::kInvalid, "empty port in " + quoted);
    }
    if (hp.host.empty()) return fail(Code::kInvalid, "empty host in " + quoted);
    hp.host = "[" + hp.host + "]";
  } else {
    const size_t colon = authority.find(':');
    if (colon != std::string_view::npos &&
        authority.find(':', colon + 1) != std::string_view::npos) {
      return fail(Code::kInvalid, "IPv6 address without brackets in " + quoted);
    }
    hp.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) return fail(Code::kInvalid, "empty port in " + quoted);
    }
    if (hp.host.empty()) return fail(Code::kInvalid, "empty host in " + quoted);
  }
  if (!port.empty()) {
    auto p = parse_port(port, authority);
    if (!p) return std::unexpected(p.error());
    hp.port = *p;
  } else if (default_port) {
    hp.port = *default_port;
  }
  return hp;
}

Result<AllowEntry> parse_allow_entry(std::string_view entry) {
  const std::string quoted = "\"" + std::string(entry.substr(0, 300)) + "\"";
  AllowEntry e;
  e.spelled = std::string(entry);
  std::string_view rest = entry;
  if (rest.starts_with("*.")) {
    e.wildcard = true;
    rest.remove_prefix(2);
  }
  auto hp = split_host_port(rest, std::nullopt);
  if (!hp) return fail(Code::kInvalid, "network.allow entry " + quoted + ": " + hp.error().message);
  if (hp->port != 0) e.port = hp->port;
  auto c = canonical_host(hp->host);
  if (!c) return fail(Code::kInvalid, "network.allow entry " + quoted + ": " + c.error().message);
  if (c->ip && e.wildcard) {
    return fail(Code::kInvalid, "network.allow entry " + quoted + ": a wildcard needs a domain");
  }
  e.name = c->name;
  e.ip = c->ip;
  return e;
}

Result<std::map<std::string, IpAddress>> parse_hosts(
    const std::vector<std::pair<std::string, std::string>>& hosts) {
  std::map<std::string, IpAddress> out;
  for (const auto& [name, addr] : hosts) {
    auto c = canonical_host(name);
    if (!c || c->ip) {
      return fail(Code::kInvalid, "network.hosts: \"" + name + "\" is not a host name");
    }
    boost::system::error_code ec;
    IpAddress a = ip::make_address(addr, ec);
    if (ec)
      return fail(Code::kInvalid,
                  "network.hosts." + name + ": \"" + addr + "\" is not an IP address");
    if (a.is_v6() && a.to_v6().is_v4_mapped()) a = ip::make_address_v4(ip::v4_mapped, a.to_v6());
    out[c->name] = a;
  }
  return out;
}

Result<Policy> Policy::parse(const std::vector<std::string>& allow) {
  Policy p;
  for (const std::string& s : allow) {
    auto e = parse_allow_entry(s);
    if (!e) return std::unexpected(e.error());
    p.entries_.push_back(std::move(*e));
  }
  return p;
}

Status Policy::check(const CanonicalHost& host, uint16_t port) const {
  bool name_ok = false;
  for (const AllowEntry& e : entries_) {
    bool match;
    if (host.ip || e.ip) {
      match = host.ip && e.ip && *host.ip == *e.ip;
    } else if (e.wildcard) {
      match = host.name.size() > e.name.size() + 1 && host.name.ends_with(e.name) &&
              host.name[host.name.size() - e.name.size() - 1] == '.';
    } else {
      match = host.name == e.name;
    }
    if (!match) continue;
    name_ok = true;
    if (e.port && *e.port == port) return {};
    if (std::find(std::begin(kDefaultPorts), std::end(kDefaultPorts), port) !=
        std::end(kDefaultPorts)) {
      return {};
    }
  }
  const std::string shown = host.ip && host.ip->is_v6() ? "[" + host.name + "]" : host.name;
  if (name_ok) {
    return fail(Code::kAccess,
                "port " + std::to_string(port) + " of " + shown + " is not in the allowlist");
  }
  if (host.ip) return fail(Code::kAccess, "IP address " + shown + " is not in the allowlist");
  return fail(Code::kAccess, shown + " is not in the allowlist");
}

}  // namespace agentbox::net
