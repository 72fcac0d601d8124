#include "sandbox/ns_network.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace agentbox::sandbox {
namespace {

Error with_context(Error e, std::string_view context) {
  e.message = std::string(context) + ": " + e.message;
  return e;
}

}  // namespace

BoxNetwork::BoxNetwork(boost::asio::io_context& io, pid_t init_pid,
                       std::shared_ptr<const net::NetworkConfig> config, std::string key)
    : io_(io),
      init_pid_(init_pid),
      config_(config ? std::move(config) : std::make_shared<const net::NetworkConfig>()),
      key_(std::move(key)) {}

Status BoxNetwork::set_mode(const NetworkMode& mode) {
  std::lock_guard lk(mu_);
  if (stopped_) return fail(Code::kUnavailable, "box " + key_ + " is shut down");
  if (mode.egress_policy && mode.open) {
    return fail(Code::kInvalid, "network: allowlist and open at once");
  }
  // Up first: a failure leaves the old mode as it was.
  std::unique_ptr<net::BoxEgress> new_egress;
  std::unique_ptr<net::OpenEgress> new_open;
  if (mode.egress_policy && !egress_) {
    auto eg = net::BoxEgress::start(io_, init_pid_, mode.egress_policy, config_, mode.egress_hooks);
    if (!eg) return std::unexpected(with_context(eg.error(), "box " + key_ + ": egress proxy"));
    new_egress = std::move(*eg);
  }
  if (mode.open && !open_) {
    auto eg = net::OpenEgress::start(init_pid_, *config_);
    if (!eg) return std::unexpected(with_context(eg.error(), "box " + key_ + ": open network"));
    new_open = std::move(*eg);
  }
  if (mode.egress_policy && egress_) egress_->set_policy(mode.egress_policy);
  // Then the old mode goes, and with it its connections.
  Status result;
  if (!mode.egress_policy && egress_) {
    egress_->stop();  // closes the listener and every connection it relays
    egress_.reset();
  }
  if (!mode.open && open_) {
    if (auto st = open_->stop_and_cut(init_pid_); !st) {
      // The route out is gone (stop() ran); only the abort of the old flows failed.
      spdlog::warn("ns box {}: cutting the open connections: {}", key_, st.error().message);
      result = std::unexpected(with_context(st.error(), "box " + key_ + ": leaving mode open"));
    }
    open_.reset();
  }
  if (new_egress) egress_ = std::move(new_egress);
  if (new_open) open_ = std::move(new_open);
  has_proxy_.store(egress_ != nullptr);
  return result;
}

Status BoxNetwork::set_policy(std::shared_ptr<const net::Policy> policy) {
  std::lock_guard lk(mu_);
  if (!egress_) return fail(Code::kNotSupported, "network policy: this box has no egress proxy");
  egress_->set_policy(std::move(policy));
  return {};
}

std::optional<net::ProxyCounters> BoxNetwork::counters() const {
  std::lock_guard lk(mu_);
  if (!egress_) return std::nullopt;
  return egress_->counters();
}

void BoxNetwork::stop() {
  std::lock_guard lk(mu_);
  stopped_ = true;
  has_proxy_.store(false);
  if (egress_) egress_->stop();
  if (open_) open_->stop();
}

}  // namespace agentbox::sandbox
