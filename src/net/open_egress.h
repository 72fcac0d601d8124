#pragma once
// Network mode "open" (API.md "Network", SECURITY.md T6): outbound TCP/UDP from the box's own
// network namespace, routed by the kernel, never the host's netns.
//
// Per box: a veth pair, `abo<N>` on the daemon's side (address <pool>+4N+1/30) and `eth0` in the
// box (<pool>+4N+2/30, default route via the daemon's side), and an nftables table in the box's
// netns whose output chain rejects (EHOSTUNREACH / ICMP admin-prohibited) every destination the
// proxy refuses too (refused_v4_cidrs: loopback, 0/8, link-local/metadata 169.254.0.0/16,
// multicast, reserved, documentation, and the private ranges unless `allow_private`), the pool
// (other boxes) and all IPv6 (a box gets no IPv6 route). The session user has no
// CAP_NET_ADMIN in that netns, so it cannot change the table, the address or the route.
//
// Once per daemon netns (ensure_host_rules): net.ipv4.ip_forward = 1 and the table
// `inet agentbox_open`: nothing coming in on an `abo*` interface reaches the host itself (input:
// rejected, so neither the daemon's port nor any other host service, on any host address),
// box-to-box forwarding is rejected, nothing from outside is forwarded into a box but replies,
// and box traffic leaving the host is masqueraded.
//
// The interface name is the claim on N: `ip link add abo<N>` fails with EEXIST while another box
// (of this or another daemon on the host) holds it, and the next N is tried. The pair disappears
// with the box's netns; stop() deletes it at once.
//
// Why a veth and not pasta (passt): measured on the same host (docs/architecture.md "Network"):
// a 1 GiB download from a netns beside the host ran at ~2x the throughput through the kernel's
// forwarding than through pasta's userspace TCP stack, box network setup took ~150 ms against
// ~550-800 ms for pasta to come up, and pasta as root insists on dropping to a user that cannot
// enter a root-owned netns (it needs --runas 0) and would be one more long-lived process per box.
//
// The helpers run `ip` and `nft` (iproute2, nftables), blocking: call them off the io thread.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "net/policy.h"

namespace agentbox::net {

class OpenEgress {
 public:
  // Gives the netns of `box_pid` its veth, address, route and output filter. kUnavailable when
  // `ip`/`nft` are missing or the pool is exhausted; nothing is left behind on failure.
  static Result<std::unique_ptr<OpenEgress>> start(pid_t box_pid, const NetworkConfig& config);
  ~OpenEgress();
  OpenEgress(const OpenEgress&) = delete;
  OpenEgress& operator=(const OpenEgress&) = delete;

  // Deletes the host side of the pair (the box loses its route out at once). Idempotent.
  void stop();

  // A live change away from mode "open" (API.md "Network"): stop(), then every socket in the
  // netns of `box_pid` bound to box_address() (the connections that went out through the pair)
  // is aborted with SOCK_DESTROY (`ss -K`, iproute2): their owners see ECONNABORTED at once
  // instead of waiting on a route that is gone. Loopback sockets of the box are untouched.
  Status stop_and_cut(pid_t box_pid);

  const std::string& host_ifname() const { return ifname_; }
  const std::string& box_address() const { return box_address_; }  // "10.201.0.2"
  const std::string& gateway() const { return gateway_; }          // "10.201.0.1"

 private:
  OpenEgress() = default;
  std::string ifname_, box_address_, gateway_;
  bool stopped_ = false;
};

// The host-side table and forwarding switch described above; done once per process (later calls
// return the first success at once, a failure is retried on the next call).
Status ensure_host_rules();

// The nftables ruleset loaded into a box's netns (exposed for tests and the docs).
std::string box_ruleset(const NetworkConfig& config);

// Runs `argv` (argv[0] an absolute path) with `input` on stdin, optionally inside the network
// namespace `netns_fd` (>= 0), and returns its stdout+stderr; kInternal naming the command and
// its output when it exits non-zero.
Result<std::string> run_tool(const std::vector<std::string>& argv, const std::string& input,
                             int netns_fd = -1);

}  // namespace agentbox::net
