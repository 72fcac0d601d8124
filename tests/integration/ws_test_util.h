#pragma once
// The Beast WebSocket client steps the integration suites share: connect and upgrade, and a read
// bounded in time. Each suite's client class wraps them with what it needs (headers, frames).

#include <boost/asio/connect.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <optional>
#include <string>

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

}  // namespace agentbox::testing
