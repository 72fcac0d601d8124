#pragma once
// The transport under every surface: one HTTP/1.1 connection (Conn), one request on it (Call),
// and the pieces handlers use to answer it: whole replies, "100 Continue", streamed request
// bodies (Content-Length or chunked), the client-gone watch. http_server.cc reads the request
// head, authenticates, reads JSON bodies (parsing big ones in the pool), and hands the Call to
// the route's own handler.
//
// Threading: all of it runs on the io_context's thread; blocking work goes to the pool.

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "server/internal/context.h"

namespace agentbox::server::detail {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

inline constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

struct Conn {
  explicit Conn(tcp::socket s) : stream(std::move(s)) {}
  beast::tcp_stream stream;
  std::uint64_t id = 0;
  bool idle = true;  // waiting for the next request: shutdown may close it
  // Set while the connection is something else than HTTP (a WebSocket): how shutdown ends it.
  std::function<void()> on_shutdown;
};

// What one request/response exchange needs to know about its request beyond Request.
struct Exchange {
  Request req;
  unsigned version = 11;
  bool keep_alive = true;
  bool body_pending = false;  // the request has a body we have not read
  bool expect_continue = false;
  std::optional<std::uint64_t> content_length;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

using HeaderParser = http::request_parser<http::empty_body>;

// One request on its connection, as a route's handler gets it.
struct Call {
  Context* ctx = nullptr;
  Conn* conn = nullptr;
  beast::flat_buffer* buffer = nullptr;  // bytes read past the request head
  std::unique_ptr<HeaderParser> hp;      // the request head; streamed bodies continue from it
  const RouteSpec* route = nullptr;
  Exchange ex;
};

// A client gone, a timeout, a cancelled read: ends the connection without a reply.
bool is_disconnect(const beast::error_code& ec);

void log_request(const Call* call, int status);

// Writes a whole reply. Returns whether the connection may serve another request.
asio::awaitable<bool> send_reply(Call* call, Reply reply);
asio::awaitable<bool> send_error(Call* call, Error e);
// "100 Continue" for clients that wait for it before sending a body (curl does, over 1 MiB).
asio::awaitable<bool> maybe_continue(Call* call);

// A streamed NDJSON reply (exec/stream, process output, a build's log): writes the 200 head
// (chunked on HTTP/1.1; HTTP/1.0 streams raw and closes) and logs the request. `ok` false: the
// client is gone. `keep`: whether the connection may serve another request after the last chunk.
struct NdjsonStream {
  bool ok = false;
  bool chunked = false;
  bool keep = false;
};
asio::awaitable<NdjsonStream> start_ndjson(Call* call);
// Writes the head of a 200 whose body the caller then writes itself (counted, logged once
// written); false when the client is gone.
asio::awaitable<bool> write_head(Call* call, http::response<http::empty_body>& res);
// Writes `data` (whole lines) to a started stream: one chunk when chunked.
asio::awaitable<bool> write_stream(Context* ctx, Conn* conn, bool chunked, std::string_view data);
// Ends a started stream: the last chunk when chunked (without chunking the close ends it).
asio::awaitable<bool> end_stream(Context* ctx, Conn* conn, bool chunked);

// Completes when the client has closed its end (EOF or an error on the socket), and sets *gone.
// Runs beside a command as `exec || watch_disconnect`: its completion cancels the exec.
asio::awaitable<void> watch_disconnect(tcp::socket* sock, bool* gone);

// A streamed request body (BodyKind::kRaw). With a Content-Length the bytes go straight from the
// socket into the caller's buffers (what was read past the head is taken from `buffer` first),
// never past the body; a chunked body goes through Beast's parser, which decodes the framing and
// caps the total.
struct BodyReader {
  Conn* conn = nullptr;
  beast::flat_buffer* buffer = nullptr;
  std::chrono::seconds timeout{};
  std::optional<http::request_parser<http::buffer_body>> parser;  // chunked bodies only
  std::uint64_t raw_left = 0;  // Content-Length bodies: bytes not yet read

  bool done() const { return parser ? parser->is_done() : raw_left == 0; }
};

// Sets up `r` for the body of `call` (whose Content-Length, if any, is within `cap`).
void start_body(Call* call, BodyReader* r, std::uint64_t cap);

struct BodyChunk {
  beast::error_code ec;
  std::size_t wire_bytes = 0;  // read from the socket or the buffer, framing included
  std::size_t got = 0;         // body bytes now in the chunk buffer
};

// Fills `dst` (up to `cap` bytes) with the next part of the body: a whole chunk unless the body
// ends first.
asio::awaitable<BodyChunk> read_body_chunk(BodyReader* r, char* dst, std::size_t cap);

// The reply to a body that could not be read (ec not a disconnect): 413 over the cap, else
// 400 EINVAL naming the framing fault, e.g. a malformed chunk.
Error body_error(const beast::error_code& ec, const Error& too_big);

// A request header's value ("" when absent), and whether it is present. Only before the body is
// read: a chunked body's parser takes the head over (start_body).
std::string header_value(const Call* call, std::string_view name);
bool has_header(const Call* call, std::string_view name);

// Reads the whole request body (Content-Length or chunked), at most `cap` bytes: ETOOBIG beyond,
// EINVAL naming a framing fault, EUNAVAILABLE when the client left (send nothing then).
asio::awaitable<Result<std::string>> read_whole_body(Call* call, std::size_t cap);

// A handler whose reply is one small body, adapted to the route table's Handler.
template <asio::awaitable<Reply> (*F)(Context*, Request*)>
asio::awaitable<bool> simple(Call* call) {
  Reply reply = co_await F(call->ctx, &call->ex.req);
  co_return co_await send_reply(call, std::move(reply));
}

}  // namespace agentbox::server::detail
