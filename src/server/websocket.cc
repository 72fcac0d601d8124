#include "server/websocket.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/websocket.hpp>

#include "common/log.h"

namespace agentbox::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using namespace boost::asio::experimental::awaitable_operators;

namespace {
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
}  // namespace

WsSession::WsSession(beast::tcp_stream stream, WsOptions opts)
    : ws_(std::move(stream)), opts_(opts), wake_(ws_.get_executor()) {
  // The websocket's own timeouts replace the tcp_stream's.
  beast::get_lowest_layer(ws_).expires_never();
  websocket::stream_base::timeout t;
  t.handshake_timeout = std::chrono::seconds(30);
  // Beast pings after half the idle timeout without traffic and closes after the whole.
  t.idle_timeout = opts_.ping_interval * 2;
  t.keep_alive_pings = true;
  ws_.set_option(t);
  ws_.read_message_max(opts_.max_message_bytes);
  // A message goes out as one frame in one write: Beast's default cuts it into 4 KiB frames, a
  // syscall each (1 MiB runner file chunks crawled). The messages the peer sees are the same.
  ws_.auto_fragment(false);
  ws_.set_option(websocket::stream_base::decorator(
      [](websocket::response_type& res) { res.set(beast::http::field::server, "agentboxd"); }));
}

void WsSession::set_subprotocol(std::string protocol) {
  ws_.set_option(websocket::stream_base::decorator([protocol](websocket::response_type& res) {
    res.set(beast::http::field::server, "agentboxd");
    if (!protocol.empty()) res.set(beast::http::field::sec_websocket_protocol, protocol);
  }));
}

asio::awaitable<beast::error_code> WsSession::accept(
    beast::http::request<beast::http::empty_body> req) {
  auto [ec] = co_await ws_.async_accept(req, kTuple);
  if (ec) done_ = true;
  co_return ec;
}

asio::awaitable<void> WsSession::run(OnMessage on_message) {
  co_await (read_loop(std::move(on_message)) || write_loop());
  done_ = true;
  queue_.clear();
  queued_bytes_ = 0;
  beast::error_code ec;
  beast::get_lowest_layer(ws_).socket().close(ec);
}

asio::awaitable<void> WsSession::read_loop(OnMessage on_message) {
  beast::flat_buffer buf;
  for (;;) {
    auto [ec, n] = co_await ws_.async_read(buf, kTuple);
    (void)n;
    if (ec) {
      // message_too_big: Beast has sent the close frame (1009) already.
      if (ec != websocket::error::closed) spdlog::debug("websocket read ended: {}", ec.message());
      break;
    }
    on_message(beast::buffers_to_string(buf.data()), ws_.got_binary());
    buf.consume(buf.size());
  }
  done_ = true;
  wake_.cancel();
}

asio::awaitable<void> WsSession::write_loop() {
  for (;;) {
    while (queue_.empty() && !close_requested_ && !done_) {
      wake_.expires_at(asio::steady_timer::time_point::max());
      auto [ec] = co_await wake_.async_wait(kTuple);  // woken, or cancelled
      (void)ec;
      auto cs = co_await asio::this_coro::cancellation_state;
      if (cs.cancelled() != asio::cancellation_type::none) co_return;
    }
    if (done_) co_return;
    if (queue_.empty()) {  // close_requested_, everything sent
      auto [ec] = co_await ws_.async_close(close_reason_, kTuple);
      (void)ec;  // closing either way
      co_return;
    }
    Message m = std::move(queue_.front());
    queue_.pop_front();
    ws_.binary(m.binary);
    auto [ec, n] = co_await ws_.async_write(asio::buffer(m.data), kTuple);
    (void)n;
    queued_bytes_ -= m.data.size();
    if (ec) co_return;
  }
}

void WsSession::send(std::string data, bool binary) {
  asio::post(ws_.get_executor(), [self = shared_from_this(), m = Message{std::move(data), binary}]() mutable {
    self->enqueue(std::move(m));
  });
}

void WsSession::close(websocket::close_code code, std::string reason) {
  asio::post(ws_.get_executor(), [self = shared_from_this(), code, reason = std::move(reason)] {
    if (self->done_ || self->close_requested_) return;
    self->close_requested_ = true;
    self->close_reason_ = websocket::close_reason(code, reason);
    self->wake_.cancel();
  });
}

void WsSession::enqueue(Message m) {
  if (done_ || close_requested_) return;
  // The size counts while the message is queued or being written.
  if (queued_bytes_ + m.data.size() > opts_.max_queued_bytes) {
    abort("the peer does not read: its write queue is full");
    return;
  }
  queued_bytes_ += m.data.size();
  queue_.push_back(std::move(m));
  wake_.cancel();
}

void WsSession::abort(const char* why) {
  spdlog::info("websocket closed: {}", why);
  done_ = true;
  beast::error_code ec;
  beast::get_lowest_layer(ws_).socket().close(ec);
  wake_.cancel();
}

}  // namespace agentbox::server
