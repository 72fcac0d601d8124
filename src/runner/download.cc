#include "runner/download.h"

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <optional>

#include "runner/url.h"

namespace agentbox::runner {
namespace {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace ssl = boost::asio::ssl;
using Clock = std::chrono::steady_clock;

using HttpUrl = Url;

std::optional<HttpUrl> parse(const std::string& s) {
  return parse_url(s, "http", "https");
}

// One GET on a fresh connection; the response (body bounded) or an error.
template <typename Stream>
Result<http::response<http::string_body>> get(Stream& s, const HttpUrl& u, asio::io_context& io,
                                              Clock::time_point deadline) {
  http::request<http::empty_body> req{http::verb::get, u.target, 11};
  req.set(http::field::host, u.host);
  req.set(http::field::user_agent, "agentbox-runner");
  beast::error_code ec;
  beast::get_lowest_layer(s).expires_at(deadline);
  http::async_write(s, req, [&](beast::error_code e, std::size_t) { ec = e; });
  io.run();
  io.restart();
  if (ec) return fail(Code::kInternal, "download_file: send request: " + ec.message());
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(static_cast<std::uint64_t>(kMaxDownloadBytes));
  http::async_read(s, buf, parser, [&](beast::error_code e, std::size_t) { ec = e; });
  io.run();
  io.restart();
  if (ec == http::error::body_limit) {
    return fail(Code::kTooBig,
                "download_file: over the " + std::to_string(kMaxDownloadBytes) + "-byte limit");
  }
  if (ec) return fail(Code::kInternal, "download_file: read response: " + ec.message());
  return parser.release();
}

Result<http::response<http::string_body>> fetch(const HttpUrl& u, ssl::context& tls,
                                                Clock::time_point deadline) {
  asio::io_context io;
  asio::ip::tcp::resolver res(io);
  beast::error_code ec;
  auto eps = res.resolve(u.host, u.port, ec);
  if (ec) return fail(Code::kInternal, "download_file: resolve " + u.host + ": " + ec.message());
  beast::tcp_stream tcp(io);
  tcp.expires_at(deadline);
  tcp.async_connect(eps, [&](beast::error_code e, const auto&) { ec = e; });
  io.run();
  io.restart();
  if (ec) return fail(Code::kInternal, "download_file: connect " + u.host + ": " + ec.message());
  if (!u.tls) return get(tcp, u, io, deadline);
  beast::ssl_stream<beast::tcp_stream> s(std::move(tcp), tls);
  SSL_set_tlsext_host_name(s.native_handle(), u.host.c_str());
  s.set_verify_callback(ssl::host_name_verification(u.host));
  s.async_handshake(ssl::stream_base::client, [&](beast::error_code e) { ec = e; });
  io.run();
  io.restart();
  if (ec) return fail(Code::kInternal, "download_file: TLS " + u.host + ": " + ec.message());
  return get(s, u, io, deadline);
}

}  // namespace

Result<std::int64_t> download_file(const std::string& url, const WorkspaceFs& fs,
                                   const std::string& output_path, ssl::context& tls) {
  auto u = parse(url);
  if (!u) return fail(Code::kInvalid, "download_file: url \"" + url + "\" is not http(s)://");
  // The target is checked before any byte is fetched.
  std::string rel = AB_TRY(fs.relative(output_path));
  if (rel.empty()) return fail(Code::kAccess, "download_file: output_path is the workspace");
  auto deadline = Clock::now() + std::chrono::minutes(5);
  std::string body;
  for (int hop = 0;; ++hop) {
    auto r = AB_TRY(fetch(*u, tls, deadline));
    unsigned st = r.result_int();
    if (st >= 300 && st < 400 && r.count(http::field::location)) {
      if (hop == 10) return fail(Code::kInternal, "download_file: stopped after 10 redirects");
      std::string loc(r[http::field::location]);
      if (loc.rfind("http://", 0) == 0 || loc.rfind("https://", 0) == 0) {
        auto next = parse(loc);
        if (!next) return fail(Code::kInternal, "download_file: bad redirect " + loc);
        u = next;
      } else if (!loc.empty() && loc[0] == '/') {
        u->target = loc;
      } else {
        return fail(Code::kInternal, "download_file: unsupported redirect " + loc);
      }
      continue;
    }
    if (st < 200 || st >= 300) {
      return fail(Code::kInternal, "download_file: HTTP " + std::to_string(st) + " from " + url);
    }
    body = std::move(r.body());
    break;
  }
  if (auto slash = rel.rfind('/'); slash != std::string::npos) {
    AB_TRY(fs.mkdir_all(rel.substr(0, slash), 0755));
  }
  auto w = AB_TRY(fs.create(rel, 0644));
  AB_TRY(w.write(body));
  AB_TRY(w.commit());
  return static_cast<std::int64_t>(body.size());
}

}  // namespace agentbox::runner
