#include "net/splice.h"

#include <fcntl.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/unique_fd.h"

namespace agentbox::net {

namespace asio = boost::asio;
using namespace boost::asio::experimental::awaitable_operators;
using tcp = asio::ip::tcp;

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
constexpr std::size_t kStep = 1024 * 1024;  // per splice(2), and the pipe's size

namespace {

// Waits until `s` is ready for `w`, at most `limit`: false on an error or at the limit.
asio::awaitable<bool> ready(tcp::socket& s, tcp::socket::wait_type w,
                            std::chrono::steady_clock::duration limit) {
  asio::steady_timer timer(s.get_executor(), limit);
  auto r = co_await (s.async_wait(w, kTuple) || timer.async_wait(kTuple));
  if (r.index() == 1) co_return false;
  auto [ec] = std::get<0>(r);
  co_return !ec;
}

}  // namespace

asio::awaitable<bool> splice_relay(tcp::socket& from, tcp::socket& to, std::uint64_t left,
                                   std::chrono::steady_clock::duration limit,
                                   std::function<void(std::size_t)> on_moved) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) co_return false;
  UniqueFd rd(p[0]), wr(p[1]);
  (void)::fcntl(wr.get(), F_SETPIPE_SZ, static_cast<int>(kStep));
  boost::system::error_code ec;
  from.non_blocking(true, ec);
  to.non_blocking(true, ec);
  bool ok = true;
  while (left > 0 && ok) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(left, kStep));
    ssize_t n = ::splice(from.native_handle(), nullptr, wr.get(), nullptr, want,
                         SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (!co_await ready(from, tcp::socket::wait_read, limit)) {
        ok = false;
      }
      continue;
    }
    if (n <= 0) {  // an error, or the owner's end before the length it announced
      ok = false;
      break;
    }
    left -= static_cast<std::uint64_t>(n);
    while (n > 0) {
      ssize_t m = ::splice(rd.get(), nullptr, to.native_handle(), nullptr,
                           static_cast<std::size_t>(n), SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (m < 0 && errno == EINTR) continue;
      if (m < 0 && errno == EAGAIN) {
        if (!co_await ready(to, tcp::socket::wait_write, limit)) {
          ok = false;
          break;
        }
        continue;
      }
      if (m <= 0) {  // the client left: closing `from` tells the owner
        ok = false;
        break;
      }
      if (on_moved) on_moved(static_cast<std::size_t>(m));
      n -= m;
    }
  }
  to.non_blocking(false, ec);  // the client's connection goes on with Beast
  co_return ok;
}

}  // namespace agentbox::net
