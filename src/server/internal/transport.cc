// The shared pieces of the transport (transport.h): replies, "100 Continue", streamed request
// bodies, the client-gone watch.

#include "server/internal/transport.h"

#include <sys/socket.h>

#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <vector>

#include "common/log.h"

namespace agentbox::server::detail {

namespace {

// After an error reply to a request whose body was not read, how long we keep reading (and
// dropping) what the client still sends, so it sees our reply rather than a reset.
constexpr auto kLingerTime = std::chrono::seconds(3);

// Closes after an early reply: stop sending, then drain what the client still sends for a
// moment so our reply is not lost to a TCP reset.
asio::awaitable<void> lingering_close(Conn* conn) {
  beast::error_code ec;
  conn->stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  conn->stream.expires_after(kLingerTime);
  std::vector<char> scratch(16384);
  for (;;) {
    auto [rec, n] = co_await conn->stream.async_read_some(asio::buffer(scratch), kTuple);
    if (rec) break;
  }
  conn->stream.close();
}

}  // namespace

bool is_disconnect(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == http::error::partial_message ||
         ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::operation_aborted || ec == asio::error::broken_pipe ||
         ec == beast::error::timeout || ec == asio::error::bad_descriptor;
}

void log_request(const Call* call, int status) {
  const Exchange* ex = &call->ex;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  ex->start)
                .count();
  auto level = status >= 500 && status != 501 ? spdlog::level::err : spdlog::level::debug;
  spdlog::log(level, "conn={} req={} {} {} -> {} ({} ms)", call->conn->id, ex->req.id,
              ex->req.method, ex->req.path, status, ms);
}

asio::awaitable<bool> send_reply(Call* call, Reply reply) {
  Context* ctx = call->ctx;
  Conn* conn = call->conn;
  Exchange* ex = &call->ex;
  http::response<http::string_body> res{static_cast<http::status>(reply.status), ex->version};
  res.set(http::field::server, "agentboxd");
  res.set(http::field::content_type, reply.content_type);
  for (auto& [k, v] : reply.headers) res.set(k, v);
  res.body() = std::move(reply.body);
  bool keep = ex->keep_alive && !ex->body_pending && !ctx->stopping;
  res.keep_alive(keep);
  res.prepare_payload();
  log_request(call, reply.status);
  conn->stream.expires_after(ctx->opts.io_timeout);
  auto [ec, n] = co_await http::async_write(conn->stream, res, kTuple);
  ctx->metrics.add_bytes_out(n);
  if (ec) co_return false;
  if (!keep && ex->body_pending) co_await lingering_close(conn);
  co_return keep;
}

asio::awaitable<bool> send_error(Call* call, Error e) {
  co_return co_await send_reply(call, error_reply(e));
}

asio::awaitable<NdjsonStream> start_ndjson(Call* call) {
  Context* ctx = call->ctx;
  Exchange* ex = &call->ex;
  NdjsonStream out;
  out.chunked = ex->version >= 11;
  out.keep = ex->keep_alive && out.chunked && !ctx->stopping;
  http::response<http::empty_body> res{http::status::ok, ex->version};
  res.set(http::field::server, "agentboxd");
  res.set(http::field::content_type, "application/x-ndjson");
  res.set(http::field::cache_control, "no-store");
  res.keep_alive(out.keep);
  if (out.chunked) res.chunked(true);
  out.ok = co_await write_head(call, res);
  co_return out;
}

asio::awaitable<bool> write_head(Call* call, http::response<http::empty_body>& res) {
  http::response_serializer<http::empty_body> sr{res};
  call->conn->stream.expires_after(call->ctx->opts.io_timeout);
  auto [ec, n] = co_await http::async_write_header(call->conn->stream, sr, kTuple);
  call->ctx->metrics.add_bytes_out(n);
  if (ec) co_return false;
  log_request(call, 200);
  co_return true;
}

asio::awaitable<bool> write_stream(Context* ctx, Conn* conn, bool chunked, std::string_view data) {
  conn->stream.expires_after(ctx->opts.io_timeout);
  beast::error_code ec;
  std::size_t n = 0;
  if (chunked) {
    std::tie(ec, n) =
        co_await asio::async_write(conn->stream, http::make_chunk(asio::buffer(data)), kTuple);
  } else {
    std::tie(ec, n) = co_await asio::async_write(conn->stream, asio::buffer(data), kTuple);
  }
  ctx->metrics.add_bytes_out(n);
  co_return !ec;
}

asio::awaitable<bool> end_stream(Context* ctx, Conn* conn, bool chunked) {
  if (!chunked) co_return true;
  conn->stream.expires_after(ctx->opts.io_timeout);
  auto [ec, n] = co_await asio::async_write(conn->stream, http::make_chunk_last(), kTuple);
  ctx->metrics.add_bytes_out(n);
  co_return !ec;
}

asio::awaitable<bool> maybe_continue(Call* call) {
  Exchange* ex = &call->ex;
  if (!ex->expect_continue) co_return true;
  ex->expect_continue = false;
  http::response<http::empty_body> res{http::status::continue_, ex->version};
  auto [ec, n] = co_await http::async_write(call->conn->stream, res, kTuple);
  co_return !ec;
}

// A client that pipelines its next request makes the socket readable without EOF; then we cannot
// tell and wait until cancelled.
asio::awaitable<void> watch_disconnect(tcp::socket* sock, bool* gone) {
  for (;;) {
    auto [ec] = co_await sock->async_wait(tcp::socket::wait_read, kTuple);
    if (ec == asio::error::operation_aborted) co_return;  // the command finished first
    if (ec) break;
    char c;
    ssize_t n = ::recv(sock->native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) break;  // EOF
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) break;
    if (n > 0) {
      asio::steady_timer forever(sock->get_executor(), asio::steady_timer::time_point::max());
      co_await forever.async_wait(kTuple);
      co_return;
    }
  }
  *gone = true;
}

void start_body(Call* call, BodyReader* r, std::uint64_t cap) {
  r->conn = call->conn;
  r->buffer = call->buffer;
  r->timeout = call->ctx->opts.io_timeout;
  if (call->ex.content_length) {
    r->raw_left = call->ex.body_pending ? *call->ex.content_length : 0;
    return;
  }
  r->parser.emplace(std::move(*call->hp));
  r->parser->body_limit(cap);
  // Beast reads into the free capacity of `buffer` (at least 512 bytes, at most 64 KiB a call):
  // without room made here, a body streams in 512-byte reads.
  call->buffer->reserve(64u << 10);
}

asio::awaitable<BodyChunk> read_body_chunk(BodyReader* r, char* dst, std::size_t cap) {
  BodyChunk out;
  if (r->parser) {
    r->parser->get().body().data = dst;
    r->parser->get().body().size = cap;
    r->conn->stream.expires_after(r->timeout);
    auto read_op = http::async_read(r->conn->stream, *r->buffer, *r->parser, kTuple);
    auto [ec, n] = co_await std::move(read_op);
    out.ec = ec == http::error::need_buffer ? beast::error_code{} : ec;
    out.wire_bytes = n;
    out.got = cap - r->parser->get().body().size;
    co_return out;
  }
  auto want = static_cast<std::size_t>(std::min<std::uint64_t>(cap, r->raw_left));
  std::size_t have = std::min(want, r->buffer->size());
  if (have > 0) {
    asio::buffer_copy(asio::buffer(dst, have), r->buffer->data());
    r->buffer->consume(have);
  }
  out.got = have;
  if (have < want) {
    r->conn->stream.expires_after(r->timeout);
    auto read_op = asio::async_read(r->conn->stream, asio::buffer(dst + have, want - have), kTuple);
    auto [ec, n] = co_await std::move(read_op);
    out.ec = ec;
    out.got += n;
  }
  out.wire_bytes = out.got;
  r->raw_left -= out.got;
  co_return out;
}

std::string header_value(const Call* call, std::string_view name) {
  const auto& h = call->hp->get();
  auto it = h.find(name);
  return it == h.end() ? std::string() : std::string(it->value());
}

bool has_header(const Call* call, std::string_view name) {
  const auto& h = call->hp->get();
  return h.find(name) != h.end();
}

asio::awaitable<Result<std::string>> read_whole_body(Call* call, std::size_t cap) {
  Exchange* ex = &call->ex;
  std::string out;
  if (!ex->body_pending) co_return out;
  Error too_big = Error::make(
      Code::kTooBig, "request body is over the limit of " + std::to_string(cap) + " bytes");
  if (ex->content_length && *ex->content_length > cap) co_return std::unexpected(too_big);
  if (!co_await maybe_continue(call)) {
    co_return std::unexpected(Error::make(Code::kUnavailable, "client gone"));
  }
  BodyReader body;
  start_body(call, &body, cap);
  std::vector<char> buf(64 * 1024);
  while (!body.done()) {
    BodyChunk chunk = co_await read_body_chunk(&body, buf.data(), buf.size());
    call->ctx->metrics.add_bytes_in(chunk.wire_bytes);
    if (chunk.ec && is_disconnect(chunk.ec)) {
      co_return std::unexpected(Error::make(Code::kUnavailable, "client gone"));
    }
    if (chunk.ec) co_return std::unexpected(body_error(chunk.ec, too_big));
    if (out.size() + chunk.got > cap) co_return std::unexpected(too_big);
    out.append(buf.data(), chunk.got);
  }
  ex->body_pending = false;
  co_return out;
}

Error body_error(const beast::error_code& ec, const Error& too_big) {
  if (ec == http::error::body_limit) return too_big;
  return Error::make(Code::kInvalid, "malformed request body: " + ec.message());
}

}  // namespace agentbox::server::detail
