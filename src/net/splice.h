#pragma once
// A socket-to-socket relay in the kernel: splice(2) from one TCP socket into a pipe and from the
// pipe into the other, so the bytes never pass through this process (a forwarded download).

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <functional>

namespace agentbox::net {

// Moves `left` bytes from `from` to `to`; `on_moved` (optional) gets each count written. Both
// sockets are made non-blocking for it and `to` is put back. False when a side ends, fails, or
// is not ready for `limit`.
boost::asio::awaitable<bool> splice_relay(boost::asio::ip::tcp::socket& from,
                                          boost::asio::ip::tcp::socket& to, std::uint64_t left,
                                          std::chrono::steady_clock::duration limit,
                                          std::function<void(std::size_t)> on_moved);

}  // namespace agentbox::net
