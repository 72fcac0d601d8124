#pragma once
// WebSocket tickets (API.md "Dashboard"): a browser cannot set the Authorization header on a
// WebSocket, so the dashboard trades its token (sent as a header on POST /v1/ws-tickets) for a
// ticket it puts in the WebSocket's URL instead (`?ticket=`). A ticket is
// - single-use: redeem() removes it, a second redeem finds nothing;
// - short-lived: it expires `ttl` after it was issued (30 s);
// - bound to its caller: redeem() answers the Caller that asked for it, nobody else's.
// SECURITY: tickets are 256 random bits; the book holds at most kMaxTickets (the oldest are
// dropped first), so a client asking in a loop cannot grow the daemon's memory.
// Thread-safe (one mutex); the clock is injectable for tests.

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "common/error.h"
#include "session/session_manager.h"

namespace agentbox::service {

class WsTickets {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  static constexpr std::size_t kMaxTickets = 4096;
  static constexpr std::chrono::seconds kDefaultTtl{30};

  explicit WsTickets(std::chrono::seconds ttl = kDefaultTtl, Clock clock = {});

  // A new ticket for `caller` (EINTERNAL when the kernel has no randomness to give).
  Result<std::string> issue(const session::Caller& caller);
  // The caller a live ticket was issued to, once; nullopt for an unknown, used or expired one.
  std::optional<session::Caller> redeem(const std::string& ticket);

  std::chrono::seconds ttl() const { return ttl_; }
  std::size_t size() const;

 private:
  struct Entry {
    session::Caller caller;
    std::chrono::steady_clock::time_point expires;
  };
  void prune_locked(std::chrono::steady_clock::time_point now);

  std::chrono::seconds ttl_;
  Clock clock_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> tickets_;
  // Issue order, to drop the oldest when full (ticket strings; stale ones are skipped).
  std::multimap<std::chrono::steady_clock::time_point, std::string> by_expiry_;
};

}  // namespace agentbox::service
