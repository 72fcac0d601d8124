#pragma once
// A fake of xbot's runner server (shared/PROTOCOLS.md 1.1, 1.2, 1.6), written from the document:
// serves /ws/{user} on 127.0.0.1, checks `register` (token, user_id, URL user) and answers
// `register_ok` {"status":"ok"} (no version, as xbot) or `error` + close; then the test sends
// requests with "req_<hex>" ids and waits for replies by id, while pushes (stdio_*, pty_*) are
// routed by type into their own list. Boost.Beast, callbacks on one I/O thread.

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runner/protocol.h"

namespace agentbox::testing {

namespace fx {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace websocket = boost::beast::websocket;
namespace p = runner::proto;
using tcp = asio::ip::tcp;
}  // namespace fx

class FakeXbotServer {
 public:
  struct Options {
    std::string user = "alice";
    std::string token = "T";
    bool send_version = false;  // register_ok says version 2 (an agentboxd before 3), not xbot's
  };

  explicit FakeXbotServer(Options o) : opts_(std::move(o)), acceptor_(io_) {
    fx::tcp::endpoint ep(fx::asio::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(ep.protocol());
    acceptor_.set_option(fx::asio::socket_base::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  FakeXbotServer() : FakeXbotServer(Options{}) {}
  ~FakeXbotServer() {
    fx::asio::post(io_, [this] {
      acceptor_.close();
      if (cur_) fx::beast::get_lowest_layer(cur_->ws).close();
      io_.stop();
    });
    thread_.join();
  }

  int port() const { return port_; }
  std::string url() const {
    return "ws://127.0.0.1:" + std::to_string(port_) + "/ws/" + opts_.user;
  }

  // Every register frame seen, accepted or not; the time of each connection.
  std::vector<fx::p::Envelope> registrations() {
    std::lock_guard l(mu_);
    return registrations_;
  }
  std::vector<std::chrono::steady_clock::time_point> connect_times() {
    std::lock_guard l(mu_);
    return connect_times_;
  }
  int accepted() {
    std::lock_guard l(mu_);
    return accepted_;
  }
  // Waits until `n` registrations have been accepted.
  bool wait_accepted(int n, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock l(mu_);
    return cv_.wait_for(l, limit, [&] { return accepted_ >= n; });
  }
  bool wait_connections(std::size_t n, std::chrono::milliseconds limit) {
    std::unique_lock l(mu_);
    return cv_.wait_for(l, limit, [&] { return connect_times_.size() >= n; });
  }

  // Sends a raw frame on the current connection.
  void send(std::string frame) {
    fx::asio::post(io_, [this, f = std::move(frame)]() mutable {
      if (cur_) cur_->write(std::move(f));
    });
  }
  // Sends a frame with the given id (a transfer's follow-up frames).
  void send_with_id(const std::string& id, std::string_view type, fx::p::Json body) {
    send(fx::p::frame(id, type, std::move(body)));
  }
  // Sends a request with a fresh id; returns the id.
  std::string send_request(std::string_view type, fx::p::Json body) {
    std::string id = fx::p::generate_id();
    fx::p::Envelope e{id, std::string(type), opts_.user, std::move(body)};
    send(fx::p::encode(e));
    return id;
  }
  // The reply to `id`; nullopt after `limit`.
  std::optional<fx::p::Envelope> wait_reply(
      const std::string& id, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    std::unique_lock l(mu_);
    if (!cv_.wait_for(l, limit, [&] { return replies_.count(id) > 0; })) return std::nullopt;
    auto& q = replies_[id];
    auto e = std::move(q.front());
    q.pop_front();
    if (q.empty()) replies_.erase(id);
    return e;
  }
  // Request and reply; a missing reply is an envelope of type "timeout".
  fx::p::Envelope request(std::string_view type, fx::p::Json body,
                          std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    auto r = wait_reply(send_request(type, std::move(body)), limit);
    if (!r) return fx::p::Envelope{"", "timeout", "", std::nullopt};
    return *r;
  }
  // Pushes (stdio_data, stdio_exit, pty_data, pty_exit) in arrival order.
  std::vector<fx::p::Envelope> pushes() {
    std::lock_guard l(mu_);
    return pushes_;
  }
  bool wait_push(const std::function<bool(const std::vector<fx::p::Envelope>&)>& pred,
                 std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock l(mu_);
    return cv_.wait_for(l, limit, [&] { return pred(pushes_); });
  }
  // The concatenated data of `type` pushes for `stream`.
  std::string pushed_data(std::string_view type, const std::string& stream) {
    return data_in(pushes(), type, stream);
  }
  // The same over a list of pushes (as wait_push's predicate gets it).
  static std::string data_in(const std::vector<fx::p::Envelope>& pushes, std::string_view type,
                             const std::string& stream) {
    std::string out;
    for (const auto& e : pushes) {
      if (e.type != type) continue;
      auto d = fx::p::body_as<fx::p::StreamData>(e);
      if (d && d->stream_id == stream) out += d->data;
    }
    return out;
  }
  // Frames with an id nobody asked for, e.g. a reply to a fire-and-forget frame.
  int unexpected_replies() {
    std::lock_guard l(mu_);
    int n = 0;
    for (const auto& [id, q] : replies_) n += static_cast<int>(q.size());
    return n;
  }
  // Drops the current connection without a close frame (as a dead server would).
  void drop() {
    fx::asio::post(io_, [this] {
      if (cur_) fx::beast::get_lowest_layer(cur_->ws).close();
    });
  }

 private:
  struct Session : std::enable_shared_from_this<Session> {
    Session(FakeXbotServer* s, fx::tcp::socket sock) : srv(s), ws(std::move(sock)) {}
    FakeXbotServer* srv;
    fx::websocket::stream<fx::beast::tcp_stream> ws;
    fx::beast::flat_buffer buf;
    fx::http::request<fx::http::string_body> req;
    std::deque<std::string> out;
    bool registered = false;
    bool closing = false;

    void start() {
      auto self = shared_from_this();
      fx::http::async_read(ws.next_layer(), buf, req, [self](auto ec, std::size_t) {
        if (ec) return;
        self->ws.read_message_max(0);  // xbot sets no read limit
        self->ws.async_accept(self->req, [self](auto ec2) {
          if (ec2) return;
          self->read();
        });
      });
    }
    void read() {
      auto self = shared_from_this();
      buf.consume(buf.size());
      ws.async_read(buf, [self](auto ec, std::size_t) {
        if (ec) return;
        self->srv->on_frame(self, fx::beast::buffers_to_string(self->buf.data()));
        if (!self->closing) self->read();
      });
    }
    void write(std::string f) {
      out.push_back(std::move(f));
      if (out.size() == 1) write_next();
    }
    void write_next() {
      auto self = shared_from_this();
      ws.text(true);
      ws.async_write(fx::asio::buffer(out.front()), [self](auto ec, std::size_t) {
        if (ec) return;
        self->out.pop_front();
        if (!self->out.empty()) {
          self->write_next();
        } else if (self->closing) {
          fx::beast::get_lowest_layer(self->ws).close();  // xbot: no close frame
        }
      });
    }
  };

  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, fx::tcp::socket sock) {
      if (ec) return;
      {
        std::lock_guard l(mu_);
        connect_times_.push_back(std::chrono::steady_clock::now());
      }
      cv_.notify_all();
      auto s = std::make_shared<Session>(this, std::move(sock));
      s->start();
      accept();
    });
  }

  void on_frame(const std::shared_ptr<Session>& s, const std::string& text) {
    auto e = fx::p::decode(text);
    if (!s->registered) {
      // xbot: a first frame that is not register (or not JSON) gets no reply at all.
      if (!e || e->type != fx::p::type::kRegister) return;
      {
        std::lock_guard l(mu_);
        registrations_.push_back(*e);
      }
      auto b = fx::p::body_as<fx::p::RegisterBody>(*e);
      std::string url_user = std::string(s->req.target().substr(s->req.target().rfind('/') + 1));
      auto refuse = [&](const char* code, const char* msg) {
        s->closing = true;
        s->write(fx::p::error_frame("", code, msg));
        cv_.notify_all();
      };
      if (!b || b->auth_token != opts_.token) return refuse("AUTH_FAILED", "authentication failed");
      if (b->user_id.empty()) return refuse("INVALID", "missing user_id");
      if (b->user_id != url_user) return refuse("FORBIDDEN", "user_id mismatch");
      s->registered = true;
      fx::p::RegisterOk ok;
      if (opts_.send_version) ok.version = fx::p::kStreamsVersion;
      s->write(fx::p::frame("", fx::p::type::kRegisterOk, fx::p::to_json(ok)));
      cur_ = s;
      {
        std::lock_guard l(mu_);
        ++accepted_;
      }
      cv_.notify_all();
      return;
    }
    if (!e) return;
    {
      std::lock_guard l(mu_);
      // As xbot's server: pushes by type before id; replies by id.
      if (fx::p::is_push(e->type)) {
        pushes_.push_back(std::move(*e));
      } else if (!e->id.empty()) {
        replies_[e->id].push_back(std::move(*e));  // a transfer has several frames per id
      }
    }
    cv_.notify_all();
  }

  Options opts_;
  fx::asio::io_context io_;
  fx::tcp::acceptor acceptor_;
  int port_ = 0;
  std::thread thread_;
  std::shared_ptr<Session> cur_;  // I/O thread only
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<fx::p::Envelope> registrations_;
  std::vector<std::chrono::steady_clock::time_point> connect_times_;
  int accepted_ = 0;
  std::map<std::string, std::deque<fx::p::Envelope>> replies_;
  std::vector<fx::p::Envelope> pushes_;
};

}  // namespace agentbox::testing
