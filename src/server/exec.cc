// The exec surface: POST /v1/sessions/{id}/exec (one reply) and .../exec/stream (NDJSON as the
// command runs), and the same runner for seed 001's /exec and /exec-stream (seed001.cc). A
// command runs beside a watch on its client: a client gone kills the command's whole tree.

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
#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/exec.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {

void apply_shell(const std::string& shell, std::string* command, std::vector<std::string>* argv) {
  if (shell.empty() || !argv->empty() || command->empty()) return;
  *argv = {shell, "-c", std::move(*command)};
  command->clear();
}

namespace {

using namespace boost::asio::experimental::awaitable_operators;

// Seed 001's /exec-stream sends output as lines; a longer line goes out in pieces of this size.
constexpr std::size_t kMaxLine = 64u << 10;

struct PreparedExec {
  sandbox::ExecSpec spec;
  std::shared_ptr<sandbox::Sandbox> box;
  std::string session_id;
  // Seed 001: the host-path prefix the client's artifact_dir used (artifacts go back under it).
  std::string artifact_host_prefix;
};

// Seed 001's client sends artifact_dir as the workspace's host path (the toolbox-server's
// /mnt/workspace/<id>/..., or this daemon's <workspace root>/<id>/...). Maps it onto the box's
// workspace path and returns the host prefix it used ("" when it was not such a path).
std::string map_seed_artifact_dir(const Context* ctx, const std::string& id,
                                  std::string_view box_workspace, std::string* dir) {
  std::vector<std::string> prefixes = {"/mnt/workspace/" + id};
  if (!ctx->opts.seed_workspace_root.empty()) {
    prefixes.push_back(ctx->opts.seed_workspace_root + "/" + id);
  }
  for (const std::string& p : prefixes) {
    if (p == box_workspace) continue;  // the host backend: already the box's path
    std::string_view d = *dir;
    while (d.size() > p.size() && d.back() == '/') d.remove_suffix(1);
    if (d == p || (d.size() > p.size() && d.starts_with(p) && d[p.size()] == '/')) {
      *dir = std::string(box_workspace) + std::string(d.substr(p.size()));
      return p;
    }
  }
  return "";
}

// Artifacts under the box's workspace, reported under the host prefix the client used.
void unmap_seed_artifacts(std::string_view box_workspace, const std::string& host_prefix,
                          std::vector<sandbox::Artifact>* artifacts) {
  if (host_prefix.empty()) return;
  for (sandbox::Artifact& a : *artifacts) {
    std::string_view p = a.path;
    if (p.starts_with(box_workspace) &&
        (p.size() == box_workspace.size() || p[box_workspace.size()] == '/')) {
      a.path = host_prefix + std::string(p.substr(box_workspace.size()));
    }
  }
}

// Decodes an exec body (v1 or seed 001) and gets the session's sandbox, creating the session
// if needed (exec routes create).
asio::awaitable<Result<PreparedExec>> prepare_exec(Context* ctx, Request* rq, bool seed) {
  Request& req = *rq;
  auto body = body_object(&req);
  if (!body) co_return std::unexpected(body.error());
  PreparedExec p;
  if (seed) {
    auto d = decode_seed_exec(*body);
    if (!d) co_return std::unexpected(d.error());
    p.spec = std::move(d->spec);
    p.session_id = d->session_id;
    const auto& l = d->limits;
    if (l != sandbox::Limits{}) {
      // Seed 001's "cgroup" applies when the agent's session is made; a later exec's cgroup
      // that differs changes the live box's limits first (SessionManager::update), so the
      // command runs under them.
      session::SessionSpec spec;
      spec.limits = l;
      auto made = co_await ctx->svc->sessions.ensure(
          origin_of(req, service::Surface::kSeed001), p.session_id, std::move(spec), "cgroup");
      if (!made) co_return std::unexpected(made.error());
    }
  } else {
    auto id = session_param(req);
    if (!id) co_return std::unexpected(id.error());
    auto d = decode_exec(*body);
    if (!d) co_return std::unexpected(d.error());
    p.spec = std::move(*d);
    p.session_id = std::move(*id);
  }
  auto box =
      co_await acquire_sandbox(ctx, p.session_id, /*create_if_missing=*/true, req.caller);
  if (!box) co_return std::unexpected(box.error());
  p.box = std::move(*box);
  if (seed) {
    if (!p.spec.artifact_dir.empty()) {
      p.artifact_host_prefix =
          map_seed_artifact_dir(ctx, p.session_id, p.box->workspace(), &p.spec.artifact_dir);
    }
    // --shell runs the command (seed 001's toolbox-server runs `bash -c`).
    apply_shell(ctx->opts.seed_shell, &p.spec.command, &p.spec.argv);
  } else {
    // /v1: --shell (or the config's `shell`) when the operator gave one, else /bin/sh.
    apply_shell(ctx->opts.command_shell, &p.spec.command, &p.spec.argv);
  }
  // (Exec::run checks it too; here it is a 400 before a stream starts.)
  if (auto st = service::check_artifact_dir(p.spec.artifact_dir, p.box->workspace()); !st) {
    co_return std::unexpected(st.error());
  }
  co_return p;
}

}  // namespace

asio::awaitable<std::optional<Result<sandbox::ExecResult>>> run_collected_until(
    Context* ctx, const Request& req, std::shared_ptr<sandbox::Sandbox> box,
    std::string session_id, sandbox::ExecSpec spec, asio::awaitable<void> stop, bool* gone,
    service::Surface surface) {
  // (Made before the co_await: g++ 12 destroys a braced temporary of a co_await expression
  // twice, STYLE.md.)
  service::Lease lease{std::move(session_id), std::move(box)};
  service::StopSignal signal{std::move(stop), gone};
  service::Origin origin = origin_of(req, surface);
  co_return co_await ctx->svc->exec.run(std::move(origin), std::move(lease), std::move(spec),
                                        nullptr, std::move(signal));
}

asio::awaitable<std::optional<Result<sandbox::ExecResult>>> run_collected(
    Call* call, std::shared_ptr<sandbox::Sandbox> box, std::string session_id,
    sandbox::ExecSpec spec, service::Surface surface) {
  Conn* conn = call->conn;
  // The command may run for a long time; the exec has its own timeout.
  conn->stream.expires_never();
  bool gone = false;
  auto watch = watch_disconnect(&conn->stream.socket(), &gone);
  co_return co_await run_collected_until(call->ctx, call->ex.req, std::move(box),
                                         std::move(session_id), std::move(spec),
                                         std::move(watch), &gone, surface);
}

namespace {

// POST /v1/sessions/{id}/exec and POST /exec.
asio::awaitable<bool> exec_once(Call* call, bool seed) {
  auto prepared = co_await prepare_exec(call->ctx, &call->ex.req, seed);
  if (!prepared) co_return co_await send_error(call, prepared.error());
  auto ran = co_await run_collected(call, prepared->box, prepared->session_id,
                                    std::move(prepared->spec),
                                    seed ? service::Surface::kSeed001 : service::Surface::kV1);
  if (!ran) co_return false;  // the client is gone
  auto r = std::move(*ran);
  if (!r) co_return co_await send_error(call, r.error());
  if (seed) {
    unmap_seed_artifacts(prepared->box->workspace(), prepared->artifact_host_prefix,
                         &r->artifacts);
  }
  json j = seed ? encode_seed_exec_result(*r) : encode_exec_result(*r);
  co_return co_await send_reply(call, json_reply(200, j));
}

// Writes NDJSON lines of a streaming exec as chunks, in order, as the command produces output.
// v1 lines: {"type":"stdout","data":...}; seed 001 lines: {"stream":"stdout","line":...}.
class NdjsonSink final : public sandbox::OutputSink {
 public:
  NdjsonSink(Context* ctx, Conn* conn, bool seed, bool chunked, const bool* gone)
      : ctx_(ctx), conn_(conn), seed_(seed), chunked_(chunked), gone_(gone) {}

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
    conn_->stream.expires_after(ctx_->opts.io_timeout);
    std::size_t n = 0;
    beast::error_code ec;
    if (chunked_) {
      std::tie(ec, n) =
          co_await asio::async_write(conn_->stream, http::make_chunk(asio::buffer(line)), kTuple);
    } else {
      std::tie(ec, n) = co_await asio::async_write(conn_->stream, asio::buffer(line), kTuple);
    }
    ctx_->metrics.add_bytes_out(n);
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

  Context* ctx_;
  Conn* conn_;
  bool seed_;
  bool chunked_;
  const bool* gone_;
  bool failed_ = false;
  std::string pending_[2];
};

// POST /v1/sessions/{id}/exec/stream and POST /exec-stream.
asio::awaitable<bool> exec_stream(Call* call, bool seed) {
  Context* ctx = call->ctx;
  Conn* conn = call->conn;
  Exchange* ex = &call->ex;
  auto prepared = co_await prepare_exec(ctx, &ex->req, seed);
  if (!prepared) co_return co_await send_error(call, prepared.error());

  auto started = co_await start_ndjson(call);
  if (!started.ok) co_return false;
  const bool chunked = started.chunked;
  const bool keep = started.keep;

  bool gone = false;
  NdjsonSink sink(ctx, conn, seed, chunked, &gone);
  conn->stream.expires_never();
  service::Lease lease{prepared->session_id, prepared->box};
  service::StopSignal stop{watch_disconnect(&conn->stream.socket(), &gone), &gone};
  auto ran = co_await ctx->svc->exec.run(
      origin_of(ex->req, seed ? service::Surface::kSeed001 : service::Surface::kV1),
      std::move(lease), std::move(prepared->spec), &sink, std::move(stop));
  if (!ran || sink.failed()) {
    spdlog::info("conn={} req={} client went away; command in session {} killed", conn->id,
                 ex->req.id, prepared->session_id);
    co_return false;
  }
  auto r = std::move(*ran);
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
            {"killed_by", encode_killed_by(r->killed_by)},
            {"duration_ms", r->duration.count()},
            {"stdout_truncated", r->stdout_truncated},
            {"stderr_truncated", r->stderr_truncated},
            {"artifacts", encode_artifacts(r->artifacts)}};
  }
  if (!co_await sink.write_line(to_wire(last))) co_return false;
  if (!co_await end_stream(ctx, conn, chunked)) co_return false;
  co_return keep;
}

asio::awaitable<bool> v1_exec(Call* call) { co_return co_await exec_once(call, /*seed=*/false); }

asio::awaitable<bool> v1_exec_stream(Call* call) {
  co_return co_await exec_stream(call, /*seed=*/false);
}

}  // namespace

asio::awaitable<bool> seed_exec(Call* call) { co_return co_await exec_once(call, /*seed=*/true); }

asio::awaitable<bool> seed_exec_stream(Call* call) {
  co_return co_await exec_stream(call, /*seed=*/true);
}

std::vector<RouteSpec> exec_routes() {
  using B = BodyKind;
  using R = RouteId;
  return {
      {R::kExec, "POST", "/v1/sessions/{id}/exec", B::kJson, true, v1_exec},
      {R::kExecStream, "POST", "/v1/sessions/{id}/exec/stream", B::kJson, true, v1_exec_stream},
  };
}

}  // namespace agentbox::server::detail
