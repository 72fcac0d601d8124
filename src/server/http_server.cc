// The connection side of agentboxd: accept loop, one coroutine per connection (HTTP/1.1
// keep-alive), bounded header and body reads, auth, routing, and the routes that stream (exec,
// exec stream, file get/put). Routes with one small reply are in handlers.cc.
//
// Threading: everything here runs on the io_context's single thread; blocking calls go to the
// pool through run_blocking() and resume here. A Conn lives in its coroutine's frame; the
// server's list of connections holds raw pointers that the frame removes when it ends.
//
// Failure policy: expected errors (a client gone, a timeout, a parse error) are values
// (as_tuple); anything thrown ends only its own connection (logged by the co_spawn completion
// handler) and never reaches the io_context.

#include "server/http_server.h"

#include <fcntl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <list>
#include <tuple>
#include <variant>

#include "common/log.h"
#include "common/no_sigpipe.h"
#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/context.h"

namespace agentbox::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using detail::Context;
using detail::error_reply;
using detail::json_reply;
using detail::Reply;
using detail::Request;
using detail::run_blocking;
using namespace boost::asio::experimental::awaitable_operators;

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
// Uploads move in chunks of this size (two buffers per upload: one filling from the socket while
// the other is written to the file); memory stays flat however big the file. 1 MiB: a quarter
// of the pool hops, timer resets and write(2) calls that 256 KiB took.
constexpr std::size_t kFileChunk = 1u << 20;
// Seed 001's /exec-stream sends output as lines; a longer line goes out in pieces of this size.
constexpr std::size_t kMaxLine = 64u << 10;
// After an error reply to a request whose body was not read, how long we keep reading (and
// dropping) what the client still sends, so it sees our reply rather than a reset.
constexpr auto kLingerTime = std::chrono::seconds(3);

struct Conn {
  explicit Conn(tcp::socket s) : stream(std::move(s)) {}
  beast::tcp_stream stream;
  std::uint64_t id = 0;
  bool idle = true;  // waiting for the next request: shutdown may close it
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

bool is_disconnect(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == http::error::partial_message ||
         ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::operation_aborted || ec == asio::error::broken_pipe ||
         ec == beast::error::timeout || ec == asio::error::bad_descriptor;
}

// SECURITY: constant-time in the token's content (a timing side channel must not reveal how
// much of a guess was right).
bool token_matches(std::string_view given, std::string_view want) {
  unsigned char diff = given.size() == want.size() ? 0 : 1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned char>(g ^ static_cast<unsigned char>(want[i]));
  }
  return diff == 0;
}

// The tenant whose token the Authorization header carries, or null. Without configured
// tenants auth is off and every caller is the non-admin tenant "default".
// SECURITY: every token of every tenant is compared, in constant time each, with no early
// exit, so the timing says nothing about which tenant (or how much of a token) matched.
// Tokens are never logged.
std::optional<session::Caller> authenticate(const std::vector<TenantConfig>& tenants,
                                            std::string_view header) {
  if (tenants.empty()) return session::Caller{kDefaultTenant, false, 0};
  constexpr std::string_view kScheme = "bearer ";
  if (header.size() <= kScheme.size() ||
      !beast::iequals(header.substr(0, kScheme.size()), kScheme)) {
    return std::nullopt;
  }
  std::string_view given = header.substr(kScheme.size());
  while (!given.empty() && given.front() == ' ') given.remove_prefix(1);
  while (!given.empty() && (given.back() == ' ' || given.back() == '\t')) given.remove_suffix(1);
  const TenantConfig* found = nullptr;
  for (const auto& t : tenants) {
    for (const auto& tok : t.tokens) {
      bool hit = token_matches(given, tok);  // always evaluated: no short-circuit
      if (hit) found = &t;                   // tokens are unique across tenants (validate_config)
    }
  }
  if (!found) return std::nullopt;
  return session::Caller{found->name, found->admin, found->max_sessions};
}

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

}  // namespace

struct HttpServer::Impl {
  Impl(asio::io_context& ioc, asio::thread_pool& pool, session::SessionManager& sessions,
       std::shared_ptr<sandbox::Backend> backend, ServerOptions opts)
      : acceptor(ioc) {
    ctx.ioc = &ioc;
    ctx.pool = &pool;
    ctx.sessions = &sessions;
    ctx.default_backend = std::move(backend);
    ctx.opts = std::move(opts);
  }

  Context ctx;
  tcp::acceptor acceptor;
  std::list<Conn*> conns;
  bool stopping = false;
  std::uint64_t next_conn = 1;
  std::uint64_t next_request = 1;
};

namespace {

using Impl = HttpServer::Impl;

void log_request(const Conn* conn, const Exchange* ex, int status) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  ex->start)
                .count();
  auto level = status >= 500 ? spdlog::level::err : spdlog::level::debug;
  spdlog::log(level, "conn={} req={} {} {} -> {} ({} ms)", conn->id, ex->req.id, ex->req.method,
              ex->req.path, status, ms);
}

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

// Writes a whole reply. Returns whether the connection may serve another request.
asio::awaitable<bool> send_reply(Impl* impl, Conn* conn, Exchange* ex, Reply reply) {
  http::response<http::string_body> res{static_cast<http::status>(reply.status), ex->version};
  res.set(http::field::server, "agentboxd");
  res.set(http::field::content_type, reply.content_type);
  for (auto& [k, v] : reply.headers) res.set(k, v);
  res.body() = std::move(reply.body);
  bool keep = ex->keep_alive && !ex->body_pending && !impl->stopping;
  res.keep_alive(keep);
  res.prepare_payload();
  log_request(conn, ex, reply.status);
  conn->stream.expires_after(impl->ctx.opts.io_timeout);
  auto [ec, n] = co_await http::async_write(conn->stream, res, kTuple);
  impl->ctx.metrics.add_bytes_out(n);
  if (ec) co_return false;
  if (!keep && ex->body_pending) co_await lingering_close(conn);
  co_return keep;
}

asio::awaitable<bool> send_error(Impl* impl, Conn* conn, Exchange* ex, Error e) {
  co_return co_await send_reply(impl, conn, ex, error_reply(e));
}

// "100 Continue" for clients that wait for it before sending a body (curl does, over 1 MiB).
asio::awaitable<bool> maybe_continue(Conn* conn, Exchange* ex) {
  if (!ex->expect_continue) co_return true;
  ex->expect_continue = false;
  http::response<http::empty_body> res{http::status::continue_, ex->version};
  auto [ec, n] = co_await http::async_write(conn->stream, res, kTuple);
  co_return !ec;
}

// Reads a small body (JSON routes) into ex->req.body. Returns false when the connection is
// gone or the reply has been sent (too big).
asio::awaitable<bool> read_small_body(Impl* impl, Conn* conn, beast::flat_buffer* buffer,
                                      std::unique_ptr<HeaderParser> hp, Exchange* ex,
                                      std::size_t limit, bool* reply_sent) {
  *reply_sent = false;
  if (!ex->body_pending) co_return true;
  Error too_big = Error::make(
      Code::kTooBig, "request body is over the limit of " + std::to_string(limit) + " bytes");
  if (ex->content_length && *ex->content_length > limit) {
    *reply_sent = true;
    co_await send_error(impl, conn, ex, too_big);
    co_return false;
  }
  if (!co_await maybe_continue(conn, ex)) co_return false;
  http::request_parser<http::string_body> parser{std::move(*hp)};
  parser.body_limit(limit);  // chunked bodies
  conn->stream.expires_after(impl->ctx.opts.io_timeout);
  auto [ec, n] = co_await http::async_read(conn->stream, *buffer, parser, kTuple);
  impl->ctx.metrics.add_bytes_in(n);
  if (ec == http::error::body_limit) {
    *reply_sent = true;
    co_await send_error(impl, conn, ex, too_big);
    co_return false;
  }
  if (ec) co_return false;
  ex->body_pending = false;
  ex->req.body = std::move(parser.get().body());
  co_return true;
}

// Completes when the client has closed its end (EOF or an error on the socket), and sets *gone.
// Runs beside a command as `exec || watch_disconnect`: its completion cancels the exec, which
// kills the command's whole tree at once (Sandbox::exec), also one that prints nothing; the
// output sink returning false covers output already on its way. A client that pipelines its next
// request makes the socket readable without EOF; then we cannot tell and wait until cancelled.
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

// The one-shot exec's sink: collects the output (the runner applies the cap) and stops the
// command once the client is gone.
class CollectingSink final : public sandbox::OutputSink {
 public:
  explicit CollectingSink(const bool* gone) : gone_(gone) {}
  asio::awaitable<bool> on_output(sandbox::StreamKind kind, std::string data) override {
    if (*gone_) co_return false;
    (kind == sandbox::StreamKind::kStdout ? stdout_ : stderr_) += data;
    co_return true;
  }
  std::string stdout_;
  std::string stderr_;

 private:
  const bool* gone_;
};

asio::awaitable<Result<sandbox::ExecResult>> run_exec(std::shared_ptr<sandbox::Sandbox> box,
                                                      sandbox::ExecSpec spec,
                                                      sandbox::OutputSink* sink) {
  co_return co_await box->exec(std::move(spec), sink);
}

struct PreparedExec {
  sandbox::ExecSpec spec;
  std::shared_ptr<sandbox::Sandbox> box;
  std::string session_id;
};

// Decodes an exec body (v1 or seed 001) and gets the session's sandbox, creating the session
// if needed (exec routes create).
asio::awaitable<Result<PreparedExec>> prepare_exec(Context* ctx, Request req, bool seed) {
  auto body = parse_object(req.body);
  if (!body) co_return std::unexpected(body.error());
  PreparedExec p;
  if (seed) {
    auto d = decode_seed_exec(*body);
    if (!d) co_return std::unexpected(d.error());
    p.spec = std::move(d->spec);
    p.session_id = d->session_id;
    const auto& l = d->limits;
    if (l.memory_mb || l.cpu_percent || l.max_pids || l.disk_mb || l.max_open_files) {
      // Seed 001's "cgroup" applies when the agent's session is made. A later exec's cgroup
      // must match the box's limits: a live box's limits are not changed, so a different one
      // is 501 ENOTSUP naming it (never run as if applied).
      session::SessionSpec spec;
      spec.limits = l;
      session::SessionManager* sm = ctx->sessions;
      std::string id = p.session_id;
      session::Caller caller = req.caller;
      auto job = run_blocking(ctx->pool, [sm, id, spec, caller]() -> Status {
        if (auto have = sm->get(id, caller)) {
          return check_limits_unchanged(spec.limits, have->spec.limits, "cgroup");
        }
        auto r = sm->create_or_get(id, spec, caller);
        if (!r) return std::unexpected(r.error());
        return {};
      });
      auto made = co_await std::move(job);
      if (!made) co_return std::unexpected(made.error());
    }
  } else {
    auto id = detail::session_param(req);
    if (!id) co_return std::unexpected(id.error());
    auto d = decode_exec(*body);
    if (!d) co_return std::unexpected(d.error());
    p.spec = std::move(*d);
    p.session_id = std::move(*id);
  }
  auto box =
      co_await detail::acquire_sandbox(ctx, p.session_id, /*create_if_missing=*/true, req.caller);
  if (!box) co_return std::unexpected(box.error());
  p.box = std::move(*box);
  if (auto st = check_artifact_dir(p.spec.artifact_dir, p.box->workspace()); !st) {
    co_return std::unexpected(st.error());
  }
  co_return p;
}

// One audit line per exec that ran: what was run (argv or command), how it ended. Never its
// output or stdin.
void audit_exec(Context* ctx, const Request& req, const std::string& session_id,
                const sandbox::ExecSpec& spec, const Result<sandbox::ExecResult>& r,
                bool client_gone) {
  nlohmann::ordered_json f = nlohmann::ordered_json::object();
  if (!spec.argv.empty()) {
    f["argv"] = spec.argv;
  } else {
    f["command"] = spec.command;
  }
  if (r) {
    f["exit_code"] = r->exit_code;
    f["duration_ms"] = r->duration.count();
    f["timed_out"] = r->timed_out;
  } else {
    f["exit_code"] = nullptr;
    f["duration_ms"] = 0;
    f["error"] = code_name(r.error().code);
  }
  if (client_gone) f["client_gone"] = true;
  detail::audit(ctx, "exec", req.caller, session_id, f);
}

void record_exec(Context* ctx, const Result<sandbox::ExecResult>& r) {
  if (!r) {
    ctx->metrics.record_exec(std::chrono::milliseconds(0), true, false);
    return;
  }
  ctx->metrics.record_exec(r->duration, r->exit_code != 0, r->timed_out);
}

// POST /v1/sessions/{id}/exec and POST /exec.
asio::awaitable<bool> exec_once(Impl* impl, Conn* conn, Exchange* ex, bool seed) {
  Context* ctx = &impl->ctx;
  auto prepared = co_await prepare_exec(ctx, ex->req, seed);
  if (!prepared) co_return co_await send_error(impl, conn, ex, prepared.error());

  // The command may run for a long time; the exec has its own timeout.
  conn->stream.expires_never();
  bool gone = false;
  CollectingSink sink(&gone);
  sandbox::ExecSpec audited = prepared->spec;  // what ran, for the audit line
  audited.stdin_data.clear();
  audited.env.clear();
  auto op = run_exec(prepared->box, std::move(prepared->spec), &sink) ||
            watch_disconnect(&conn->stream.socket(), &gone);
  auto outcome = co_await std::move(op);
  if (outcome.index() == 1 || gone) {
    spdlog::info("conn={} req={} client went away; command in session {} killed", conn->id,
                 ex->req.id, prepared->session_id);
    if (outcome.index() == 0) {
      record_exec(ctx, std::get<0>(outcome));
      audit_exec(ctx, ex->req, prepared->session_id, audited, std::get<0>(outcome), true);
    }
    co_return false;
  }
  auto r = std::get<0>(std::move(outcome));
  record_exec(ctx, r);
  audit_exec(ctx, ex->req, prepared->session_id, audited, r, false);
  if (!r) {
    spdlog::warn("conn={} req={} exec in session {}: {}", conn->id, ex->req.id,
                 prepared->session_id, r.error().message);
    co_return co_await send_error(impl, conn, ex, r.error());
  }
  r->stdout_data = std::move(sink.stdout_);
  r->stderr_data = std::move(sink.stderr_);
  json j = seed ? encode_seed_exec_result(*r) : encode_exec_result(*r);
  co_return co_await send_reply(impl, conn, ex, json_reply(200, j));
}

// Writes NDJSON lines of a streaming exec as chunks, in order, as the command produces output.
// v1 lines: {"type":"stdout","data":...}; seed 001 lines: {"stream":"stdout","line":...}.
class NdjsonSink final : public sandbox::OutputSink {
 public:
  NdjsonSink(Impl* impl, Conn* conn, bool seed, bool chunked, const bool* gone)
      : impl_(impl), conn_(conn), seed_(seed), chunked_(chunked), gone_(gone) {}

  asio::awaitable<bool> on_output(sandbox::StreamKind kind, std::string data) override {
    if (*gone_) co_return false;
    std::size_t k = kind == sandbox::StreamKind::kStdout ? 0 : 1;
    std::string& pending = pending_[k];
    pending += data;
    if (seed_) {
      // Whole lines; an over-long line goes out in pieces.
      std::size_t start = 0;
      for (;;) {
        std::size_t nl = pending.find('\n', start);
        if (nl == std::string::npos) break;
        if (!co_await emit(k, pending.substr(start, nl - start))) co_return false;
        start = nl + 1;
      }
      pending.erase(0, start);
      while (pending.size() >= kMaxLine) {
        std::size_t cut =
            kMaxLine - utf8_incomplete_tail(std::string_view(pending).substr(0, kMaxLine));
        if (!co_await emit(k, pending.substr(0, cut))) co_return false;
        pending.erase(0, cut);
      }
      co_return true;
    }
    // Hold back a UTF-8 sequence cut by the pipe read, so it is not replaced twice.
    std::size_t keep = utf8_incomplete_tail(pending);
    if (pending.size() == keep) co_return !failed_;
    std::string out = pending.substr(0, pending.size() - keep);
    pending.erase(0, pending.size() - keep);
    co_return co_await emit(k, std::move(out));
  }

  // Sends what is still held back (a last line without "\n").
  asio::awaitable<bool> flush() {
    for (std::size_t k = 0; k < 2; ++k) {
      if (pending_[k].empty()) continue;
      std::string rest = std::move(pending_[k]);
      pending_[k].clear();
      if (!co_await emit(k, std::move(rest))) co_return false;
    }
    co_return true;
  }

  // One NDJSON line (a "\n" is added), as one chunk.
  asio::awaitable<bool> write_line(std::string line) {
    if (failed_) co_return false;
    line += '\n';
    conn_->stream.expires_after(impl_->ctx.opts.io_timeout);
    std::size_t n = 0;
    beast::error_code ec;
    if (chunked_) {
      std::tie(ec, n) =
          co_await asio::async_write(conn_->stream, http::make_chunk(asio::buffer(line)), kTuple);
    } else {
      std::tie(ec, n) = co_await asio::async_write(conn_->stream, asio::buffer(line), kTuple);
    }
    impl_->ctx.metrics.add_bytes_out(n);
    if (ec) failed_ = true;
    co_return !failed_;
  }

  bool failed() const { return failed_; }

 private:
  asio::awaitable<bool> emit(std::size_t k, std::string data) {
    // (Built outside the co_await: g++ 12 mishandles initializer lists inside one.)
    json event = json::object();
    const char* name = k == 0 ? "stdout" : "stderr";
    if (seed_) {
      if (!data.empty() && data.back() == '\r') data.pop_back();
      event["stream"] = name;
      event["line"] = std::move(data);
    } else {
      event["type"] = name;
      event["data"] = std::move(data);
    }
    std::string line = to_wire(event);
    co_return co_await write_line(std::move(line));
  }

  Impl* impl_;
  Conn* conn_;
  bool seed_;
  bool chunked_;
  const bool* gone_;
  bool failed_ = false;
  std::string pending_[2];
};

// POST /v1/sessions/{id}/exec/stream and POST /exec-stream.
asio::awaitable<bool> exec_stream(Impl* impl, Conn* conn, Exchange* ex, bool seed) {
  Context* ctx = &impl->ctx;
  auto prepared = co_await prepare_exec(ctx, ex->req, seed);
  if (!prepared) co_return co_await send_error(impl, conn, ex, prepared.error());

  // HTTP/1.0 has no chunked encoding: stream raw and close.
  const bool chunked = ex->version >= 11;
  const bool keep = ex->keep_alive && chunked && !impl->stopping;
  http::response<http::empty_body> res{http::status::ok, ex->version};
  res.set(http::field::server, "agentboxd");
  res.set(http::field::content_type, "application/x-ndjson");
  res.set(http::field::cache_control, "no-store");
  res.keep_alive(keep);
  if (chunked) res.chunked(true);
  http::response_serializer<http::empty_body> sr{res};
  conn->stream.expires_after(ctx->opts.io_timeout);
  auto [hec, hn] = co_await http::async_write_header(conn->stream, sr, kTuple);
  ctx->metrics.add_bytes_out(hn);
  if (hec) co_return false;
  log_request(conn, ex, 200);

  bool gone = false;
  NdjsonSink sink(impl, conn, seed, chunked, &gone);
  conn->stream.expires_never();
  sandbox::ExecSpec audited = prepared->spec;  // what ran, for the audit line
  audited.stdin_data.clear();
  audited.env.clear();
  auto op = run_exec(prepared->box, std::move(prepared->spec), &sink) ||
            watch_disconnect(&conn->stream.socket(), &gone);
  auto outcome = co_await std::move(op);
  if (outcome.index() == 1 || gone || sink.failed()) {
    spdlog::info("conn={} req={} client went away; command in session {} killed", conn->id,
                 ex->req.id, prepared->session_id);
    if (outcome.index() == 0) {
      record_exec(ctx, std::get<0>(outcome));
      audit_exec(ctx, ex->req, prepared->session_id, audited, std::get<0>(outcome), true);
    }
    co_return false;
  }
  auto r = std::get<0>(std::move(outcome));
  record_exec(ctx, r);
  audit_exec(ctx, ex->req, prepared->session_id, audited, r, false);
  if (!co_await sink.flush()) co_return false;
  json last;
  if (!r) {
    spdlog::warn("conn={} req={} exec in session {}: {}", conn->id, ex->req.id,
                 prepared->session_id, r.error().message);
    if (seed) {
      last = {{"exit_code", -1}, {"duration_ms", 0}, {"error", r.error().message}};
    } else {
      last = {{"type", "error"},
              {"error", {{"code", code_name(r.error().code)}, {"message", r.error().message}}}};
    }
  } else if (seed) {
    last = {{"exit_code", r->exit_code}, {"duration_ms", r->duration.count()}};
  } else {
    last = {{"type", "exit"},
            {"exit_code", r->exit_code},
            {"signal", r->signal ? json(*r->signal) : json(nullptr)},
            {"timed_out", r->timed_out},
            {"duration_ms", r->duration.count()},
            {"stdout_truncated", r->stdout_truncated},
            {"stderr_truncated", r->stderr_truncated},
            {"artifacts", encode_artifacts(r->artifacts)}};
  }
  if (!co_await sink.write_line(to_wire(last))) co_return false;
  if (chunked) {
    conn->stream.expires_after(ctx->opts.io_timeout);
    auto [ec, n] = co_await asio::async_write(conn->stream, http::make_chunk_last(), kTuple);
    ctx->metrics.add_bytes_out(n);
    if (ec) co_return false;
  }
  co_return keep;
}

// One sendfile(2) job of get_file: the bytes it moved, and whether the file ended early.
struct SendfileStep {
  std::size_t sent = 0;
  bool file_ended = false;
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
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return fail_errno(errno, "sendfile");
  }
  return step;
}

// GET /v1/sessions/{id}/files?path=P: the file's bytes, sent with sendfile(2) straight from the
// page cache to the socket (no copy through our memory, no buffer: RSS stays flat).
asio::awaitable<bool> get_file(Impl* impl, Conn* conn, Exchange* ex) {
  Context* ctx = &impl->ctx;
  auto id = detail::session_param(ex->req);
  if (!id) co_return co_await send_error(impl, conn, ex, id.error());
  auto path = detail::required_query(ex->req, "path");
  if (!path) co_return co_await send_error(impl, conn, ex, path.error());
  auto box = co_await detail::acquire_sandbox(ctx, *id, false, ex->req.caller);
  if (!box) co_return co_await send_error(impl, conn, ex, box.error());
  std::shared_ptr<sandbox::Sandbox> sb = std::move(*box);
  std::string p = *path;
  auto open_job = run_blocking(ctx->pool, [sb, p] { return sb->open_file(p); });
  auto reader = co_await std::move(open_job);
  if (!reader) co_return co_await send_error(impl, conn, ex, reader.error());

  http::response<http::empty_body> res{http::status::ok, ex->version};
  res.set(http::field::server, "agentboxd");
  res.set(http::field::content_type, "application/octet-stream");
  res.content_length(reader->size);
  const bool keep = ex->keep_alive && !impl->stopping;
  res.keep_alive(keep);
  http::response_serializer<http::empty_body> sr{res};
  conn->stream.expires_after(ctx->opts.io_timeout);
  auto [hec, hn] = co_await http::async_write_header(conn->stream, sr, kTuple);
  ctx->metrics.add_bytes_out(hn);
  if (hec) co_return false;
  log_request(conn, ex, 200);

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
  std::uint64_t offset = 0;
  while (offset < reader->size) {
    // At most this much per pool job, so one fast download does not keep a pool thread from
    // everyone else's blocking work for long.
    constexpr std::uint64_t kSendfileJob = 8u << 20;
    auto want = static_cast<std::size_t>(std::min(reader->size - offset, kSendfileJob));
    auto send_job = run_blocking(ctx->pool, [sock_fd, file_fd, offset, want] {
      return sendfile_step(sock_fd, file_fd, offset, want);
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
    if (offset == reader->size || step->sent == want) continue;
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

// Where put_file's body comes from. With a Content-Length (every client of ours), the bytes go
// straight from the socket into the chunk buffers: what Beast read past the header is taken out
// of `buffer` first, then the rest is read with plain socket reads of up to a chunk each,
// never past the body (a pipelined next request stays unread). Chunked bodies go through
// Beast's parser, which reads at most 64 KiB a call and copies once more.
struct BodyReader {
  Conn* conn = nullptr;
  beast::flat_buffer* buffer = nullptr;
  std::chrono::seconds timeout{};
  std::optional<http::request_parser<http::buffer_body>> parser;  // chunked bodies only
  std::uint64_t raw_left = 0;  // Content-Length bodies: bytes not yet read

  bool done() const { return parser ? parser->is_done() : raw_left == 0; }
};

struct BodyChunk {
  beast::error_code ec;
  std::size_t wire_bytes = 0;  // read from the socket or the buffer, framing included
  std::size_t got = 0;         // body bytes now in the chunk buffer
};

// Fills `dst` (up to `cap` bytes) with the next part of the body: a whole chunk unless the body
// ends first.
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

// PUT /v1/sessions/{id}/files?path=P[&mkdirs=true][&mode=0644]: the body streams into an atomic
// writer; the target changes only when the whole body has arrived and been committed.
asio::awaitable<bool> put_file(Impl* impl, Conn* conn, beast::flat_buffer* buffer,
                               std::unique_ptr<HeaderParser> hp, Exchange* ex) {
  Context* ctx = &impl->ctx;
  auto id = detail::session_param(ex->req);
  if (!id) co_return co_await send_error(impl, conn, ex, id.error());
  auto path = detail::required_query(ex->req, "path");
  if (!path) co_return co_await send_error(impl, conn, ex, path.error());
  auto mkdirs = detail::bool_query(ex->req, "mkdirs");
  if (!mkdirs) co_return co_await send_error(impl, conn, ex, mkdirs.error());
  auto mode = mode_query(ex->req);
  if (!mode) co_return co_await send_error(impl, conn, ex, mode.error());
  const std::uint64_t cap = ctx->opts.max_file_bytes;
  Error too_big = Error::make(Code::kTooBig,
                              "file is over the upload limit of " + std::to_string(cap) + " bytes");
  if (ex->content_length && *ex->content_length > cap) {
    co_return co_await send_error(impl, conn, ex, too_big);
  }
  auto box = co_await detail::acquire_sandbox(ctx, *id, false, ex->req.caller);
  if (!box) co_return co_await send_error(impl, conn, ex, box.error());
  std::shared_ptr<sandbox::Sandbox> sb = std::move(*box);

  sandbox::WriteOptions opts;
  opts.mkdirs = *mkdirs;
  if (ex->req.query.count("mode")) opts.mode = *mode;
  opts.max_bytes = cap;
  std::string p = *path;
  auto create_job = run_blocking(ctx->pool, [sb, p, opts] { return sb->create_file(p, opts); });
  auto created = co_await std::move(create_job);
  if (!created) co_return co_await send_error(impl, conn, ex, created.error());
  // Destroying an uncommitted writer removes its temp file: every early return below (client
  // gone, too big, write error) leaves the target as it was.
  std::unique_ptr<sandbox::FileWriter> writer = std::move(*created);

  if (!co_await maybe_continue(conn, ex)) co_return false;
  BodyReader body;
  body.conn = conn;
  body.buffer = buffer;
  body.timeout = ctx->opts.io_timeout;
  if (ex->content_length) {
    body.raw_left = ex->body_pending ? *ex->content_length : 0;
  } else {
    // Chunked: Beast's parser decodes the framing and caps the total (Content-Length was
    // checked above).
    body.parser.emplace(std::move(*hp));
    body.parser->body_limit(cap);
    // Beast reads into the free capacity of `buffer` (at least 512 bytes, at most 64 KiB a
    // call): without room made here, a body streams in 512-byte reads.
    buffer->reserve(64u << 10);
  }
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
      if (!wrote) co_return co_await send_error(impl, conn, ex, wrote.error());
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
    if (!wrote) co_return co_await send_error(impl, conn, ex, wrote.error());
    if (chunk.ec == http::error::body_limit) {
      co_return co_await send_error(impl, conn, ex, too_big);
    }
    if (chunk.ec) {
      spdlog::info("conn={} req={} upload of {} aborted ({}); target untouched", conn->id,
                   ex->req.id, p, chunk.ec.message());
      co_return false;
    }
    if (chunk.got > 0) {
      queued = chunk.got;
      cur = 1 - cur;
    }
  }
  ex->body_pending = false;
  sandbox::FileWriter* w = writer.get();
  auto commit_job = run_blocking(ctx->pool, [w] { return w->commit(); });
  auto size = co_await std::move(commit_job);
  if (!size) co_return co_await send_error(impl, conn, ex, size.error());
  nlohmann::ordered_json fields = {{"path", p}, {"size", *size}};
  detail::audit(ctx, "file.put", ex->req.caller, *id, fields);
  json done = {{"path", p}, {"size", *size}};
  co_return co_await send_reply(impl, conn, ex, json_reply(200, done));
}

// Reads one request and answers it. Returns whether the connection stays open.
asio::awaitable<bool> serve_one(Impl* impl, Conn* conn, beast::flat_buffer* buffer) {
  Context* ctx = &impl->ctx;
  auto hp = std::make_unique<HeaderParser>();
  hp->header_limit(static_cast<std::uint32_t>(ctx->opts.max_header_bytes));
  hp->body_limit(
      boost::none);  // enforced per route: Content-Length here, chunked by the body parser

  conn->idle = true;
  conn->stream.expires_after(ctx->opts.io_timeout);
  auto [ec, n] = co_await http::async_read_header(conn->stream, *buffer, *hp, kTuple);
  conn->idle = false;
  ctx->metrics.add_bytes_in(n);

  Exchange ex;
  ex.req.id = impl->next_request++;
  if (ec) {
    if (is_disconnect(ec)) co_return false;
    ex.keep_alive = false;
    ex.body_pending = true;  // unknown state: drain and close
    ex.req.method = "?";
    if (ec == http::error::header_limit) {
      co_await send_error(
          impl, conn, &ex,
          Error::make(Code::kTooBig, "request header is over the limit of " +
                                         std::to_string(ctx->opts.max_header_bytes) + " bytes"));
    } else {
      co_await send_error(impl, conn, &ex,
                          Error::make(Code::kInvalid, "malformed HTTP request: " + ec.message()));
    }
    co_return false;
  }

  const auto& h = hp->get();
  ex.version = h.version();
  ex.keep_alive = h.keep_alive();
  ex.body_pending = !hp->is_done();
  ex.expect_continue = beast::iequals(h[http::field::expect], "100-continue");
  if (auto cl = hp->content_length()) ex.content_length = *cl;
  ex.req.method = std::string(h.method_string());
  std::string_view target = h.target();
  auto qpos = target.find('?');
  ex.req.path = std::string(target.substr(0, qpos));
  ex.start = std::chrono::steady_clock::now();

  RouteMatch m = match_route(ex.req.method, ex.req.path);
  // SECURITY: authenticate before anything else, so unauthenticated clients learn nothing
  // (not even which routes exist) and send no body we would read.
  std::optional<session::Caller> caller =
      authenticate(ctx->opts.tenants, h[http::field::authorization]);
  if (caller) ex.req.caller = std::move(*caller);
  if ((!m.route || m.route->needs_auth) && !caller) {
    Reply r = error_reply(Error::make(Code::kUnauthorized, "missing or invalid bearer token"));
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    co_return co_await send_reply(impl, conn, &ex, std::move(r));
  }
  if (!m.route) {
    if (m.allowed.empty()) {
      co_return co_await send_error(
          impl, conn, &ex,
          Error::make(Code::kNotFound, "no such route: " + ex.req.method + " " + ex.req.path));
    }
    std::string allow;
    for (const auto& a : m.allowed) allow += (allow.empty() ? "" : ", ") + a;
    Reply r =
        error_reply(Error::make(Code::kInvalid, "method " + ex.req.method + " not allowed on " +
                                                    ex.req.path + " (allowed: " + allow + ")"));
    r.status = 405;
    r.headers.emplace_back("Allow", allow);
    co_return co_await send_reply(impl, conn, &ex, std::move(r));
  }
  if (qpos != std::string_view::npos) {
    auto q = parse_query(target.substr(qpos + 1));
    if (!q) co_return co_await send_error(impl, conn, &ex, q.error());
    ex.req.query = std::move(*q);
  }
  ex.req.params = std::move(m.params);
  const RouteId route = m.route->id;

  if (m.route->body == BodyKind::kRaw) {
    co_return co_await put_file(impl, conn, buffer, std::move(hp), &ex);
  }
  bool reply_sent = false;
  const bool is_exec = route == RouteId::kExec || route == RouteId::kSeedExec ||
                       route == RouteId::kExecStream || route == RouteId::kSeedExecStream;
  const std::size_t limit = is_exec ? ctx->opts.max_exec_json_bytes : ctx->opts.max_json_bytes;
  if (!co_await read_small_body(impl, conn, buffer, std::move(hp), &ex, limit, &reply_sent)) {
    co_return false;
  }
  switch (route) {
    case RouteId::kExec: co_return co_await exec_once(impl, conn, &ex, /*seed=*/false);
    case RouteId::kSeedExec: co_return co_await exec_once(impl, conn, &ex, /*seed=*/true);
    case RouteId::kExecStream: co_return co_await exec_stream(impl, conn, &ex, /*seed=*/false);
    case RouteId::kSeedExecStream: co_return co_await exec_stream(impl, conn, &ex, /*seed=*/true);
    case RouteId::kFileGet: co_return co_await get_file(impl, conn, &ex);
    default: break;
  }
  Reply reply = co_await detail::handle_simple(ctx, route, ex.req);
  co_return co_await send_reply(impl, conn, &ex, std::move(reply));
}

asio::awaitable<void> run_connection(std::shared_ptr<Impl> impl, tcp::socket socket,
                                     std::uint64_t id) {
  Conn conn(std::move(socket));
  conn.id = id;
  impl->conns.push_back(&conn);
  struct Unregister {
    Impl* impl;
    std::list<Conn*>::iterator it;
    ~Unregister() { impl->conns.erase(it); }
  } unregister{impl.get(), std::prev(impl->conns.end())};

  beast::flat_buffer buffer;
  while (!impl->stopping) {
    if (!co_await serve_one(impl.get(), &conn, &buffer)) break;
  }
  beast::error_code ec;
  conn.stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  conn.stream.close();
}

void log_exception(std::string_view what, std::uint64_t id, std::exception_ptr e) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    spdlog::error("{} {} ended by an exception: {}", what, id, x.what());
  } catch (...) {
    spdlog::error("{} {} ended by an unknown exception", what, id);
  }
}

asio::awaitable<void> accept_loop(std::shared_ptr<Impl> impl) {
  for (;;) {
    auto [ec, socket] = co_await impl->acceptor.async_accept(kTuple);
    if (ec) {
      if (impl->stopping || !impl->acceptor.is_open()) co_return;
      // EMFILE and friends: back off instead of spinning on the error.
      spdlog::warn("accept: {}", ec.message());
      asio::steady_timer t(impl->acceptor.get_executor(), std::chrono::milliseconds(50));
      co_await t.async_wait(kTuple);
      continue;
    }
    if (impl->stopping) co_return;
    if (impl->conns.size() >= impl->ctx.opts.max_connections) {
      spdlog::warn("connection limit ({}) reached; refusing a connection",
                   impl->ctx.opts.max_connections);
      continue;  // socket closes here
    }
    beast::error_code oec;
    socket.set_option(tcp::no_delay(true), oec);
    std::uint64_t id = impl->next_conn++;
    asio::co_spawn(impl->acceptor.get_executor(), run_connection(impl, std::move(socket), id),
                   [id](std::exception_ptr e) { log_exception("connection", id, e); });
  }
}

asio::awaitable<void> drain(std::shared_ptr<Impl> impl, std::function<void()> done) {
  auto deadline = std::chrono::steady_clock::now() + impl->ctx.opts.shutdown_grace;
  asio::steady_timer t(impl->acceptor.get_executor());
  while (!impl->conns.empty() && std::chrono::steady_clock::now() < deadline) {
    t.expires_after(std::chrono::milliseconds(20));
    co_await t.async_wait(kTuple);
  }
  if (!impl->conns.empty()) {
    spdlog::warn("shutdown: {} connection(s) still busy after {} s; stopping anyway",
                 impl->conns.size(), impl->ctx.opts.shutdown_grace.count());
  }
  done();
}

}  // namespace

HttpServer::HttpServer(asio::io_context& ioc, asio::thread_pool& pool,
                       session::SessionManager& sessions,
                       std::shared_ptr<sandbox::Backend> default_backend, ServerOptions opts)
    : impl_(std::make_shared<Impl>(ioc, pool, sessions, std::move(default_backend),
                                   std::move(opts))) {}

HttpServer::~HttpServer() {
  beast::error_code ec;
  impl_->acceptor.close(ec);
}

Result<tcp::endpoint> HttpServer::listen() {
  Context& ctx = impl_->ctx;
  for (const auto& d : ctx.opts.shared_dirs) {
    UniqueFd fd(::open(d.host_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!fd) return fail_errno(errno, "shared dir " + d.prefix + ": open(" + d.host_path + ")");
    detail::SharedFs s;
    s.prefix = d.prefix;
    s.fs = std::make_unique<sandbox::RootedFs>(std::move(fd), sandbox::RootMode::kBeneath,
                                               std::nullopt, d.prefix);
    ctx.shared.push_back(std::move(s));
  }
  // Longest prefix first, so "a/b" wins over "a".
  std::sort(ctx.shared.begin(), ctx.shared.end(),
            [](const auto& a, const auto& b) { return a.prefix.size() > b.prefix.size(); });

  beast::error_code ec;
  auto addr = asio::ip::make_address(ctx.opts.address, ec);
  std::string where = ctx.opts.address + ":" + std::to_string(ctx.opts.port);
  if (ec) return fail(Code::kInvalid, "listen address " + where + ": " + ec.message());
  tcp::endpoint ep(addr, ctx.opts.port);
  auto& a = impl_->acceptor;
  if (a.open(ep.protocol(), ec); ec) return fail(Code::kInternal, "socket: " + ec.message());
  a.set_option(asio::socket_base::reuse_address(true), ec);
  if (a.bind(ep, ec); ec) {
    return fail_errno(ec.value(), "bind(" + where + ")");
  }
  if (a.listen(asio::socket_base::max_listen_connections, ec); ec) {
    return fail_errno(ec.value(), "listen(" + where + ")");
  }
  auto local = a.local_endpoint(ec);
  if (ec) return fail_errno(ec.value(), "getsockname(" + where + ")");
  return local;
}

void HttpServer::start() {
  asio::co_spawn(impl_->acceptor.get_executor(), accept_loop(impl_),
                 [](std::exception_ptr e) { log_exception("accept loop", 0, e); });
}

void HttpServer::shutdown(std::function<void()> done) {
  impl_->stopping = true;
  beast::error_code ec;
  impl_->acceptor.close(ec);
  for (Conn* c : impl_->conns) {
    if (c->idle) c->stream.cancel();
  }
  asio::co_spawn(impl_->acceptor.get_executor(), drain(impl_, std::move(done)),
                 [](std::exception_ptr e) { log_exception("shutdown", 0, e); });
}

}  // namespace agentbox::server
