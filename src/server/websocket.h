#pragma once
// One server-side WebSocket (Boost.Beast websocket::stream), the reusable piece under every
// WebSocket surface (/v1/events now; process attach, pty, runners, the LangBot relay later).
//
// - Messages are bounded (max_message_bytes): a bigger one closes the socket with 1009.
// - The server pings a quiet peer every ping_interval and closes it when nothing (no pong) comes
//   back within another interval.
// - One writer per socket: send() queues (from any thread; it posts to the socket's executor)
//   and a single write loop drains the queue. The queue is bounded (max_queued_bytes): a peer
//   that stops reading is closed once it is full, and nothing else is disturbed.
//
// Lifetime: held by a shared_ptr; producers keep a weak_ptr.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/websocket/stream.hpp>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>

namespace agentbox::server {

struct WsOptions {
  std::size_t max_message_bytes = 16u << 20;
  std::chrono::milliseconds ping_interval{30000};
  std::size_t max_queued_bytes = 16u << 20;
};

class WsSession : public std::enable_shared_from_this<WsSession> {
 public:
  using Stream = boost::beast::websocket::stream<boost::beast::tcp_stream>;
  // A message from the peer: its bytes, and whether it was a binary frame. Runs on the socket's
  // executor.
  using OnMessage = std::function<void(std::string data, bool binary)>;

  WsSession(boost::beast::tcp_stream stream, WsOptions opts);

  // Before accept(): the subprotocol the 101 selects (Sec-WebSocket-Protocol); "" = none.
  void set_subprotocol(std::string protocol);
  // Answers the upgrade request `req` (101). An error: the socket is unusable, drop it.
  boost::asio::awaitable<boost::beast::error_code> accept(
      boost::beast::http::request<boost::beast::http::empty_body> req);
  // Reads, writes and pings until the socket closes (either side, a bound, an error).
  boost::asio::awaitable<void> run(OnMessage on_message);

  // Any thread. Queues one message (text unless `binary`).
  void send(std::string data, bool binary = false);
  // Any thread. Sends what is queued, then a close frame with `code`.
  void close(boost::beast::websocket::close_code code, std::string reason = {});

  boost::asio::any_io_executor get_executor() { return ws_.get_executor(); }

 private:
  struct Message {
    std::string data;
    bool binary = false;
  };
  void enqueue(Message m);  // on the executor
  void abort(const char* why);
  boost::asio::awaitable<void> read_loop(OnMessage on_message);
  boost::asio::awaitable<void> write_loop();

  Stream ws_;
  WsOptions opts_;
  boost::asio::steady_timer wake_;  // the writer waits on it for work
  std::deque<Message> queue_;
  std::size_t queued_bytes_ = 0;
  bool close_requested_ = false;
  boost::beast::websocket::close_reason close_reason_;
  bool done_ = false;  // the socket is finished: nothing more is queued or written
};

}  // namespace agentbox::server
