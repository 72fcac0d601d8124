#pragma once
// The egress policy of one session (API.md "Network", SECURITY.md T6): which names and ports a
// box may reach through its proxy, and which addresses a name may resolve to.
//
// Matching happens on canonical names only (canonical_host): lowercase ASCII, no trailing dot,
// IDNA (UTS #46, non-transitional) to its xn-- form. Anything that parses as an IPv4 or IPv6
// address in any spelling the C library or a URL parser would accept (`127.1`, `0x7f.0.0.1`,
// `2130706433`, `0177.0.0.1`, `[::ffff:127.0.0.1]`) is an IP literal, and passes only when the
// allowlist names that very address.
//
// Thread-safety: a Policy is immutable after parse(); share it as shared_ptr<const Policy>.

#include <boost/asio/ip/address.hpp>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace agentbox::net {

using IpAddress = boost::asio::ip::address;

// Default ports of an entry without ":port".
inline constexpr uint16_t kDefaultPorts[] = {80, 443};

// The canonical form of a host name as a box spelled it, or kInvalid naming it. IP literals are
// returned in their normal printed form ("127.0.0.1", "::1"); `is_ip` tells which it was.
struct CanonicalHost {
  std::string name;
  std::optional<IpAddress> ip;  // set for an IP literal
};
Result<CanonicalHost> canonical_host(std::string_view host);

// An IP literal in any spelling (brackets allowed for IPv6), or nullopt when `host` is not one.
std::optional<IpAddress> parse_ip_literal(std::string_view host);

// Why an address is refused after resolving, or nullopt when it is a public unicast address.
// Loopback, unspecified, link-local (metadata 169.254.169.254 included), multicast, broadcast
// and reserved ranges are always refused; private ranges (10/8, 172.16/12, 192.168/16, 100.64/10,
// fc00::/7) unless `allow_private`. IPv4-mapped, NAT64 and 6to4 IPv6 forms are judged by the
// IPv4 address inside.
std::optional<std::string> refused_address(const IpAddress& a, bool allow_private);

// A host:port split of a CONNECT authority or URL authority ("example.org:443",
// "[::1]:8443", "example.org" with `default_port`).
struct HostPort {
  std::string host;  // as spelled, brackets removed
  uint16_t port = 0;
};
Result<HostPort> split_host_port(std::string_view authority, std::optional<uint16_t> default_port);

// One allowlist entry: `example.org`, `*.example.org`, `example.org:8443`, an IP literal.
struct AllowEntry {
  std::string spelled;  // as given, for messages
  std::string name;     // canonical; for a wildcard the suffix without "*."
  bool wildcard = false;
  std::optional<IpAddress> ip;
  std::optional<uint16_t> port;  // widens the default 80/443 for this name
};
Result<AllowEntry> parse_allow_entry(std::string_view entry);

// Daemon-wide settings (config `network`): hosts used before DNS and the private-range switch.
struct NetworkConfig {
  std::map<std::string, IpAddress> hosts;  // canonical name -> address, used as given
  bool allow_private = false;
  std::set<uint16_t> daemon_ports;  // never reachable through a `hosts` entry
  // Mode "open": the IPv4 pool box veths take their /30 from (config `network.open_subnet`,
  // default 10.201.0.0/16). Never reachable from a box, whatever allow_private says.
  uint32_t open_subnet = 0x0AC90000;
  int open_prefix = 16;
};
// Parses config `network.open_subnet` ("10.201.0.0/16"; prefix 8..28, host bits zero);
// kInvalid naming it.
Result<std::pair<uint32_t, int>> parse_open_subnet(std::string_view cidr);

// The IPv4 ranges refused_address() refuses, as "a.b.c.d/n" (for the open mode's filter).
std::vector<std::string> refused_v4_cidrs(bool allow_private);
// Validates config `network.hosts` (names canonicalised, addresses parsed); kInvalid naming the
// bad entry.
Result<std::map<std::string, IpAddress>> parse_hosts(
    const std::vector<std::pair<std::string, std::string>>& hosts);

class Policy {
 public:
  // kInvalid naming the first malformed entry; nothing is half-applied.
  static Result<Policy> parse(const std::vector<std::string>& allow);
  const std::vector<AllowEntry>& entries() const { return entries_; }

  // Whether the box may ask for `host` (canonical) on `port`. On refusal the error message says
  // why, naming the host ("pkg.test:443 is not in the allowlist").
  Status check(const CanonicalHost& host, uint16_t port) const;

 private:
  std::vector<AllowEntry> entries_;
};

}  // namespace agentbox::net
