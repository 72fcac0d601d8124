#include "service/op_events.h"

namespace agentbox::service {

std::string_view surface_name(Surface s) {
  switch (s) {
    case Surface::kV1: return "v1";
    case Surface::kSeed001: return "seed001";
    case Surface::kLangbot: return "langbot";
    case Surface::kE2b: return "e2b";
    case Surface::kMcp: return "mcp";
    case Surface::kRunner: return "runner";
    case Surface::kDaemon: return "daemon";
  }
  return "unknown";
}

std::shared_ptr<void> OpBus::subscribe(OpSubscriber fn) {
  auto sub = std::make_shared<OpSubscriber>(std::move(fn));
  std::lock_guard lk(mu_);
  std::erase_if(subs_, [](const std::weak_ptr<OpSubscriber>& w) { return w.expired(); });
  subs_.push_back(sub);
  return sub;
}

void OpBus::publish(const OpEvent& ev) const {
  std::vector<std::shared_ptr<OpSubscriber>> live;
  {
    std::lock_guard lk(mu_);
    for (const auto& w : subs_) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (const auto& s : live) (*s)(ev);
}

void OpBus::emit(std::string_view op, const Origin& origin, std::string_view session,
                 const Fields& fields) const {
  publish(OpEvent{op, origin, session, fields});
}

}  // namespace agentbox::service
