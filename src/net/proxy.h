#pragma once
// The allowlist egress proxy of one session (API.md "Network", SECURITY.md T6): HTTP CONNECT
// tunnels and plain-HTTP forward requests, served from the caller's io_context on a listening
// socket the caller hands in (listen_in_netns() opens it inside the box's network namespace, so
// the box reaches it at 127.0.0.1:3128 and has no other way out). Names are checked against the
// Policy, resolved on the host side (NetworkConfig::hosts first, then DNS), the addresses
// checked again (refused_address), and only then connected to.
//
// Per request:
//   CONNECT host:port  -> 200, then bytes both ways; whatever the box sends inside the tunnel
//                         (a second request, another Host, another SNI) goes to that host only.
//   GET http://host/.. -> the request (origin-form, hop-by-hop headers dropped, Connection:
//                         close) and exactly Content-Length body bytes to the host, its response
//                         back, then the box's connection is closed: one request per connection,
//                         so every request is checked on its own.
//   denied             -> 403, body "agentbox proxy: <why, naming the host>", on_deny hook.
//   malformed          -> 400 (431 for an oversized head, 501 for chunked request bodies).
//   no answer          -> 504 naming host:port (connect timeout, or no response byte in time).
//   slow head          -> 408 naming the header timeout (slowloris), then closed.
//
// Bounded: max_connections per proxy (one per session; beyond it: 503 and close), the request
// head size, the time to send a head (slowloris), connect/response/idle timeouts, relay buffers
// allocated only while relaying.
//
// Threading: every connection runs on its own strand of `io`; set_policy(), counters() and
// stop() may be called from any thread.

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/error.h"
#include "common/unique_fd.h"
#include "net/policy.h"

namespace agentbox::net {

struct ProxyLimits {
  size_t max_connections = 256;
  size_t max_header_bytes = 16 * 1024;
  std::chrono::milliseconds header_timeout{10'000};    // from accept to a whole request head
  std::chrono::milliseconds connect_timeout{10'000};   // resolve + connect, else 504
  std::chrono::milliseconds response_timeout{60'000};  // plain HTTP: first response byte, else 504
  std::chrono::milliseconds idle_timeout{300'000};     // a tunnel with no byte either way
  std::chrono::milliseconds half_closed_timeout{10'000};  // idle limit once the box sent EOF
  size_t relay_buffer = 64 * 1024;                        // per direction, while relaying
};

struct DenyEvent {
  std::string method;  // "CONNECT", "GET", ...
  std::string host;    // as the box spelled it (truncated to 256 bytes)
  uint16_t port = 0;
  std::string reason;  // the 403 body's text
};

struct ProxyHooks {
  // Called on the connection's strand for every 403 (the daemon's `net.deny` audit line).
  std::function<void(const DenyEvent&)> on_deny;
};

struct ProxyCounters {
  uint64_t bytes_out = 0;  // box -> outside (request heads, bodies, tunnel bytes)
  uint64_t bytes_in = 0;   // outside -> box
  uint64_t denials = 0;
  uint64_t connections_total = 0;
  uint64_t connections_active = 0;
  uint64_t rejected_busy = 0;  // refused with 503 at max_connections
};

class Proxy {
 public:
  // `listener` is a bound, listening TCP socket (any namespace). Does not start serving.
  static Result<std::shared_ptr<Proxy>> create(boost::asio::io_context& io, UniqueFd listener,
                                               std::shared_ptr<const Policy> policy,
                                               std::shared_ptr<const NetworkConfig> config,
                                               ProxyLimits limits = {}, ProxyHooks hooks = {});
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  void start();
  // Stops listening at once (a box connecting afterwards is refused), then closes the listener
  // and every open connection asynchronously, on their strands.
  void stop();
  // New requests use `policy`; open tunnels keep the target they were checked for.
  void set_policy(std::shared_ptr<const Policy> policy);
  ProxyCounters counters() const;
  // The port the listener is bound to (for tests that listen on port 0).
  uint16_t port() const;

  struct Impl;

 private:
  explicit Proxy(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace agentbox::net
