#include "client/client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "client/internal/endpoint.h"
#include "common/no_sigpipe.h"

namespace agentbox::client {
namespace {

using detail::Endpoint;
using detail::parse_server;

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

// The TLS context of an https:// server (TlsOptions): the error names the file that would not
// load.
Result<std::unique_ptr<ssl::context>> make_tls_context(const TlsOptions& t) {
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_client);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  ctx->set_verify_mode(ssl::verify_peer);
  error_code ec;
  if (t.ca_file.empty()) {
    ctx->set_default_verify_paths(ec);
  } else {
    ctx->load_verify_file(t.ca_file, ec);
  }
  if (ec) return fail(Code::kInvalid, "TLS CA file '" + t.ca_file + "': " + ec.message());
  if (t.cert_file.empty() != t.key_file.empty()) {
    return fail(Code::kInvalid, "TLS: a client certificate needs both its cert and key files");
  }
  if (!t.cert_file.empty()) {
    ctx->use_certificate_chain_file(t.cert_file, ec);
    if (ec) return fail(Code::kInvalid, "TLS cert file '" + t.cert_file + "': " + ec.message());
    ctx->use_private_key_file(t.key_file, ssl::context::pem, ec);
    if (ec) return fail(Code::kInvalid, "TLS key file '" + t.key_file + "': " + ec.message());
  }
  return ctx;
}

// Upload and download step: at most this much per read(2)/sendfile(2) and per event-loop turn
// (was 256 KiB: four times the syscalls and turns for the same bytes).
constexpr std::size_t kChunkBytes = 1024 * 1024;
constexpr std::size_t kReadBufferBytes = 64 * 1024;
constexpr std::uint32_t kMaxHeaderBytes = 64 * 1024;
// request() holds the whole reply in memory; replies are JSON, the largest an exec result with
// two capped output streams. Anything bigger belongs to request_stream().
constexpr std::uint64_t kMaxBufferedBody = 256ull << 20;
constexpr char kUserAgent[] = "agentbox-client/1";

std::optional<http::verb> parse_verb(std::string_view method) {
  http::verb v = http::string_to_verb(method);
  if (v == http::verb::unknown) return std::nullopt;
  return v;
}

// Failures that mean a reused keep-alive connection had been closed by the server while idle:
// the request never reached it, so sending it again on a fresh connection is safe.
bool is_stale_connection_error(const error_code& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
         ec == asio::error::connection_aborted || ec == http::error::partial_message;
}

template <class Fields>
void copy_headers(const http::header<false, Fields>& h, Response& out) {
  for (const auto& f : h) {
    std::string name(f.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out.headers[name] = std::string(f.value());
  }
}

}  // namespace

std::optional<ApiError> api_error(const Response& r) {
  auto j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto e = j.find("error");
  if (e == j.end() || !e->is_object()) return std::nullopt;
  auto code = e->find("code");
  auto message = e->find("message");
  if (code == e->end() || !code->is_string()) return std::nullopt;
  ApiError out;
  out.code = code->get<std::string>();
  if (message != e->end() && message->is_string()) out.message = message->get<std::string>();
  return out;
}

std::string url_encode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    // RFC 3986 unreserved characters, plus '/' which is legal in a query and keeps paths
    // readable in logs.
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '.' || c == '_' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  return out;
}

// Synchronous from the caller's point of view; every socket operation is an async one run to
// completion on a private io_context, because beast::tcp_stream's timeouts only apply to async
// operations. Not thread-safe: one Client per thread.
struct Client::Impl {
  explicit Impl(ClientOptions o) : opts(std::move(o)) {
    // Beast sizes each socket read by the buffer's free capacity (at least 512 bytes, at most
    // 64 KiB); a buffer left at its initial size would read a big download 512 bytes at a time.
    buffer.reserve(kReadBufferBytes);
    if (auto ep = parse_server(opts.server)) {
      endpoint = std::move(*ep);
    } else {
      url_error = ep.error();
    }
    if (endpoint.tls) {
      if (auto ctx = make_tls_context(opts.tls)) {
        tls_ctx = std::move(*ctx);
      } else {
        url_error = ctx.error();
      }
    }
  }

  ClientOptions opts;
  Endpoint endpoint;
  std::optional<Error> url_error;
  asio::io_context ioc;
  // One of the two while connected: plain, or TLS over TCP (https://).
  std::optional<beast::tcp_stream> stream;
  std::unique_ptr<ssl::context> tls_ctx;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;

  bool connected() const { return stream.has_value() || tls.has_value(); }
  beast::tcp_stream& tcp() { return tls ? beast::get_lowest_layer(*tls) : *stream; }

  // run() of an operation on the connection's stream, whichever it is: `op(stream, handler)`.
  template <class Op>
  error_code io(Op&& op) {
    if (tls) return run([&](auto handler) { op(*tls, handler); });
    return run([&](auto handler) { op(*stream, handler); });
  }

  // Runs one async operation to completion; the timeout (reset per operation) bounds how long
  // the peer may stay silent, not the whole exchange.
  template <class Start>
  error_code run(Start&& start) {
    error_code result = asio::error::would_block;
    tcp().expires_after(opts.timeout);
    start([&result](error_code ec, std::size_t) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }

  Error io_error(std::string_view op, const error_code& ec) {
    std::string what = std::string(op) + " " + opts.server + ": " + ec.message();
    close();
    if (ec == beast::error::timeout) {
      return Error::make(Code::kTimedOut, what + " (no reply within " +
                                              std::to_string(opts.timeout.count()) + " ms)");
    }
    return Error::make(Code::kUnavailable, std::move(what));
  }

  void close() {
    if (connected()) {
      error_code ignored;
      tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
      tcp().close();
    }
    tls.reset();
    stream.reset();
    buffer.clear();
  }

  // Whether the server has sent something (or closed) that we have not read yet.
  bool readable_now() {
    if (buffer.size() > 0) return true;
    pollfd p{tcp().socket().native_handle(), POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  // An idle keep-alive connection has nothing to read; if it is readable, the server closed it
  // (or broke protocol), so do not send on it.
  bool idle_connection_usable() {
    if (!connected() || !tcp().socket().is_open()) return false;
    return !readable_now();
  }

  // Returns whether the connection is a reused one.
  Result<bool> ensure_connected() {
    if (url_error) return std::unexpected(*url_error);
    if (idle_connection_usable()) return true;
    close();
    error_code ec;
    tcp::resolver resolver(ioc);
    auto results = resolver.resolve(endpoint.host, endpoint.port, ec);
    if (ec) {
      return fail(Code::kUnavailable, "resolve " + endpoint.host + ": " + ec.message());
    }
    if (endpoint.tls) {
      tls.emplace(ioc, *tls_ctx);
    } else {
      stream.emplace(ioc);
    }
    ec = run([&](auto handler) {
      tcp().async_connect(results, [handler](error_code e, auto) { handler(e, 0); });
    });
    if (ec) return std::unexpected(io_error("connect", ec));
    tcp().socket().set_option(tcp::no_delay(true), ec);  // small request/reply round trips
    if (tls) {
      // The name the certificate must carry (a DNS name or an IP address), and SNI for a name.
      tls->set_verify_callback(ssl::host_name_verification(endpoint.host));
      error_code literal;
      asio::ip::make_address(endpoint.host, literal);
      if (literal) SSL_set_tlsext_host_name(tls->native_handle(), endpoint.host.c_str());
      ec = run([&](auto handler) {
        tls->async_handshake(ssl::stream_base::client, [handler](error_code e) { handler(e, 0); });
      });
      if (ec) return std::unexpected(io_error("TLS handshake with", ec));
    }
    return false;
  }

  template <class Body>
  void prepare(http::request<Body>& req, http::verb verb, std::string_view target) {
    req.method(verb);
    req.target(target);
    req.version(11);
    req.set(http::field::host, endpoint.host_header);
    req.set(http::field::user_agent, kUserAgent);
    if (!opts.token.empty()) req.set(http::field::authorization, "Bearer " + opts.token);
  }

  Result<http::verb> verb_of(std::string_view method) {
    auto v = parse_verb(method);
    if (!v) return fail(Code::kInvalid, "unknown HTTP method " + std::string(method));
    return *v;
  }

  // Sends a request with an in-memory body and reads the reply header. `retryable` tells the
  // caller a stale keep-alive connection ate the request, so it may be sent again.
  Status send_and_read_header(const http::request<http::string_body>& req,
                              http::response_parser<http::buffer_body>& parser, bool reused,
                              bool& retryable) {
    retryable = false;
    error_code ec = io([&](auto& s, auto handler) { http::async_write(s, req, handler); });
    if (!ec) {
      ec = io([&](auto& s, auto handler) { http::async_read_header(s, buffer, parser, handler); });
    }
    if (ec) {
      retryable = reused && is_stale_connection_error(ec) && !parser.is_header_done();
      return std::unexpected(io_error("request", ec));
    }
    return {};
  }

  // Reads the body behind an already read header, handing it out in chunks.
  Status read_body(http::response_parser<http::buffer_body>& parser,
                   const std::function<bool(std::string_view)>& on_chunk, bool& aborted) {
    aborted = false;
    std::unique_ptr<char[]> buf(new char[kChunkBytes]);
    if (!parser.is_done() && !parser.chunked() && parser.content_length()) {
      return read_sized_body(parser, *parser.content_length(), buf.get(), on_chunk, aborted);
    }
    while (!parser.is_done()) {
      parser.get().body().data = buf.get();
      parser.get().body().size = kChunkBytes;
      // read_some, not read: hand out what has arrived (a live exec's output) instead of
      // waiting for the chunk buffer to fill.
      error_code ec =
          io([&](auto& s, auto handler) { http::async_read_some(s, buffer, parser, handler); });
      if (ec == http::error::need_buffer) ec = {};
      if (ec) return std::unexpected(io_error("reading reply from", ec));
      std::size_t n = kChunkBytes - parser.get().body().size;
      if (n > 0 && !on_chunk(std::string_view(buf.get(), n))) {
        aborted = true;
        close();  // the rest of the body is unread: the connection cannot be reused
        return {};
      }
    }
    if (!parser.keep_alive()) close();
    return {};
  }

  // A Content-Length body (a file download): what was read with the header is handed out from
  // `buffer`, the rest is read from the socket straight into `buf`, kChunkBytes a call at
  // most, bypassing the parser (which reads 64 KiB a call and copies each byte once more).
  Status read_sized_body(http::response_parser<http::buffer_body>& parser, std::uint64_t left,
                         char* buf, const std::function<bool(std::string_view)>& on_chunk,
                         bool& aborted) {
    const bool keep_alive = parser.keep_alive();
    if (buffer.size() > 0) {
      auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), left));
      auto data = buffer.data();
      std::string_view first(static_cast<const char*>(data.data()), n);
      left -= n;
      bool more = on_chunk(first);
      buffer.consume(n);
      if (!more) {
        aborted = true;
        close();
        return {};
      }
    }
    while (left > 0) {
      auto want = static_cast<std::size_t>(std::min<std::uint64_t>(kChunkBytes, left));
      std::size_t n = 0;
      error_code ec = io([&](auto& s, auto handler) {
        s.async_read_some(asio::buffer(buf, want), [&n, handler](error_code e, std::size_t k) {
          n = k;
          handler(e, k);
        });
      });
      if (ec == asio::error::eof && n == 0) ec = http::error::partial_message;
      if (ec) return std::unexpected(io_error("reading reply from", ec));
      left -= n;
      if (n > 0 && !on_chunk(std::string_view(buf, n))) {
        aborted = true;
        close();
        return {};
      }
    }
    if (!keep_alive) close();
    return {};
  }

  Result<Response> exchange(std::string_view method, std::string_view target, std::string_view body,
                            std::string_view content_type,
                            const std::function<bool(std::string_view)>* on_chunk,
                            const std::function<void(const Response&)>* on_header = nullptr,
                            const Client::Headers* headers = nullptr) {
    auto verb = verb_of(method);
    if (!verb) return std::unexpected(verb.error());
    http::request<http::string_body> req;
    prepare(req, *verb, target);
    if (headers != nullptr) {
      for (const auto& [name, value] : *headers) req.set(name, value);
    }
    if (!body.empty() || *verb == http::verb::post || *verb == http::verb::put) {
      if (!content_type.empty()) req.set(http::field::content_type, content_type);
      req.body() = std::string(body);
      req.prepare_payload();
    }
    for (int attempt = 0;; ++attempt) {
      auto reused = ensure_connected();
      if (!reused) return std::unexpected(reused.error());
      http::response_parser<http::buffer_body> parser;
      parser.header_limit(kMaxHeaderBytes);
      parser.body_limit(boost::none);
      bool retryable = false;
      if (auto st = send_and_read_header(req, parser, *reused, retryable); !st) {
        if (retryable && attempt == 0) continue;  // reconnect once
        return std::unexpected(st.error());
      }
      Response out;
      out.status = parser.get().result_int();
      copy_headers(parser.get().base(), out);
      const bool ok = out.status >= 200 && out.status < 300;
      if (on_header != nullptr && *on_header) (*on_header)(out);
      std::uint64_t total = 0;
      bool too_big = false;
      auto collect = [&](std::string_view chunk) {
        total += chunk.size();
        if (total > kMaxBufferedBody) {
          too_big = true;
          return false;
        }
        out.body.append(chunk);
        return true;
      };
      bool aborted = false;
      Status st = (on_chunk != nullptr && ok) ? read_body(parser, *on_chunk, aborted)
                                              : read_body(parser, collect, aborted);
      if (!st) return std::unexpected(st.error());
      if (too_big) {
        return fail(Code::kTooBig, std::string(method) + " " + std::string(target) +
                                       ": reply body over " + std::to_string(kMaxBufferedBody) +
                                       " bytes");
      }
      return out;
    }
  }

  // Sends up to `want` bytes of `src_fd` (from its file offset) to the socket with sendfile(2):
  // the kernel hands page-cache pages to the socket, where read(2) + write(2) would copy every
  // byte twice through our memory. Waits (poll) while the socket is full. Returns the count
  // sent, 0 when the file ended; a socket error as `ec`.
  std::size_t sendfile_some(int src_fd, std::size_t want, error_code& ec) {
    const int sock = tcp().socket().native_handle();
    const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
    for (;;) {
      ssize_t n = call_without_sigpipe([&] { return ::sendfile(sock, src_fd, nullptr, want); });
      if (n >= 0) return static_cast<std::size_t>(n);
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        ec = error_code(errno, boost::system::system_category());
        return 0;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        ec = beast::error::timeout;
        return 0;
      }
      pollfd p{sock, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000))) < 0 &&
          errno != EINTR) {
        ec = error_code(errno, boost::system::system_category());
        return 0;
      }
    }
  }

  // `src_fd` >= 0: the body is read from that file with sendfile (see sendfile_some); else it
  // is pulled from `read` and written from a buffer.
  Result<Response> upload(std::string_view method, std::string_view target, std::uint64_t size,
                          const std::function<Result<std::size_t>(char*, std::size_t)>& read,
                          int src_fd, const std::function<void(std::uint64_t)>& progress) {
    auto verb = verb_of(method);
    if (!verb) return std::unexpected(verb.error());
    // The body cannot be replayed, so a connection the server closed while idle is detected
    // before sending (ensure_connected polls it) rather than retried after.
    auto reused = ensure_connected();
    if (!reused) return std::unexpected(reused.error());

    http::request<http::buffer_body> req;
    prepare(req, *verb, target);
    req.set(http::field::content_type, "application/octet-stream");
    req.content_length(size);
    req.body().data = nullptr;
    req.body().more = true;
    http::request_serializer<http::buffer_body> sr(req);

    error_code ec = io([&](auto& s, auto handler) { http::async_write_header(s, sr, handler); });
    std::unique_ptr<char[]> buf(new char[kChunkBytes]);
    std::uint64_t sent = 0;
    bool answered_early = false;
    while (!ec && sent < size) {
      // A server that refuses the upload (401, 404, 413) answers before reading the body; stop
      // sending then instead of pushing the rest of a large file into a connection nobody reads.
      if (readable_now()) {
        answered_early = true;
        break;
      }
      std::size_t want =
          static_cast<std::size_t>(std::min<std::uint64_t>(kChunkBytes, size - sent));
      if (src_fd >= 0) {
        std::size_t n = sendfile_some(src_fd, want, ec);
        if (ec) break;
        if (n == 0) {
          close();
          return fail(Code::kInvalid, "upload source ended after " + std::to_string(sent) + " of " +
                                          std::to_string(size) + " bytes");
        }
        sent += n;
        if (progress) progress(sent);
        continue;
      }
      auto n = read(buf.get(), want);
      if (!n) {
        close();
        return std::unexpected(n.error());
      }
      if (*n == 0 || *n > want) {
        close();
        return fail(Code::kInvalid, "upload source ended after " + std::to_string(sent) + " of " +
                                        std::to_string(size) + " bytes");
      }
      req.body().data = buf.get();
      req.body().size = *n;
      req.body().more = true;
      ec = io([&](auto& s, auto handler) { http::async_write(s, sr, handler); });
      if (ec == http::error::need_buffer) ec = {};
      if (!ec) {
        sent += *n;
        if (progress) progress(sent);
      }
    }
    if (!ec && !answered_early) {
      req.body().data = nullptr;
      req.body().size = 0;
      req.body().more = false;
      ec = io([&](auto& s, auto handler) { http::async_write(s, sr, handler); });
      if (ec == http::error::need_buffer) ec = {};
    }
    // Even when sending failed, the server may have answered before it stopped reading (an
    // early 404/413/401): that reply says more than "broken pipe", so try to read it.
    http::response_parser<http::string_body> parser;
    parser.header_limit(kMaxHeaderBytes);
    parser.body_limit(kMaxBufferedBody);
    error_code rec =
        io([&](auto& s, auto handler) { http::async_read(s, buffer, parser, handler); });
    if (rec) {
      return std::unexpected(io_error(ec ? "upload to" : "reading reply from", ec ? ec : rec));
    }
    Response out;
    out.status = parser.get().result_int();
    copy_headers(parser.get().base(), out);
    out.body = std::move(parser.get().body());
    // After an early answer part of the body is unsent: the connection cannot carry another
    // request.
    if (ec || answered_early || !parser.keep_alive()) close();
    return out;
  }
};

Client::Client(ClientOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {}

Client::~Client() {
  if (impl_) impl_->close();
}

Result<Response> Client::request(std::string_view method, std::string_view target,
                                 std::string_view body, std::string_view content_type) {
  return impl_->exchange(method, target, body, content_type, nullptr);
}

Result<Response> Client::request(std::string_view method, std::string_view target,
                                 std::string_view body, std::string_view content_type,
                                 const Headers& headers) {
  return impl_->exchange(method, target, body, content_type, nullptr, nullptr, &headers);
}

Result<Response> Client::request_stream(std::string_view method, std::string_view target,
                                        std::string_view body,
                                        const std::function<bool(std::string_view)>& on_chunk,
                                        const std::function<void(const Response&)>& on_header) {
  return impl_->exchange(method, target, body, "application/json", &on_chunk, &on_header);
}

Result<Response> Client::upload(std::string_view method, std::string_view target,
                                std::uint64_t size,
                                const std::function<Result<std::size_t>(char*, std::size_t)>& read,
                                const std::function<void(std::uint64_t)>& progress) {
  return impl_->upload(method, target, size, read, -1, progress);
}

Result<Response> Client::upload_file(std::string_view method, std::string_view target, int fd,
                                     std::uint64_t size,
                                     const std::function<void(std::uint64_t)>& progress) {
  if (impl_->endpoint.tls) {  // sendfile cannot pass through TLS: read and write
    auto from_fd = [fd](char* buf, std::size_t n) -> Result<std::size_t> {
      for (;;) {
        ssize_t got = ::read(fd, buf, n);
        if (got >= 0) return static_cast<std::size_t>(got);
        if (errno != EINTR) return fail_errno(errno, "read(upload source)");
      }
    };
    return impl_->upload(method, target, size, from_fd, -1, progress);
  }
  return impl_->upload(method, target, size, {}, fd, progress);
}

}  // namespace agentbox::client
