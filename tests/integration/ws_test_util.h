#pragma once
// The Beast WebSocket client steps the integration suites share: connect and upgrade, and a read
// bounded in time. Each suite's client class wraps them with what it needs (headers, frames).

#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace agentbox::testing {

// Resolves and connects "HOST:PORT", then upgrades to `target` (decorators set on `ws` apply).
// The handshake's answer is in `res` (a refused upgrade: upgrade_declined, its status there).
inline boost::beast::error_code ws_connect(
    boost::asio::io_context& ioc, boost::beast::websocket::stream<boost::asio::ip::tcp::socket>& ws,
    const std::string& host_port, const std::string& target,
    boost::beast::websocket::response_type& res) {
  auto colon = host_port.rfind(':');
  boost::asio::ip::tcp::resolver resolver(ioc);
  boost::beast::error_code ec;
  auto eps = resolver.resolve(host_port.substr(0, colon), host_port.substr(colon + 1), ec);
  if (ec) return ec;
  boost::asio::connect(ws.next_layer(), eps, ec);
  if (ec) return ec;
  ws.handshake(res, host_port, target, ec);
  return ec;
}

// The next message of `ws` (whose io_context runs nothing else meanwhile), waiting at most
// `timeout`. nullopt when the read failed (*error: e.g. websocket::error::closed) or nothing
// came in time (*error: timed_out, and the socket is closed).
inline std::optional<std::string> ws_read_for(
    boost::asio::io_context& ioc, boost::beast::websocket::stream<boost::asio::ip::tcp::socket>& ws,
    std::chrono::milliseconds timeout, boost::beast::error_code* error) {
  boost::beast::flat_buffer buf;
  std::optional<boost::beast::error_code> done;
  ws.async_read(buf, [&](boost::beast::error_code ec, std::size_t) { done = ec; });
  ioc.restart();
  ioc.run_for(timeout);
  if (!done) {
    boost::beast::error_code ec;
    ws.next_layer().close(ec);
    ioc.restart();
    ioc.run();
    *error = boost::asio::error::timed_out;
    return std::nullopt;
  }
  *error = *done;
  if (*done) return std::nullopt;
  return boost::beast::buffers_to_string(buf.data());
}

// A WebSocket client for a test: binary or text frames, reads bounded in time, the close reason.
class Ws {
 public:
  // Headers the upgrade request carries (before open()).
  void set_headers(std::vector<std::pair<std::string, std::string>> headers) {
    ws_.set_option(boost::beast::websocket::stream_base::decorator(
        [headers = std::move(headers)](boost::beast::websocket::request_type& req) {
          for (const auto& [k, v] : headers) req.set(k, v);
        }));
  }
  boost::beast::error_code open(const std::string& host_port, const std::string& target) {
    return ws_connect(ioc_, ws_, host_port, target, res_);
  }
  int status() const { return res_.result_int(); }
  // The next message, or nullopt when the socket closed or nothing came within `timeout`.
  std::optional<std::string> read(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    boost::beast::error_code ec;
    auto m = ws_read_for(ioc_, ws_, timeout, &ec);
    if (m) binary_ = ws_.got_binary();
    return m;
  }
  // Reads until the frames seen so far contain `want` (or the socket ends); returns them.
  std::string read_until(const std::string& want) {
    std::string all;
    while (all.find(want) == std::string::npos) {
      auto m = read();
      if (!m) break;
      all += *m;
    }
    return all;
  }
  void write(const std::string& data, bool binary) {
    ws_.binary(binary);
    boost::beast::error_code ec;
    ws_.write(boost::asio::buffer(data), ec);
    EXPECT_FALSE(ec) << ec.message();
  }
  void close() {
    boost::beast::error_code ec;
    ws_.close(boost::beast::websocket::close_code::normal, ec);
  }
  bool last_binary() const { return binary_; }
  boost::beast::websocket::close_reason reason() const { return ws_.reason(); }

 private:
  boost::asio::io_context ioc_;
  boost::beast::websocket::stream<boost::asio::ip::tcp::socket> ws_{ioc_};
  boost::beast::websocket::response_type res_;
  bool binary_ = false;
};

inline std::string reason_of(const Ws& ws) {
  auto r = ws.reason().reason;
  return std::string(r.data(), r.size());
}

}  // namespace agentbox::testing
