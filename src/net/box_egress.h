#pragma once
// The allowlist egress of one running box, as the session manager holds it: the proxy listening
// at 127.0.0.1:3128 inside the box's network namespace (created when the box starts, stopped
// when it stops), the live policy, the counters for /metrics, and the box's proxy environment.
// The one call the session wiring needs per mode "allowlist" box (see docs in net/proxy.h).

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "net/policy.h"
#include "net/proxy.h"

namespace agentbox::net {

class BoxEgress {
 public:
  // Opens the listener in the network namespace of `box_pid` (any process of the box, e.g. its
  // init) and starts serving on `io`. kInvalid/kAccess etc. as Result when the namespace is gone
  // or the port is taken.
  static Result<std::unique_ptr<BoxEgress>> start(boost::asio::io_context& io, pid_t box_pid,
                                                  std::shared_ptr<const Policy> policy,
                                                  std::shared_ptr<const NetworkConfig> config,
                                                  ProxyHooks hooks = {}, ProxyLimits limits = {});
  ~BoxEgress();
  BoxEgress(const BoxEgress&) = delete;
  BoxEgress& operator=(const BoxEgress&) = delete;

  // POST /v1/sessions/{id}/network: new connections use `policy`.
  void set_policy(std::shared_ptr<const Policy> policy) { proxy_->set_policy(std::move(policy)); }
  ProxyCounters counters() const { return proxy_->counters(); }
  void stop() { proxy_->stop(); }

  // HTTP_PROXY, HTTPS_PROXY, http_proxy, https_proxy = http://127.0.0.1:3128 and
  // NO_PROXY/no_proxy = localhost,127.0.0.1, as NAME=value strings for the box's environment.
  static std::vector<std::pair<std::string, std::string>> box_env();

 private:
  explicit BoxEgress(std::shared_ptr<Proxy> p) : proxy_(std::move(p)) {}
  std::shared_ptr<Proxy> proxy_;
};

}  // namespace agentbox::net
