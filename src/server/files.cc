// The files surface: GET/PUT/DELETE /v1/sessions/{id}/files, stat, dir, mkdir, rename. Downloads
// go out with sendfile(2); uploads stream into an atomic writer (Content-Length or chunked).

#include <fcntl.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <tuple>
#include <variant>

#include "common/log.h"
#include "common/no_sigpipe.h"
#include "sandbox/file_feed.h"
#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/files.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {
namespace {

using namespace boost::asio::experimental::awaitable_operators;

// Uploads move in chunks of this size (two buffers per upload: one filling from the socket while
// the other is written to the file); memory stays flat however big the file. 1 MiB: a quarter
// of the pool hops, timer resets and write(2) calls that 256 KiB took.
constexpr std::size_t kFileChunk = 1u << 20;

using ojson = nlohmann::ordered_json;

Result<std::uint32_t> mode_query(const Request& req) {
  auto it = req.query.find("mode");
  if (it == req.query.end()) return 0u;
  const std::string& v = it->second;
  if (v.empty() || v.size() > 5 || v.find_first_not_of("01234567") != std::string::npos) {
    return fail(Code::kInvalid, "query parameter 'mode' must be octal permission bits like 0644");
  }
  auto mode = static_cast<std::uint32_t>(std::stoul(v, nullptr, 8));
  if (mode > 0777) {
    return fail(Code::kInvalid, "query parameter 'mode' must be within 0777");
  }
  return mode;
}

// One sendfile(2) job of get_file: the bytes it moved, and whether the file ended early.
struct SendfileStep {
  std::size_t sent = 0;
  bool file_ended = false;
  bool blocked = false;  // the socket's send buffer is full
};

// Moves up to `want` bytes of `file_fd` from `offset` to the non-blocking socket `sock_fd`, until
// the socket's send buffer is full (EAGAIN) or `want` is done. Runs in the pool: sendfile reads
// the file through the page cache and, for a file not cached, waits on the disk, which must never
// stall the io thread; the socket being non-blocking means a slow client never holds the pool
// thread either (it returns on EAGAIN and the io thread waits for the socket to drain).
Result<SendfileStep> sendfile_step(int sock_fd, int file_fd, std::uint64_t offset,
                                   std::size_t want) {
  SendfileStep step;
  auto off = static_cast<off_t>(offset);
  while (step.sent < want) {
    ssize_t n =
        call_without_sigpipe([&] { return ::sendfile(sock_fd, file_fd, &off, want - step.sent); });
    if (n > 0) {
      step.sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) {
      step.file_ended = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      step.blocked = true;
      break;
    }
    return fail_errno(errno, "sendfile");
  }
  return step;
}

// GET /v1/sessions/{id}/files?path=P: the file's bytes, sent with sendfile(2) straight from the
// page cache to the socket (no copy through our memory, no buffer: RSS stays flat).
asio::awaitable<bool> get_file(Call* call) {
  Context* ctx = call->ctx;
  Exchange* ex = &call->ex;
  auto id = session_param(ex->req);
  if (!id) co_return co_await send_error(call, id.error());
  auto path = required_query(ex->req, "path");
  if (!path) co_return co_await send_error(call, path.error());
  auto reader = co_await ctx->svc->files.open(origin_of(ex->req, service::Surface::kV1), *id,
                                              *path, /*streamed=*/true);
  if (!reader) co_return co_await send_error(call, reader.error());
  co_return co_await send_file(call, std::move(*reader), *path);
}

}  // namespace

asio::awaitable<bool> send_file(Call* call, sandbox::FileReader file, std::string p) {
  Context* ctx = call->ctx;
  Conn* conn = call->conn;
  Exchange* ex = &call->ex;
  const sandbox::FileReader* reader = &file;
  http::response<http::empty_body> res{http::status::ok, ex->version};
  res.set(http::field::server, "agentboxd");
  res.set(http::field::content_type, "application/octet-stream");
  res.content_length(reader->size);
  const bool keep = ex->keep_alive && !ctx->stopping;
  res.keep_alive(keep);
  if (!co_await write_head(call, res)) co_return false;

  // The body bypasses the tcp_stream, so its timeout does not apply: our own timer bounds how
  // long the client may leave the socket full. While a sendfile job runs in the pool, this
  // coroutine is suspended on it and nothing else on the io thread touches the socket (the
  // connection is not idle, so shutdown leaves it alone): the pool thread has the fd alone.
  conn->stream.expires_never();
  tcp::socket& sock = conn->stream.socket();
  const int sock_fd = sock.native_handle();
  // Asio made the socket non-blocking for its own async operations; sendfile_step relies on it.
  if (int fl = ::fcntl(sock_fd, F_GETFL); fl >= 0 && !(fl & O_NONBLOCK)) {
    ::fcntl(sock_fd, F_SETFL, fl | O_NONBLOCK);
  }
  const int file_fd = reader->fd.get();
  asio::steady_timer timer(sock.get_executor());
  // A file still arriving (a remote runner's download): each job first waits for its bytes, and
  // says what was sent so the producer can drop it; however this ends, the producer stops.
  std::shared_ptr<sandbox::FileFeed> feed = reader->feed;
  struct CloseFeed {
    sandbox::FileFeed* f;
    ~CloseFeed() {
      if (f) f->close();
    }
  } close_feed{feed.get()};
  const auto feed_wait = ctx->opts.io_timeout;
  std::uint64_t offset = 0;
  while (offset < reader->size) {
    // At most this much per pool job, so one fast download does not keep a pool thread from
    // everyone else's blocking work for long.
    constexpr std::uint64_t kSendfileJob = 8u << 20;
    auto want = static_cast<std::size_t>(std::min(reader->size - offset, kSendfileJob));
    auto send_job = run_blocking(ctx->pool, [sock_fd, file_fd, offset, want, feed,
                                             feed_wait]() -> Result<SendfileStep> {
      if (!feed) return sendfile_step(sock_fd, file_fd, offset, want);
      // The job's bytes as they arrive, until they are all sent or the socket is full.
      SendfileStep done;
      while (done.sent < want) {
        const std::uint64_t at = offset + done.sent;
        auto there = AB_TRY(feed->wait_beyond(at, feed_wait));
        auto n = static_cast<std::size_t>(std::min<std::uint64_t>(want - done.sent, there - at));
        auto step = AB_TRY(sendfile_step(sock_fd, file_fd, at, n));
        done.sent += step.sent;
        feed->consume(offset + done.sent);
        if (step.blocked || step.file_ended) {
          done.blocked = step.blocked;
          done.file_ended = step.file_ended;
          break;
        }
      }
      return done;
    });
    auto step = co_await std::move(send_job);
    if (step) {
      offset += step->sent;
      ctx->metrics.add_bytes_out(step->sent);
    }
    if (!step || step->file_ended) {
      // The file failed or shrank under us after the header went out: all we can do is cut the
      // connection, so the client sees a short body rather than wrong bytes. (A client gone
      // shows up here too, as EPIPE or ECONNRESET.)
      spdlog::info("conn={} req={} GET {} ended after {} of {} bytes: {}", conn->id, ex->req.id, p,
                   offset, reader->size,
                   step ? "file shrank while being sent" : step.error().message);
      co_return false;
    }
    if (offset == reader->size || !step->blocked) continue;
    // The socket's send buffer is full: wait until the client has read some of it.
    timer.expires_after(ctx->opts.io_timeout);
    auto writable = sock.async_wait(tcp::socket::wait_write, kTuple);
    auto timeout = timer.async_wait(kTuple);
    auto either = std::move(writable) || std::move(timeout);
    auto which = co_await std::move(either);
    if (which.index() == 1) {
      spdlog::info("conn={} req={} GET {}: client read nothing for {} s; closing", conn->id,
                   ex->req.id, p, ctx->opts.io_timeout.count());
      co_return false;
    }
    if (auto [wec] = std::get<0>(which); wec) co_return false;
  }
  co_return keep;
}

namespace {

// PUT /v1/sessions/{id}/files?path=P[&mkdirs=true][&mode=0644]: the body streams into an atomic
// writer; the target changes only when the whole body has arrived and been committed.
asio::awaitable<bool> put_file(Call* call) {
  Context* ctx = call->ctx;
  Conn* conn = call->conn;
  Exchange* ex = &call->ex;
  auto id = session_param(ex->req);
  if (!id) co_return co_await send_error(call, id.error());
  auto path = required_query(ex->req, "path");
  if (!path) co_return co_await send_error(call, path.error());
  auto mkdirs = bool_query(ex->req, "mkdirs");
  if (!mkdirs) co_return co_await send_error(call, mkdirs.error());
  auto mode = mode_query(ex->req);
  if (!mode) co_return co_await send_error(call, mode.error());
  const std::uint64_t cap = ctx->opts.max_file_bytes;
  Error too_big = Error::make(Code::kTooBig,
                              "file is over the upload limit of " + std::to_string(cap) + " bytes");
  if (ex->content_length && *ex->content_length > cap) {
    co_return co_await send_error(call, too_big);
  }
  sandbox::WriteOptions opts;
  opts.mkdirs = *mkdirs;
  if (ex->req.query.count("mode")) opts.mode = *mode;
  opts.max_bytes = cap;
  const std::string p = *path;
  const service::Origin origin = origin_of(ex->req, service::Surface::kV1);
  auto upload = co_await ctx->svc->files.begin_upload(origin, *id, p, opts);
  if (!upload) co_return co_await send_error(call, upload.error());
  // Destroying an uncommitted writer removes its temp file: every early return below (client
  // gone, too big, write error) leaves the target as it was.
  std::unique_ptr<sandbox::FileWriter>& writer = upload->writer;

  if (!co_await maybe_continue(call)) co_return false;
  BodyReader body;
  start_body(call, &body, cap);
  // Two chunk buffers: while the pool writes one to the file, the next arrives from the socket.
  std::array<std::vector<char>, 2> bufs{std::vector<char>(kFileChunk),
                                        std::vector<char>(kFileChunk)};
  int cur = 0;             // the buffer the next read fills
  std::size_t queued = 0;  // bytes in bufs[1 - cur] read but not yet written
  sandbox::FileWriter* writer_ptr = writer.get();
  auto write_queued = [ctx, writer_ptr](const char* data, std::size_t n) {
    return run_blocking(
        ctx->pool, [writer_ptr, data, n] { return writer_ptr->write(std::string_view(data, n)); });
  };
  for (;;) {
    const bool more = ex->body_pending && !body.done();
    if (!more && queued == 0) break;
    if (!more) {
      auto last_job = write_queued(bufs[1 - cur].data(), queued);
      auto wrote = co_await std::move(last_job);
      if (!wrote) co_return co_await send_error(call, wrote.error());
      queued = 0;
      continue;
    }
    auto read_op = read_body_chunk(&body, bufs[cur].data(), kFileChunk);
    BodyChunk chunk;
    Status wrote;
    if (queued > 0) {
      auto write_job = write_queued(bufs[1 - cur].data(), queued);
      auto both = std::move(read_op) && std::move(write_job);
      std::tie(chunk, wrote) = co_await std::move(both);
      queued = 0;
    } else {
      chunk = co_await std::move(read_op);
    }
    ctx->metrics.add_bytes_in(chunk.wire_bytes);
    if (!wrote) co_return co_await send_error(call, wrote.error());
    if (chunk.ec && is_disconnect(chunk.ec)) {
      spdlog::info("conn={} req={} upload of {} aborted ({}); target untouched", conn->id,
                   ex->req.id, p, chunk.ec.message());
      co_return false;
    }
    // Too big, or a malformed chunk: the target stays as it was; the client is told why.
    if (chunk.ec) co_return co_await send_error(call, body_error(chunk.ec, too_big));
    if (chunk.got > 0) {
      queued = chunk.got;
      cur = 1 - cur;
    }
  }
  ex->body_pending = false;
  auto size = co_await ctx->svc->files.commit(origin, &*upload);
  if (!size) co_return co_await send_error(call, size.error());
  json done = {{"path", p}, {"size", *size}};
  co_return co_await send_reply(call, json_reply(200, done));
}

// The `path` query parameter, and the session's sandbox.
struct Target {
  std::string id;
  std::string path;
};

Result<Target> target_of(const Request& req) {
  auto id = session_param(req);
  if (!id) return std::unexpected(id.error());
  auto path = required_query(req, "path");
  if (!path) return std::unexpected(path.error());
  return Target{std::move(*id), std::move(*path)};
}

asio::awaitable<Reply> stat_route(Context* ctx, Request* req) {
  // Decode everything before touching the session, so bad input is 400 whatever the session.
  auto t = target_of(*req);
  if (!t) co_return error_reply(t.error());
  auto r = co_await ctx->svc->files.stat(origin_of(*req, service::Surface::kV1), t->id, t->path);
  if (!r) co_return error_reply(r.error());
  co_return json_reply(200, encode_file_info(*r));
}

asio::awaitable<Reply> dir_route(Context* ctx, Request* req) {
  auto t = target_of(*req);
  if (!t) co_return error_reply(t.error());
  auto r = co_await ctx->svc->files.list(origin_of(*req, service::Surface::kV1), t->id, t->path);
  if (!r) co_return error_reply(r.error());
  co_return json_reply(200, encode_dir(*r));
}

asio::awaitable<Reply> delete_route(Context* ctx, Request* req) {
  auto t = target_of(*req);
  if (!t) co_return error_reply(t.error());
  auto rec = bool_query(*req, "recursive");
  if (!rec) co_return error_reply(rec.error());
  auto r = co_await ctx->svc->files.remove(origin_of(*req, service::Surface::kV1), t->id,
                                           t->path, *rec);
  if (!r) co_return error_reply(r.error());
  co_return json_reply(200, {{"path", t->path}});
}

asio::awaitable<Reply> mkdir_route(Context* ctx, Request* req) {
  auto id = session_param(*req);
  if (!id) co_return error_reply(id.error());
  auto body = body_object(req);
  if (!body) co_return error_reply(body.error());
  auto p = decode_mkdir(*body);
  if (!p) co_return error_reply(p.error());
  auto r = co_await ctx->svc->files.mkdir(origin_of(*req, service::Surface::kV1), *id, *p);
  if (!r) co_return error_reply(r.error());
  co_return json_reply(200, {{"path", *p}});
}

asio::awaitable<Reply> rename_route(Context* ctx, Request* req) {
  auto id = session_param(*req);
  if (!id) co_return error_reply(id.error());
  auto body = body_object(req);
  if (!body) co_return error_reply(body.error());
  auto d = decode_rename(*body);
  if (!d) co_return error_reply(d.error());
  auto r = co_await ctx->svc->files.rename(origin_of(*req, service::Surface::kV1), *id, d->from,
                                           d->to);
  if (!r) co_return error_reply(r.error());
  co_return json_reply(200, {{"from", d->from}, {"to", d->to}});
}

}  // namespace

std::vector<RouteSpec> file_routes() {
  using B = BodyKind;
  using R = RouteId;
  return {
      {R::kFileGet, "GET", "/v1/sessions/{id}/files", B::kNone, true, get_file},
      {R::kFilePut, "PUT", "/v1/sessions/{id}/files", B::kRaw, true, put_file},
      {R::kFileDelete, "DELETE", "/v1/sessions/{id}/files", B::kNone, true, simple<delete_route>},
      {R::kStat, "GET", "/v1/sessions/{id}/stat", B::kNone, true, simple<stat_route>},
      {R::kDir, "GET", "/v1/sessions/{id}/dir", B::kNone, true, simple<dir_route>},
      {R::kMkdir, "POST", "/v1/sessions/{id}/mkdir", B::kJson, true, simple<mkdir_route>},
      {R::kRename, "POST", "/v1/sessions/{id}/rename", B::kJson, true, simple<rename_route>},
  };
}

}  // namespace agentbox::server::detail
