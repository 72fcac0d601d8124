// The processes surface (API.md "Processes and terminals"): start, list, get, kill, stdin,
// signal, resize, output (NDJSON, followable, resumable by byte offset), attach (WebSocket) and
// the one-step pty (WebSocket). The work is the session's sandbox::ProcessTable
// (sandbox/process_table.h); this file maps requests onto it.
//
// Threading: every call on a table comes from the network io_context thread, where the
// handlers run (acquire_sandbox hops to the pool and back): start() ties the process's I/O to
// that executor, and the WebSocket of an attach lives there too.

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <cctype>
#include <cstdio>
#include <limits>
#include <random>
#include <tuple>

#include "common/log.h"
#include "sandbox/process_table.h"
#include "server/internal/blocking.h"
#include "server/internal/exec.h"
#include "server/internal/processes.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "server/websocket.h"

namespace agentbox::server::detail {
WsOptions ws_options(const ServerOptions& o) {
  WsOptions w;
  w.max_message_bytes = o.ws_max_message_bytes;
  w.ping_interval = o.ws_ping_interval;
  w.max_queued_bytes = o.ws_max_queued_bytes;
  return w;
}

std::optional<std::uint64_t> output_end(sandbox::ProcessTable* table, const std::string& pid) {
  std::optional<std::uint64_t> since;
  for (;;) {
    auto b = table->output(pid, since, 1u << 20);
    if (!b || b->ended) return since;
    if (b->records.empty()) return b->next;
    since = b->next;
  }
}

namespace {

using namespace boost::asio::experimental::awaitable_operators;
using sandbox::OutputBatch;
using sandbox::OutputRecord;
using sandbox::ProcessTable;

// The session's table, and the lease of the sandbox that owns it (held while it is used).
using Procs = service::ProcTarget;

service::Origin v1(const Request& req) { return origin_of(req, service::Surface::kV1); }

asio::awaitable<Result<Procs>> procs_of(Context* ctx, Request* req, bool create) {
  auto id = session_param(*req);
  if (!id) co_return std::unexpected(id.error());
  co_return co_await ctx->svc->processes.target(v1(*req), *id, create);
}

const std::string& ref_param(const Request& req) { return req.params.at("ref"); }

Result<std::optional<std::uint64_t>> since_query(const Request& req) {
  auto it = req.query.find("since");
  if (it == req.query.end()) return std::optional<std::uint64_t>{};
  const std::string& v = it->second;
  std::uint64_t n = 0;
  bool ok = !v.empty() && v.size() <= 19;
  for (char c : v) {
    if (c < '0' || c > '9') {
      ok = false;
      break;
    }
    n = n * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (!ok) return fail(Code::kInvalid, "query parameter 'since' must be a byte offset (0 or more)");
  return std::optional<std::uint64_t>(n);
}

// POST /v1/sessions/{id}/processes
asio::awaitable<Reply> start_process(Context* ctx, Request* req) {
  auto body = body_object(req);
  if (!body) co_return error_reply(body.error());
  auto spec = decode_process_start(*body);
  if (!spec) co_return error_reply(spec.error());
  apply_shell(ctx->opts.command_shell, &spec->command, &spec->argv);
  auto procs = co_await procs_of(ctx, req, /*create=*/true);
  if (!procs) co_return error_reply(procs.error());
  auto info = co_await ctx->svc->processes.start(v1(*req), std::move(*procs), std::move(*spec));
  if (!info) co_return error_reply(info.error());
  co_return json_reply(201, encode_process(*info));
}

// GET /v1/sessions/{id}/processes
asio::awaitable<Reply> list_processes(Context* ctx, Request* req) {
  auto procs = co_await procs_of(ctx, req, /*create=*/false);
  if (!procs) co_return error_reply(procs.error());
  json list = json::array();
  for (const auto& p : procs->table->list()) list.push_back(encode_process(p));
  json j = json::object();
  j["processes"] = std::move(list);
  co_return json_reply(200, j);
}

// GET /v1/sessions/{id}/processes/{ref}
asio::awaitable<Reply> get_process(Context* ctx, Request* req) {
  auto procs = co_await procs_of(ctx, req, /*create=*/false);
  if (!procs) co_return error_reply(procs.error());
  auto info = co_await ctx->svc->processes.get(std::move(*procs), ref_param(*req));
  if (!info) co_return error_reply(info.error());
  co_return json_reply(200, encode_process(*info));
}

// DELETE /v1/sessions/{id}/processes/{ref}: kills the tree and answers once the process is
// seen ended (at most a few seconds later), with its final state.
asio::awaitable<Reply> delete_process(Context* ctx, Request* req) {
  auto procs = co_await procs_of(ctx, req, /*create=*/false);
  if (!procs) co_return error_reply(procs.error());
  auto info = co_await ctx->svc->processes.kill(v1(*req), std::move(*procs), ref_param(*req));
  if (!info) co_return error_reply(info.error());
  co_return json_reply(200, encode_process(*info));
}

// POST .../processes/{ref}/signal {"signal"}
asio::awaitable<Reply> signal_process(Context* ctx, Request* req) {
  auto body = body_object(req);
  if (!body) co_return error_reply(body.error());
  auto signo = decode_signal(*body);
  if (!signo) co_return error_reply(signo.error());
  auto procs = co_await procs_of(ctx, req, /*create=*/false);
  if (!procs) co_return error_reply(procs.error());
  if (auto st = procs->table->signal(ref_param(*req), *signo); !st) {
    co_return error_reply(st.error());
  }
  auto info = procs->table->get(ref_param(*req));
  if (!info) co_return error_reply(info.error());
  co_return json_reply(200, encode_process(*info));
}

// POST .../processes/{ref}/resize {"cols", "rows"}
asio::awaitable<Reply> resize_process(Context* ctx, Request* req) {
  auto body = body_object(req);
  if (!body) co_return error_reply(body.error());
  if (auto st = check_known_fields(*body, {"cols", "rows"}); !st) co_return error_reply(st.error());
  auto size = decode_pty_size(*body);
  if (!size) co_return error_reply(size.error());
  auto procs = co_await procs_of(ctx, req, /*create=*/false);
  if (!procs) co_return error_reply(procs.error());
  if (auto st = procs->table->resize(ref_param(*req), *size); !st) {
    co_return error_reply(st.error());
  }
  auto info = procs->table->get(ref_param(*req));
  if (!info) co_return error_reply(info.error());
  co_return json_reply(200, encode_process(*info));
}

// POST .../processes/{ref}/stdin: the raw body goes to stdin; ?close=true then closes it.
asio::awaitable<bool> stdin_process(Call* call) {
  Context* ctx = call->ctx;
  Exchange* ex = &call->ex;
  auto close = bool_query(ex->req, "close");
  if (!close) co_return co_await send_error(call, close.error());
  const std::uint64_t cap = ProcessTable::kMaxStdinQueued;
  Error too_big = Error::make(Code::kTooBig, "stdin body is over the limit of " +
                                                 std::to_string(cap) + " bytes");
  if (ex->content_length && *ex->content_length > cap) {
    ex->keep_alive = false;
    co_return co_await send_error(call, too_big);
  }
  // The process first: an unknown ref is 404 before any body is read.
  auto procs = co_await procs_of(ctx, &ex->req, /*create=*/false);
  if (!procs) {
    ex->keep_alive = ex->keep_alive && !ex->body_pending;
    co_return co_await send_error(call, procs.error());
  }
  const std::string ref = ref_param(ex->req);
  if (auto info = procs->table->get(ref); !info) {
    ex->keep_alive = ex->keep_alive && !ex->body_pending;
    co_return co_await send_error(call, info.error());
  }
  if (!co_await maybe_continue(call)) co_return false;
  std::string data;
  if (ex->body_pending) {
    BodyReader body;
    start_body(call, &body, cap);
    std::vector<char> buf(64u << 10);
    while (!body.done()) {
      BodyChunk chunk = co_await read_body_chunk(&body, buf.data(), buf.size());
      ctx->metrics.add_bytes_in(chunk.wire_bytes);
      if (chunk.ec && is_disconnect(chunk.ec)) co_return false;
      if (chunk.ec) {
        ex->keep_alive = false;
        co_return co_await send_error(call, body_error(chunk.ec, too_big));
      }
      data.append(buf.data(), chunk.got);
      if (data.size() > cap) {
        ex->keep_alive = false;
        co_return co_await send_error(call, too_big);
      }
    }
    ex->body_pending = false;
  }
  if (auto st = procs->table->write_stdin(ref, data, *close); !st) {
    co_return co_await send_error(call, st.error());
  }
  auto info = procs->table->get(ref);
  if (!info) co_return co_await send_error(call, info.error());
  co_return co_await send_reply(call, json_reply(200, encode_process(*info)));
}

json record_json(const OutputRecord& r) {
  json j = json::object();
  j["type"] = std::string(sandbox::record_type_name(r.type));
  if (r.type == OutputRecord::Type::kExit) {
    j["exit_code"] = r.exit_code;
    j["signal"] = r.signal ? json(*r.signal) : json(nullptr);
    j["offset"] = r.offset;
  } else {
    j["data"] = r.data;
    j["offset"] = r.offset;
  }
  return j;
}

// Writes one NDJSON line (as one chunk when chunked).
asio::awaitable<bool> write_ndjson(Context* ctx, Conn* conn, bool chunked, std::string line) {
  line += '\n';
  co_return co_await write_stream(ctx, conn, chunked, line);
}

// The output records from `since` to the end (follow: until the exit record). Returns whether
// every line was written.
asio::awaitable<bool> pump_output(Context* ctx, Conn* conn, bool chunked, ProcessTable* table,
                                  std::string ref, std::optional<std::uint64_t> since,
                                  bool follow) {
  for (;;) {
    Result<OutputBatch> b = fail(Code::kInternal, "unset");
    if (follow) {
      b = co_await table->follow(ref, since);
    } else {
      b = table->output(ref, since);
    }
    if (!b) co_return true;  // the process is gone from the table: nothing more to tell
    if (b->records.empty()) {
      if (!follow) co_return true;
      // follow() completes empty when cancelled: the client left.
      co_return false;
    }
    for (const auto& r : b->records) {
      if (!co_await write_ndjson(ctx, conn, chunked, to_wire(record_json(r)))) co_return false;
    }
    if (b->ended) co_return true;
    since = b->next;
  }
}

// GET .../processes/{ref}/output?follow=true&since=N
asio::awaitable<bool> output_process(Call* call) {
  Context* ctx = call->ctx;
  Conn* conn = call->conn;
  Exchange* ex = &call->ex;
  auto follow = bool_query(ex->req, "follow");
  if (!follow) co_return co_await send_error(call, follow.error());
  auto since = since_query(ex->req);
  if (!since) co_return co_await send_error(call, since.error());
  auto procs = co_await procs_of(ctx, &ex->req, /*create=*/false);
  if (!procs) co_return co_await send_error(call, procs.error());
  const std::string ref = ref_param(ex->req);
  // By pid from here, so a tag reused by a later process does not switch streams mid-way.
  auto info = procs->table->get(ref);
  if (!info) co_return co_await send_error(call, info.error());
  const std::string pid = std::to_string(info->pid);

  auto started = co_await start_ndjson(call);
  if (!started.ok) co_return false;
  const bool chunked = started.chunked;
  const bool keep = started.keep;

  bool ok = true;
  if (*follow) {
    conn->stream.expires_never();
    bool gone = false;
    auto op = pump_output(ctx, conn, chunked, procs->table, pid, *since, true) ||
              watch_disconnect(&conn->stream.socket(), &gone);
    auto outcome = co_await std::move(op);
    ok = outcome.index() == 0 && std::get<0>(outcome) && !gone;
  } else {
    ok = co_await pump_output(ctx, conn, chunked, procs->table, pid, *since, false);
  }
  if (!ok) co_return false;
  if (!co_await end_stream(ctx, conn, chunked)) co_return false;
  co_return keep;
}

// --- WebSocket: attach and pty ---

// A text frame must be UTF-8: invalid bytes become U+FFFD.
std::string valid_utf8(const std::string& s) {
  std::string quoted = json(s).dump(-1, ' ', false, json::error_handler_t::replace);
  return json::parse(quoted).get<std::string>();
}

// Carries the output of process `pid` to the socket: a pty's bytes as binary frames, else each
// stdout line as one text frame. At the exit record closes the socket (1000, "exit N" or
// "signal N") and waits to be cancelled (the socket's end cancels it).
asio::awaitable<void> attach_pump(std::shared_ptr<WsSession> ws, ProcessTable* table,
                                  std::string pid, bool pty, std::optional<std::uint64_t> since) {
  std::string line;  // line mode: a stdout line not complete yet
  for (;;) {
    Result<OutputBatch> b = co_await table->follow(pid, since);
    if (!b || b->records.empty()) co_return;  // gone from the table, or cancelled
    for (auto& r : b->records) {
      if (r.type == OutputRecord::Type::kExit) {
        if (!pty && !line.empty()) ws->send(valid_utf8(line));
        ws->close(beast::websocket::close_code::normal,
                  r.signal ? "signal " + std::to_string(*r.signal)
                           : "exit " + std::to_string(r.exit_code));
        asio::steady_timer t(co_await asio::this_coro::executor,
                             asio::steady_timer::time_point::max());
        co_await t.async_wait(kTuple);
        co_return;
      }
      if (pty) {
        ws->send(std::move(r.data), /*binary=*/true);
        continue;
      }
      if (r.type != OutputRecord::Type::kStdout) continue;
      line += r.data;
      std::size_t start = 0;
      for (;;) {
        std::size_t nl = line.find('\n', start);
        if (nl == std::string::npos) break;
        ws->send(valid_utf8(line.substr(start, nl - start)));
        start = nl + 1;
      }
      line.erase(0, start);
    }
    since = b->next;
  }
}

// Serves an attached socket until it or the process ends. `kill_at_end`: the pty route, whose
// process ends with its socket.
asio::awaitable<bool> serve_attached(Call* call, Procs procs, sandbox::ProcessInfo info,
                                     bool kill_at_end, AttachHooks hooks) {
  Context* ctx = call->ctx;
  Conn* conn = call->conn;
  ProcessTable* table = procs.table;
  const std::string pid = std::to_string(info.pid);
  auto lease = table->attach(pid);
  if (!lease) {
    if (kill_at_end) (void)table->kill(pid);
    co_return co_await send_error(call, lease.error());
  }
  const bool pty = info.pty.has_value();
  // A terminal shows what it printed so far; a line client starts at the next line.
  std::optional<std::uint64_t> since;
  if (!pty) since = output_end(table, pid);
  auto ws = std::make_shared<WsSession>(std::move(conn->stream), ws_options(ctx->opts));
  if (!hooks.subprotocol.empty()) ws->set_subprotocol(hooks.subprotocol);
  log_request(call, 101);
  auto ec = co_await ws->accept(call->hp->release());
  if (ec) {
    if (kill_at_end) (void)table->kill(pid);
    co_return false;
  }
  std::weak_ptr<WsSession> weak = ws;
  if (hooks.opened) hooks.opened(weak);
  const bool ignore_binary = hooks.ignore_binary;
  conn->on_shutdown = [weak] {
    if (auto s = weak.lock()) s->close(beast::websocket::close_code::going_away, "shutting down");
  };
  auto on_message = [table, pid, pty, weak, ignore_binary](std::string data, bool binary) {
    auto s = weak.lock();
    if (!s || (binary && ignore_binary)) return;
    Status st;
    if (pty && !binary) {
      json m = json::parse(data, nullptr, false);
      if (!m.is_object() || m.value("type", "") != "resize") {
        s->close(beast::websocket::close_code::policy_error,
                 "text frames are {\"type\":\"resize\",\"cols\",\"rows\"}");
        return;
      }
      auto size = decode_pty_size(m);
      if (!size) {
        s->close(beast::websocket::close_code::policy_error, size.error().message.substr(0, 120));
        return;
      }
      st = table->resize(pid, *size);
    } else {
      if (!pty) data += '\n';
      st = table->write_stdin(pid, data);
    }
    // An ended process: its exit closes the socket; anything else is this client's fault.
    if (!st && st.error().code != Code::kExists) {
      s->close(beast::websocket::close_code::policy_error, st.error().message.substr(0, 120));
    }
  };
  co_await (ws->run(on_message) || attach_pump(ws, table, pid, pty, since));
  conn->on_shutdown = nullptr;
  if (kill_at_end) (void)table->kill(pid);
  co_return false;  // the connection was the WebSocket's
}

// GET .../processes/{ref}/attach (WebSocket)
asio::awaitable<bool> attach_process(Call* call) {
  auto procs = co_await procs_of(call->ctx, &call->ex.req, /*create=*/false);
  if (!procs) co_return co_await send_error(call, procs.error());
  auto info = co_await service::get_settled(procs->table, ref_param(call->ex.req));
  if (!info) co_return co_await send_error(call, info.error());
  AttachHooks plain;
  co_return co_await serve_attached(call, std::move(*procs), std::move(*info), false,
                                    std::move(plain));
}

// GET /v1/sessions/{id}/pty?cols=&rows=&command= (WebSocket): a pty process, attached; it ends
// with the socket.
asio::awaitable<bool> pty_session(Call* call) {
  Request& req = call->ex.req;
  json q = json::object();
  for (const char* k : {"cols", "rows"}) {
    auto it = req.query.find(k);
    if (it == req.query.end()) {
      q[k] = std::string(k) == "cols" ? 80 : 24;
      continue;
    }
    const std::string& v = it->second;
    bool digits = !v.empty() && v.size() <= 5;
    for (char c : v) digits = digits && c >= '0' && c <= '9';
    if (!digits) {
      co_return co_await send_error(
          call, Error::make(Code::kInvalid,
                            "query parameter '" + std::string(k) + "' must be 1 to 1000"));
    }
    q[k] = std::stoi(v);
  }
  auto size = decode_pty_size(q);
  if (!size) co_return co_await send_error(call, size.error());
  json body = json::object();
  auto cmd = req.query.find("command");
  body["command"] = cmd != req.query.end() && !cmd->second.empty()
                        ? cmd->second
                        : std::string("if command -v bash >/dev/null; then exec bash; else exec sh; fi");
  body["pty"] = {{"cols", size->cols}, {"rows", size->rows}};
  auto spec = decode_process_start(body);
  if (!spec) co_return co_await send_error(call, spec.error());
  auto procs = co_await procs_of(call->ctx, &req, /*create=*/true);
  if (!procs) co_return co_await send_error(call, procs.error());
  auto info = co_await call->ctx->svc->processes.start(v1(req), *procs, std::move(*spec));
  if (!info) co_return co_await send_error(call, info.error());
  AttachHooks plain;
  co_return co_await serve_attached(call, std::move(*procs), std::move(*info), true,
                                    std::move(plain));
}

}  // namespace

asio::awaitable<bool> attach_to_process(Call* call, std::shared_ptr<sandbox::Sandbox> box,
                                        std::string session, sandbox::ProcessInfo info,
                                        AttachHooks hooks) {
  Procs procs;
  procs.table = box->processes();
  procs.lease = service::Lease{std::move(session), std::move(box)};
  co_return co_await serve_attached(call, std::move(procs), std::move(info), false,
                                    std::move(hooks));
}

std::vector<RouteSpec> process_routes() {
  using B = BodyKind;
  using R = RouteId;
  return {
      {R::kProcessStart, "POST", "/v1/sessions/{id}/processes", B::kJson, true,
       simple<start_process>},
      {R::kProcessList, "GET", "/v1/sessions/{id}/processes", B::kNone, true,
       simple<list_processes>},
      {R::kProcessGet, "GET", "/v1/sessions/{id}/processes/{ref}", B::kNone, true,
       simple<get_process>},
      {R::kProcessDelete, "DELETE", "/v1/sessions/{id}/processes/{ref}", B::kNone, true,
       simple<delete_process>},
      {R::kProcessOutput, "GET", "/v1/sessions/{id}/processes/{ref}/output", B::kNone, true,
       output_process},
      {R::kProcessStdin, "POST", "/v1/sessions/{id}/processes/{ref}/stdin", B::kRaw, true,
       stdin_process},
      {R::kProcessSignal, "POST", "/v1/sessions/{id}/processes/{ref}/signal", B::kJson, true,
       simple<signal_process>},
      {R::kProcessResize, "POST", "/v1/sessions/{id}/processes/{ref}/resize", B::kJson, true,
       simple<resize_process>},
      {R::kProcessAttach, "GET", "/v1/sessions/{id}/processes/{ref}/attach", B::kNone, true,
       attach_process, RouteKind::kWebSocket},
      {R::kPty, "GET", "/v1/sessions/{id}/pty", B::kNone, true, pty_session,
       RouteKind::kWebSocket},
  };
}

}  // namespace agentbox::server::detail
