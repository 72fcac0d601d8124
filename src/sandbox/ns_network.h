#pragma once
// The network of one ns box (sandbox/ns_backend.h): its egress proxy (mode "allowlist") or its
// veth out (mode "open"), neither for "none", set up once the box's init (and so its netns)
// exists, switched live by Sandbox::set_network, torn down with the box. Thread-safe.

#include <sys/types.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/error.h"
#include "net/box_egress.h"
#include "net/open_egress.h"
#include "net/policy.h"
#include "sandbox/sandbox.h"

namespace agentbox::sandbox {

class BoxNetwork {
 public:
  // config: the daemon's network settings (null: the defaults). key names the box in errors.
  BoxNetwork(boost::asio::io_context& io, pid_t init_pid,
             std::shared_ptr<const net::NetworkConfig> config, std::string key);
  ~BoxNetwork() { stop(); }
  BoxNetwork(const BoxNetwork&) = delete;
  BoxNetwork& operator=(const BoxNetwork&) = delete;

  // Puts the box in `mode` (the first call: from "none"); see Sandbox::set_network. The new
  // mode's plumbing comes up before the old one's goes, except that a failure to bring it up
  // leaves the old mode in place. Blocking (ip, nft, ss). kUnavailable after stop().
  Status set_mode(const NetworkMode& mode);
  // The allowlist's policy for new connections; ENOTSUP without a proxy.
  Status set_policy(std::shared_ptr<const net::Policy> policy);
  // Whether commands get the proxy variables (mode allowlist). Never waits for a switch in
  // progress (called where each command starts, on a network thread).
  bool has_proxy() const { return has_proxy_.load(); }
  std::optional<net::ProxyCounters> counters() const;
  // The box is going down: nothing listens and nothing routes out once this returns.
  void stop();

 private:
  boost::asio::io_context& io_;
  const pid_t init_pid_;
  const std::shared_ptr<const net::NetworkConfig> config_;
  const std::string key_;
  mutable std::mutex mu_;
  std::unique_ptr<net::BoxEgress> egress_;  // mode allowlist
  std::unique_ptr<net::OpenEgress> open_;   // mode open
  bool stopped_ = false;
  std::atomic<bool> has_proxy_{false};  // egress_ != nullptr, readable without mu_
};

}  // namespace agentbox::sandbox
