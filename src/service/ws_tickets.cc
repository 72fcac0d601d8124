#include "service/ws_tickets.h"

#include <sys/random.h>

#include <cerrno>

namespace agentbox::service {

namespace {

Result<std::string> random_ticket() {
  unsigned char b[32];
  std::size_t got = 0;
  while (got < sizeof(b)) {
    const ssize_t n = ::getrandom(b + got, sizeof(b) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail_errno(errno, "getrandom");
    }
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * sizeof(b));
  for (unsigned char c : b) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace

WsTickets::WsTickets(std::chrono::seconds ttl, Clock clock)
    : ttl_(ttl),
      clock_(clock ? std::move(clock) : Clock([] { return std::chrono::steady_clock::now(); })) {}

void WsTickets::prune_locked(std::chrono::steady_clock::time_point now) {
  // Expired first, then the oldest while over the bound.
  while (!by_expiry_.empty() &&
         (by_expiry_.begin()->first <= now || tickets_.size() >= kMaxTickets)) {
    tickets_.erase(by_expiry_.begin()->second);
    by_expiry_.erase(by_expiry_.begin());
  }
}

Result<std::string> WsTickets::issue(const session::Caller& caller) {
  auto ticket = random_ticket();
  if (!ticket) return ticket;
  const auto now = clock_();
  std::lock_guard lock(mu_);
  prune_locked(now);
  tickets_.insert_or_assign(*ticket, Entry{caller, now + ttl_});
  by_expiry_.emplace(now + ttl_, *ticket);
  return ticket;
}

std::optional<session::Caller> WsTickets::redeem(const std::string& ticket) {
  const auto now = clock_();
  std::lock_guard lock(mu_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return std::nullopt;
  Entry e = std::move(it->second);
  tickets_.erase(it);
  // Its by_expiry_ entry goes with the next prune (it names a ticket no longer in the map).
  for (auto [a, b] = by_expiry_.equal_range(e.expires); a != b; ++a) {
    if (a->second == ticket) {
      by_expiry_.erase(a);
      break;
    }
  }
  if (e.expires <= now) return std::nullopt;
  return e.caller;
}

std::size_t WsTickets::size() const {
  std::lock_guard lock(mu_);
  return tickets_.size();
}

}  // namespace agentbox::service
