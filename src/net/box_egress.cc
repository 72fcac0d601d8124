#include "net/box_egress.h"

#include "net/netns.h"

namespace agentbox::net {

Result<std::unique_ptr<BoxEgress>> BoxEgress::start(boost::asio::io_context& io, pid_t box_pid,
                                                    std::shared_ptr<const Policy> policy,
                                                    std::shared_ptr<const NetworkConfig> config,
                                                    ProxyHooks hooks, ProxyLimits limits) {
  auto fd = listen_in_netns_of(box_pid, kProxyAddress, kProxyPort);
  if (!fd) return std::unexpected(fd.error());
  auto p = Proxy::create(io, std::move(*fd), std::move(policy), std::move(config), limits,
                         std::move(hooks));
  if (!p) return std::unexpected(p.error());
  (*p)->start();
  return std::unique_ptr<BoxEgress>(new BoxEgress(std::move(*p)));
}

BoxEgress::~BoxEgress() {
  proxy_->stop();
}

std::vector<std::pair<std::string, std::string>> BoxEgress::box_env() {
  const std::string url = std::string("http://") + kProxyAddress + ":" + std::to_string(kProxyPort);
  return {{"HTTP_PROXY", url},
          {"HTTPS_PROXY", url},
          {"http_proxy", url},
          {"https_proxy", url},
          {"NO_PROXY", "localhost,127.0.0.1"},
          {"no_proxy", "localhost,127.0.0.1"}};
}

}  // namespace agentbox::net
