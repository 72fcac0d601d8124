#include "client/websocket.h"

#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "client/internal/endpoint.h"

namespace agentbox::client {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

namespace {

constexpr char kUserAgent[] = "agentbox-client/1";
// The server's messages are bounded at 16 MiB by default (API.md); room above that.
constexpr std::size_t kMaxReadMessage = 32u << 20;
// The input reader waits while this much is queued for the server.
constexpr std::size_t kInputHighWater = 1u << 20;
constexpr std::size_t kInputChunk = 64u << 10;
// A server that says nothing for this long (it pings every 30 s) is taken for gone; Beast pings
// it at half of it.
constexpr std::chrono::seconds kIdleTimeout{75};

// State the input thread shares with the loop. The thread may outlive the WebSocket (it can be
// blocked in read(2) on a terminal): it holds this by shared_ptr and posts to the io_context
// only under `mu` while `stopped` is false.
struct InputShared {
  std::mutex mu;
  std::condition_variable cv;
  bool stopped = false;
  bool may_read = true;  // the loop has taken the last chunk and the queue has room
};

}  // namespace

struct WebSocket::Impl {
  explicit Impl(ClientOptions o) : opts(std::move(o)) {
    if (auto ep = detail::parse_server(opts.server); ep && ep->tls) {
      url_error = Error::make(Code::kNotSupported, "server URL " + opts.server +
                                                       ": WebSocket over TLS (wss) is not built");
    } else if (ep) {
      endpoint = std::move(*ep);
    } else {
      url_error = ep.error();
    }
  }

  ClientOptions opts;
  detail::Endpoint endpoint;
  std::optional<Error> url_error;
  asio::io_context ioc;
  websocket::stream<beast::tcp_stream> ws{ioc};
  beast::flat_buffer rbuf;
  Handlers h;

  std::deque<WsMessage> queue;
  std::size_t queued = 0;
  bool writing = false;
  bool close_wanted = false;
  bool closing = false;
  websocket::close_reason close_reason;
  bool done = false;
  WsEnd end;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::optional<asio::signal_set> sigs;
  std::optional<asio::steady_timer> ticker;
  std::shared_ptr<InputShared> input;
  bool input_waiting = false;  // the reader waits for room in the queue

  Error io_error(std::string_view op, const error_code& ec) {
    std::string what = std::string(op) + " " + opts.server + ": " + ec.message();
    if (ec == beast::error::timeout) {
      return Error::make(Code::kTimedOut, what + " (no reply in time)");
    }
    return Error::make(Code::kUnavailable, std::move(what));
  }

  // Runs one async operation to completion (connect and handshake).
  template <class Start>
  error_code run_one(Start&& start) {
    error_code result = asio::error::would_block;
    start([&result](error_code ec) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }

  Result<Response> connect(std::string_view target) {
    if (url_error) return std::unexpected(*url_error);
    error_code ec;
    tcp::resolver resolver(ioc);
    auto results = resolver.resolve(endpoint.host, endpoint.port, ec);
    if (ec) return fail(Code::kUnavailable, "resolve " + endpoint.host + ": " + ec.message());
    auto& tcp_layer = beast::get_lowest_layer(ws);
    tcp_layer.expires_after(opts.timeout);
    ec = run_one([&](auto handler) {
      tcp_layer.async_connect(results, [handler](error_code e, auto) { handler(e); });
    });
    if (ec) return std::unexpected(io_error("connect", ec));
    tcp_layer.socket().set_option(tcp::no_delay(true), ec);

    std::string token = opts.token;
    ws.set_option(websocket::stream_base::decorator([token](websocket::request_type& req) {
      req.set(http::field::user_agent, kUserAgent);
      if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
    }));
    ws.read_message_max(kMaxReadMessage);
    websocket::response_type res;
    tcp_layer.expires_after(opts.timeout);
    ec = run_one([&](auto handler) {
      ws.async_handshake(res, endpoint.host_header, target,
                         [handler](error_code e) { handler(e); });
    });
    Response out;
    out.status = res.result_int();
    for (const auto& f : res) {
      std::string name(f.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      out.headers[name] = std::string(f.value());
    }
    out.body = res.body();
    if (ec == websocket::error::upgrade_declined && out.status != 0) return out;
    if (ec) return std::unexpected(io_error("WebSocket upgrade to", ec));
    // From here Beast's own timeouts (which need the TCP layer's turned off): pings while
    // quiet, and an end to a server that answers nothing at all.
    tcp_layer.expires_never();
    websocket::stream_base::timeout t{};
    t.handshake_timeout = std::chrono::seconds(30);
    t.idle_timeout = kIdleTimeout;
    t.keep_alive_pings = true;
    ws.set_option(t);
    return out;
  }

  void finish() {
    if (done) return;
    done = true;
    if (sigs) {
      error_code ignored;
      sigs->cancel(ignored);
    }
    if (ticker) ticker->cancel();
    guard.reset();
    // What is left (a write to a socket the server closed, Beast's timers) has no reader.
    ioc.stop();
  }

  void start_read() {
    ws.async_read(rbuf, [this](error_code ec, std::size_t) {
      if (ec) {
        if (ec == websocket::error::closed) {
          end.closed = true;
          end.code = ws.reason().code;
          end.reason = std::string(ws.reason().reason.data(), ws.reason().reason.size());
        } else if (!done) {
          end.error = io_error("WebSocket", ec);
        }
        finish();
        return;
      }
      WsMessage m{beast::buffers_to_string(rbuf.data()), ws.got_binary()};
      rbuf.consume(rbuf.size());
      if (h.on_message) h.on_message(std::move(m));
      if (!done) start_read();
    });
  }

  void allow_input() {
    if (!input) return;
    std::lock_guard lock(input->mu);
    input->may_read = true;
    input->cv.notify_all();
  }

  void send(std::string data, bool binary) {
    if (done || close_wanted) return;
    queued += data.size();
    queue.push_back(WsMessage{std::move(data), binary});
    if (!writing) write_next();
  }

  void write_next() {
    if (queue.empty()) {
      writing = false;
      if (close_wanted && !closing) do_close();
      return;
    }
    writing = true;
    WsMessage& m = queue.front();
    ws.binary(m.binary);
    ws.async_write(asio::buffer(m.data), [this](error_code ec, std::size_t) {
      queued -= queue.front().data.size();
      queue.pop_front();
      if (ec) {
        writing = false;
        if (!done) end.error = io_error("WebSocket write to", ec);
        finish();
        return;
      }
      if (input_waiting && queued < kInputHighWater) {
        input_waiting = false;
        allow_input();
      }
      write_next();
    });
  }

  void close(int code, std::string reason) {
    if (done || close_wanted) return;
    close_wanted = true;
    close_reason = websocket::close_reason(static_cast<websocket::close_code>(code), reason);
    if (!writing) do_close();
  }

  void do_close() {
    closing = true;
    ws.async_close(close_reason, [this](error_code ec) {
      // The server's answer ends the pending read too; this covers a server that answered
      // our close without one.
      if (!done && ec) end.error = io_error("WebSocket close to", ec);
      if (!done && !ec) {
        end.closed = true;
        end.code = ws.reason().code;
        end.reason = std::string(ws.reason().reason.data(), ws.reason().reason.size());
      }
      finish();
    });
  }

  void wait_signal() {
    sigs->async_wait([this](error_code ec, int signo) {
      if (ec || done) return;
      if (h.on_signal) h.on_signal(signo);
      if (!done) wait_signal();
    });
  }

  void wait_tick() {
    ticker->expires_after(h.tick_interval);
    ticker->async_wait([this](error_code ec) {
      if (ec || done) return;
      if (h.on_tick) h.on_tick();
      if (!done) wait_tick();
    });
  }

  void deliver_input(const std::string& chunk) {
    if (done) return;
    if (h.on_input) h.on_input(chunk);
    if (chunk.empty()) return;
    if (queued < kInputHighWater) {
      allow_input();
    } else {
      input_waiting = true;
    }
  }

  void start_input(int fd) {
    input = std::make_shared<InputShared>();
    std::thread([this, fd, shared = input] {
      std::string buf(kInputChunk, '\0');
      for (;;) {
        ssize_t n;
        do {
          n = ::read(fd, buf.data(), buf.size());
        } while (n < 0 && errno == EINTR);
        std::string chunk = n > 0 ? buf.substr(0, static_cast<std::size_t>(n)) : std::string();
        std::unique_lock lock(shared->mu);
        if (shared->stopped) return;
        shared->may_read = false;
        // Posted under the lock: the loop sets `stopped` under it before the io_context goes.
        asio::post(ioc, [this, chunk = std::move(chunk)] { deliver_input(chunk); });
        if (n <= 0) return;
        shared->cv.wait(lock, [&] { return shared->stopped || shared->may_read; });
        if (shared->stopped) return;
      }
    }).detach();  // may stay blocked in read(2) until the process exits
  }

  void stop_input() {
    if (!input) return;
    std::lock_guard lock(input->mu);
    input->stopped = true;
    input->cv.notify_all();
  }

  WsEnd run(Handlers handlers) {
    h = std::move(handlers);
    end = WsEnd{};
    if (done) {
      end.error = Error::make(Code::kInvalid, "WebSocket: run() after the socket ended");
      return end;
    }
    guard.emplace(ioc.get_executor());
    ioc.restart();
    start_read();
    if (!h.signals.empty()) {
      sigs.emplace(ioc);
      for (int s : h.signals) sigs->add(s);
      wait_signal();
    }
    if (!queue.empty() && !writing) write_next();
    if (close_wanted && !closing && !writing) do_close();
    if (h.tick_interval.count() > 0) {
      ticker.emplace(ioc);
      wait_tick();
    }
    if (h.input_fd >= 0) start_input(h.input_fd);
    ioc.run();
    stop_input();
    sigs.reset();
    ticker.reset();
    return end;
  }
};

WebSocket::WebSocket(ClientOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {}

WebSocket::~WebSocket() {
  impl_->stop_input();
}

Result<Response> WebSocket::connect(std::string_view target) {
  return impl_->connect(target);
}

WsEnd WebSocket::run(Handlers handlers) {
  return impl_->run(std::move(handlers));
}

void WebSocket::send(std::string data, bool binary) {
  impl_->send(std::move(data), binary);
}

void WebSocket::close(int code, std::string reason) {
  impl_->close(code, std::move(reason));
}

}  // namespace agentbox::client
