// E2B's process.Process (shared/E2B-MCP.md 3.2) onto the session's sandbox::ProcessTable, the
// same table /v1/sessions/{id}/processes serves: Start and Connect (server streams), List,
// SendInput, CloseStdin, SendSignal, Update. StreamInput (client streaming) is unimplemented:
// no SDK calls it, and Connect over HTTP/1.1 cannot carry it.
//
// A pid is the table's (the pid the box sees). The stream of Start or Connect is only a view:
// a client that leaves never touches the process (`handle.disconnect()` + `commands.connect`).
// Connect-Timeout-Ms is the process's lifetime: at its end the process is killed (whole tree)
// whether or not a stream still watches, and a watching stream ends with deadline_exceeded.
// Kill (SIGKILL) takes the whole group, as the table's kill does; SIGTERM goes to the leader
// and the end of the leader ends the rest. Streams send {"event":{"keepalive":{}}} every
// Keepalive-Ping-Interval seconds without output.
//
// Threading: the network thread, like the rest of the process surface (the table's calls must
// come from its executor).

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cctype>
#include <csignal>
#include <cstring>
#include <map>

#include "common/log.h"
#include "common/log_errors.h"
#include "common/text_codec.h"
#include "server/internal/blocking.h"
#include "dialects/e2b/e2b.h"
#include "server/internal/processes.h"

namespace agentbox::server::detail {

// What process.Process needs beyond the table: the `envs` each process was started with (List
// answers the whole config). Per session, by pid; entries go with their process.
class E2bProcesses {
 public:
  struct Meta {
    std::map<std::string, std::string> envs;
    std::chrono::system_clock::time_point started_at;
  };
  void put(const std::string& session, int pid, Meta m) { by_session_[session][pid] = std::move(m); }
  const Meta* find(const std::string& session, int pid, std::chrono::system_clock::time_point t) {
    auto s = by_session_.find(session);
    if (s == by_session_.end()) return nullptr;
    auto it = s->second.find(pid);
    if (it == s->second.end() || it->second.started_at != t) return nullptr;
    return &it->second;
  }
  // Drops the entries of processes the table no longer lists.
  void prune(const std::string& session, const std::vector<sandbox::ProcessInfo>& live) {
    auto s = by_session_.find(session);
    if (s == by_session_.end()) return;
    for (auto it = s->second.begin(); it != s->second.end();) {
      bool found = false;
      for (const auto& p : live) found = found || p.pid == it->first;
      it = found ? std::next(it) : s->second.erase(it);
    }
    if (s->second.empty()) by_session_.erase(s);
  }

 private:
  std::map<std::string, std::map<int, Meta>> by_session_;
};

namespace {

using namespace boost::asio::experimental::awaitable_operators;
using connectrpc::CallKind;
using connectrpc::RpcError;
using sandbox::OutputRecord;
using sandbox::ProcessTable;
namespace rpc = connectrpc;
using RpcCode = connectrpc::Code;

E2bProcesses* registry(Context* ctx) {
  if (!ctx->e2b_processes) ctx->e2b_processes = std::make_shared<E2bProcesses>();
  return ctx->e2b_processes.get();
}

std::unexpected<RpcError> bad(std::string m) {
  return std::unexpected(RpcError::make(RpcCode::kInvalidArgument, std::move(m)));
}

// ---- decoding (proto3 JSON: lowerCamelCase, unknown fields ignored as connect-es does)

std::expected<std::string, RpcError> str_field(const json& o, const char* name, bool required) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) {
    if (required) return bad(std::string("'") + name + "' is required");
    return std::string();
  }
  if (!it->is_string()) return bad(std::string("'") + name + "' must be a string");
  return it->get<std::string>();
}

// A uint32 that proto3 JSON may spell as a number or a decimal string.
std::expected<std::optional<std::int64_t>, RpcError> int_field(const json& o, const char* name,
                                                               std::int64_t lo, std::int64_t hi) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return std::optional<std::int64_t>{};
  std::int64_t v = 0;
  if (it->is_number_integer()) {
    v = it->get<std::int64_t>();
  } else if (it->is_string()) {
    const std::string s = it->get<std::string>();
    bool ok = !s.empty() && s.size() <= 10;
    for (char c : s) ok = ok && c >= '0' && c <= '9';
    if (!ok) return bad(std::string("'") + name + "' must be an integer");
    v = std::stoll(s);
  } else {
    return bad(std::string("'") + name + "' must be an integer");
  }
  if (v < lo || v > hi) {
    return bad(std::string("'") + name + "' must be from " + std::to_string(lo) + " to " +
               std::to_string(hi));
  }
  return std::optional<std::int64_t>(v);
}

const json* object_field(const json& o, const char* name, std::optional<RpcError>* err) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return nullptr;
  if (!it->is_object()) {
    *err = RpcError::make(RpcCode::kInvalidArgument, std::string("'") + name + "' must be an object");
    return nullptr;
  }
  return &*it;
}

// ProcessSelector {pid} | {tag}: the table's ref.
std::expected<std::string, RpcError> selector(const json& msg) {
  std::optional<RpcError> err;
  const json* p = object_field(msg, "process", &err);
  if (err) return std::unexpected(*err);
  if (p == nullptr) return bad("'process' (a selector: {\"pid\"} or {\"tag\"}) is required");
  auto pid = int_field(*p, "pid", 1, 0x7fffffff);
  if (!pid) return std::unexpected(pid.error());
  auto tag = str_field(*p, "tag", false);
  if (!tag) return std::unexpected(tag.error());
  if (*pid && !tag->empty()) return bad("'process' takes a pid or a tag, not both");
  if (*pid) return std::to_string(**pid);
  if (!tag->empty()) return *tag;
  return bad("'process' must name a pid or a tag");
}

std::expected<sandbox::PtySize, RpcError> pty_size(const json& pty) {
  std::optional<RpcError> err;
  const json* size = object_field(pty, "size", &err);
  if (err) return std::unexpected(*err);
  if (size == nullptr) return bad("'pty.size' ({\"cols\",\"rows\"}) is required");
  auto cols = int_field(*size, "cols", 1, 1000);
  if (!cols) return std::unexpected(cols.error());
  auto rows = int_field(*size, "rows", 1, 1000);
  if (!rows) return std::unexpected(rows.error());
  if (!*cols || !*rows) return bad("'pty.size' needs cols and rows (1 to 1000)");
  sandbox::PtySize s;
  s.cols = static_cast<std::uint16_t>(**cols);
  s.rows = static_cast<std::uint16_t>(**rows);
  return s;
}

struct StartReq {
  sandbox::ProcessSpec spec;
  std::map<std::string, std::string> envs;
};

std::expected<StartReq, RpcError> decode_start(const json& msg) {
  StartReq r;
  std::optional<RpcError> err;
  const json* p = object_field(msg, "process", &err);
  if (err) return std::unexpected(*err);
  if (p == nullptr) return bad("'process' ({\"cmd\",\"args\",\"envs\",\"cwd\"}) is required");
  auto cmd = str_field(*p, "cmd", true);
  if (!cmd) return std::unexpected(cmd.error());
  if (cmd->empty()) return bad("'process.cmd' must not be empty");
  r.spec.argv.push_back(*cmd);
  if (auto it = p->find("args"); it != p->end() && !it->is_null()) {
    if (!it->is_array()) return bad("'process.args' must be an array of strings");
    for (const auto& a : *it) {
      if (!a.is_string()) return bad("'process.args' must be an array of strings");
      r.spec.argv.push_back(a.get<std::string>());
    }
  }
  for (const auto& a : r.spec.argv) {
    if (a.find('\0') != std::string::npos) return bad("'process.cmd' and 'args' must not hold NUL");
  }
  if (auto it = p->find("envs"); it != p->end() && !it->is_null()) {
    if (!it->is_object()) return bad("'process.envs' must be an object of strings");
    for (auto e = it->begin(); e != it->end(); ++e) {
      if (!e.value().is_string()) return bad("'process.envs." + e.key() + "' must be a string");
      if (e.key().empty() || e.key().find('=') != std::string::npos ||
          e.key().find('\0') != std::string::npos) {
        return bad("'process.envs' has an invalid name '" + e.key() + "'");
      }
      r.envs[e.key()] = e.value().get<std::string>();
    }
  }
  r.spec.env = r.envs;
  auto cwd = str_field(*p, "cwd", false);
  if (!cwd) return std::unexpected(cwd.error());
  r.spec.cwd = *cwd;  // relative: to the workspace, the sandbox's home (E2B-MCP.md 6)
  auto tag = str_field(msg, "tag", false);
  if (!tag) return std::unexpected(tag.error());
  r.spec.tag = *tag;
  const json* pty = object_field(msg, "pty", &err);
  if (err) return std::unexpected(*err);
  if (pty != nullptr) {
    auto size = pty_size(*pty);
    if (!size) return std::unexpected(size.error());
    r.spec.pty = *size;
  }
  // "stdin": false -> /dev/null (`cat` returns at once); true or absent (SDKs before envd
  // 0.3.0 have no such field) -> a stdin SendInput writes to.
  r.spec.stdin_open = true;
  if (auto it = msg.find("stdin"); it != msg.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("'stdin' must be a boolean");
    r.spec.stdin_open = it->get<bool>();
  }
  return r;
}

// ---- events

json event(const char* kind, json body) {
  json e = json::object();
  e[kind] = std::move(body);
  json out = json::object();
  out["event"] = std::move(e);
  return out;
}

json start_event(int pid) {
  json s = json::object();
  s["pid"] = pid;
  return event("start", std::move(s));
}

json data_event(const OutputRecord& r) {
  const char* stream = r.type == OutputRecord::Type::kStderr ? "stderr"
                       : r.type == OutputRecord::Type::kPty  ? "pty"
                                                             : "stdout";
  json d = json::object();
  d[stream] = base64_encode(r.data);
  return event("data", std::move(d));
}

// Go's ProcessState: "exit status N", or "signal: killed".
json end_event(int exit_code, std::optional<int> signal) {
  json e = json::object();
  if (signal) {
    std::string name = ::strsignal(*signal);
    if (!name.empty()) name[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(name[0])));
    e["exitCode"] = -1;
    e["exited"] = false;
    e["status"] = "signal: " + name;
    e["error"] = "signal: " + name;
  } else {
    e["exitCode"] = exit_code;
    e["exited"] = true;
    e["status"] = "exit status " + std::to_string(exit_code);
    if (exit_code != 0) e["error"] = "exit status " + std::to_string(exit_code);
  }
  return event("end", std::move(e));
}

json keepalive_event() { return event("keepalive", json::object()); }

// ---- the sandbox and its table

struct Procs {
  std::shared_ptr<sandbox::Sandbox> box;
  ProcessTable* table = nullptr;
};

asio::awaitable<std::expected<Procs, RpcError>> procs_of(EnvdCall* env) {
  auto box = co_await envd_sandbox(env);
  if (!box) co_return std::unexpected(rpc::from_error(box.error()));
  Procs p;
  p.box = std::move(*box);
  p.table = p.box->processes();
  if (p.table == nullptr) {
    co_return std::unexpected(RpcError::make(
        RpcCode::kUnimplemented, "processes are not supported by this sandbox's backend"));
  }
  co_return p;
}

// A table error on a selected process: an unknown or ended one is not_found (what upstream
// says once the process is gone; the SDK's kill() answers false to it).
RpcError process_error(const Error& e, const std::string& ref) {
  if (e.code == Code::kNotFound) {
    return RpcError::make(RpcCode::kNotFound, "process " + ref + " not found");
  }
  return rpc::from_error(e);
}

service::Origin e2b_origin(const EnvdCall* env) {
  return service::Origin(env->owner, env->call->ex.req.id, service::Surface::kE2b);
}

// Kills `pid` when its lifetime ends, unless it ended or was replaced by then. Holds nothing of
// the session meanwhile (a lease would keep it from being reaped): at the deadline it takes the
// running box, if the session still has one (a box that went down took its processes along).
asio::awaitable<void> lifetime(Context* ctx, std::string session, session::Caller owner, int pid,
                               std::chrono::system_clock::time_point started,
                               std::chrono::steady_clock::time_point deadline) {
  asio::steady_timer t(co_await asio::this_coro::executor, deadline);
  co_await t.async_wait(kTuple);
  // The running box only: never resumes a session that went down.
  auto box = co_await ctx->svc->sessions.lease_running(
      service::Origin(owner, 0, service::Surface::kE2b), session);
  if (!box || box->processes() == nullptr) co_return;
  auto info = box->processes()->get(std::to_string(pid));
  if (!info || info->started_at != started || info->state != sandbox::ProcessState::kRunning) {
    co_return;
  }
  (void)box->processes()->kill(std::to_string(pid));
}

// Carries the process's output to the stream from `since` until its end (the end event),
// sending keepalives when it is quiet and ending with deadline_exceeded at `deadline`.
// Returns whether the end-of-stream envelope went out (false: the client is gone).
asio::awaitable<bool> pump(rpc::StreamWriter* w, ProcessTable* table, std::string pid,
                           std::optional<std::uint64_t> since, std::chrono::seconds keepalive,
                           std::optional<std::chrono::steady_clock::time_point> deadline,
                           bool* keep) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  for (;;) {
    auto now = std::chrono::steady_clock::now();
    auto wake = now + keepalive;
    if (deadline && *deadline < wake) wake = *deadline;
    timer.expires_at(wake);
    auto follow = table->follow(pid, since);
    auto tick = timer.async_wait(kTuple);
    auto got = co_await (std::move(follow) || std::move(tick));
    if (got.index() == 1) {
      if (deadline && std::chrono::steady_clock::now() >= *deadline) {
        // Ended before the stream says so: a List after deadline_exceeded no longer shows it.
        (void)co_await kill_and_wait(table, pid);
        RpcError e = RpcError::make(RpcCode::kDeadlineExceeded,
                                    "the command's time (Connect-Timeout-Ms) ran out: killed");
        *keep = co_await w->end(std::move(e));
        co_return true;
      }
      if (!co_await w->send(keepalive_event())) co_return false;
      continue;
    }
    auto& batch = std::get<0>(got);
    if (!batch) {
      // Gone from the table (pruned long after its end): nothing more can be told.
      RpcError e = RpcError::make(RpcCode::kNotFound, "process " + pid + " is gone");
      *keep = co_await w->end(std::move(e));
      co_return true;
    }
    // A batch goes out in one write; the end event with the end of the stream.
    for (const auto& r : batch->records) {
      if (r.type == OutputRecord::Type::kExit) {
        w->queue(end_event(r.exit_code, r.signal));
        *keep = co_await w->end();
        co_return true;
      }
      if (!r.data.empty()) w->queue(data_event(r));
    }
    if (!co_await w->flush()) co_return false;
    since = batch->next;
  }
}

// Runs pump() while watching the client: one that leaves ends only the view.
asio::awaitable<bool> stream_process(EnvdCall* env, rpc::StreamWriter* w, ProcessTable* table,
                                     int pid, std::optional<std::uint64_t> since,
                                     const RpcRequest& req,
                                     std::optional<std::chrono::steady_clock::time_point> deadline) {
  Conn* conn = env->call->conn;
  if (!co_await w->send(start_event(pid))) co_return false;
  conn->stream.expires_never();
  bool gone = false;
  bool keep = false;
  auto op = pump(w, table, std::to_string(pid), since, req.keepalive, deadline, &keep) ||
            watch_disconnect(&conn->stream.socket(), &gone);
  auto outcome = co_await std::move(op);
  if (outcome.index() != 0 || gone || !std::get<0>(outcome)) co_return false;
  co_return keep;
}

// ---- the methods

asio::awaitable<bool> start(EnvdCall* env, RpcRequest req) {
  Context* ctx = env->call->ctx;
  auto decoded = decode_start(req.message);
  if (!decoded) co_return co_await reply_rpc_error(env, req.kind, decoded.error());
  auto procs = co_await procs_of(env);
  if (!procs) co_return co_await reply_rpc_error(env, req.kind, procs.error());
  const std::string cwd = decoded->spec.cwd;
  std::map<std::string, std::string> envs = decoded->envs;
  service::ProcTarget target{service::Lease{env->sandbox_id, procs->box}, procs->table};
  auto info = co_await ctx->svc->processes.start(e2b_origin(env), std::move(target),
                                                 std::move(decoded->spec));
  if (!info) {
    RpcError e = rpc::from_error(info.error());
    if (info.error().code == Code::kNotFound && !cwd.empty()) {
      e = RpcError::make(RpcCode::kInvalidArgument, "cwd '" + cwd + "' does not exist");
    }
    co_return co_await reply_rpc_error(env, req.kind, std::move(e));
  }
  registry(ctx)->put(env->sandbox_id, info->pid, {std::move(envs), info->started_at});
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (req.timeout && req.timeout->count() > 0) {
    deadline = std::chrono::steady_clock::now() + *req.timeout;
    auto killer = lifetime(ctx, env->sandbox_id, env->owner, info->pid,
                           info->started_at, *deadline);
    auto executor = co_await asio::this_coro::executor;
    asio::co_spawn(executor, std::move(killer), LogErrors{"e2b process lifetime"});
  }
  rpc::StreamWriter w(env->call);
  std::optional<std::uint64_t> from_start;  // everything it printed
  co_return co_await stream_process(env, &w, procs->table, info->pid, from_start, req, deadline);
}

asio::awaitable<bool> connect_process(EnvdCall* env, RpcRequest req) {
  auto ref = selector(req.message);
  if (!ref) co_return co_await reply_rpc_error(env, req.kind, ref.error());
  auto procs = co_await procs_of(env);
  if (!procs) co_return co_await reply_rpc_error(env, req.kind, procs.error());
  auto info = procs->table->get(*ref);
  if (!info) co_return co_await reply_rpc_error(env, req.kind, process_error(info.error(), *ref));
  rpc::StreamWriter w(env->call);
  if (info->state != sandbox::ProcessState::kRunning) {
    // Ended: its retained exit (upstream keeps them for a late Connect too).
    w.queue(start_event(info->pid));
    w.queue(end_event(info->exit_code.value_or(0), info->signal));
    co_return co_await w.end();
  }
  // Live output from now on (no replay), as upstream.
  const std::string pid = std::to_string(info->pid);
  std::optional<std::uint64_t> since = output_end(procs->table, pid);
  std::optional<std::chrono::steady_clock::time_point> no_deadline;
  co_return co_await stream_process(env, &w, procs->table, info->pid, since, req, no_deadline);
}

json process_config(const sandbox::ProcessInfo& p, const E2bProcesses::Meta* meta) {
  json c = json::object();
  if (!p.argv.empty()) {
    c["cmd"] = p.argv.front();
    c["args"] = std::vector<std::string>(p.argv.begin() + 1, p.argv.end());
  } else {
    c["cmd"] = "/bin/sh";
    c["args"] = std::vector<std::string>{"-c", p.command};
  }
  c["envs"] = meta != nullptr ? json(meta->envs) : json::object();
  if (!p.cwd.empty()) c["cwd"] = p.cwd;
  return c;
}

asio::awaitable<bool> list(EnvdCall* env, RpcRequest req) {
  auto procs = co_await procs_of(env);
  if (!procs) co_return co_await reply_rpc_error(env, req.kind, procs.error());
  E2bProcesses* reg = registry(env->call->ctx);
  auto all = procs->table->list();
  reg->prune(env->sandbox_id, all);
  json arr = json::array();
  for (const auto& p : all) {
    if (p.state != sandbox::ProcessState::kRunning) continue;
    json one = json::object();
    one["config"] = process_config(p, reg->find(env->sandbox_id, p.pid, p.started_at));
    one["pid"] = p.pid;
    if (!p.tag.empty()) one["tag"] = p.tag;
    arr.push_back(std::move(one));
  }
  json out = json::object();
  out["processes"] = std::move(arr);
  co_return co_await send_reply(env->call, rpc::unary_ok(out));
}

asio::awaitable<bool> send_input(EnvdCall* env, RpcRequest req, bool close) {
  auto ref = selector(req.message);
  if (!ref) co_return co_await reply_rpc_error(env, req.kind, ref.error());
  std::string data;
  if (!close) {
    std::optional<RpcError> err;
    const json* input = object_field(req.message, "input", &err);
    if (err) co_return co_await reply_rpc_error(env, req.kind, *err);
    if (input == nullptr) {
      co_return co_await reply_rpc_error(env, req.kind,
                                         bad("'input' ({\"stdin\"} or {\"pty\"}) is required").error());
    }
    auto stdin_b64 = str_field(*input, "stdin", false);
    auto pty_b64 = str_field(*input, "pty", false);
    if (!stdin_b64) co_return co_await reply_rpc_error(env, req.kind, stdin_b64.error());
    if (!pty_b64) co_return co_await reply_rpc_error(env, req.kind, pty_b64.error());
    std::string b64 = stdin_b64->empty() ? *pty_b64 : *stdin_b64;
    auto dec = base64_decode(b64, "'input'");
    if (!dec) co_return co_await reply_rpc_error(env, req.kind, rpc::from_error(dec.error()));
    data = std::move(*dec);
  }
  auto procs = co_await procs_of(env);
  if (!procs) co_return co_await reply_rpc_error(env, req.kind, procs.error());
  auto info = procs->table->get(*ref);
  if (!info || info->state != sandbox::ProcessState::kRunning) {
    Error e = info ? Error::make(Code::kNotFound, "") : info.error();
    co_return co_await reply_rpc_error(env, req.kind, process_error(e, *ref));
  }
  if (auto st = procs->table->write_stdin(*ref, data, close); !st) {
    RpcError e = rpc::from_error(st.error());
    if (st.error().code == Code::kExists || st.error().code == Code::kInvalid) {
      e.code = RpcCode::kFailedPrecondition;  // stdin closed, or started without one
    }
    co_return co_await reply_rpc_error(env, req.kind, std::move(e));
  }
  co_return co_await send_reply(env->call, rpc::unary_ok(json::object()));
}

asio::awaitable<bool> send_signal(EnvdCall* env, RpcRequest req) {
  auto ref = selector(req.message);
  if (!ref) co_return co_await reply_rpc_error(env, req.kind, ref.error());
  int signo = 0;
  const json& s = req.message.contains("signal") ? req.message["signal"] : json();
  if ((s.is_string() && s == "SIGNAL_SIGKILL") || (s.is_number_integer() && s == 9)) {
    signo = SIGKILL;
  } else if ((s.is_string() && s == "SIGNAL_SIGTERM") || (s.is_number_integer() && s == 15)) {
    signo = SIGTERM;
  } else {
    co_return co_await reply_rpc_error(
        env, req.kind, bad("'signal' must be SIGNAL_SIGKILL or SIGNAL_SIGTERM").error());
  }
  auto procs = co_await procs_of(env);
  if (!procs) co_return co_await reply_rpc_error(env, req.kind, procs.error());
  auto info = procs->table->get(*ref);
  if (!info || info->state != sandbox::ProcessState::kRunning) {
    Error e = info ? Error::make(Code::kNotFound, "") : info.error();
    co_return co_await reply_rpc_error(env, req.kind, process_error(e, *ref));
  }
  service::ProcTarget target{service::Lease{env->sandbox_id, procs->box}, procs->table};
  Status st = co_await env->call->ctx->svc->processes.signal(
      e2b_origin(env), std::move(target), std::to_string(info->pid), signo);
  if (!st) co_return co_await reply_rpc_error(env, req.kind, process_error(st.error(), *ref));
  co_return co_await send_reply(env->call, rpc::unary_ok(json::object()));
}

asio::awaitable<bool> update(EnvdCall* env, RpcRequest req) {
  auto ref = selector(req.message);
  if (!ref) co_return co_await reply_rpc_error(env, req.kind, ref.error());
  std::optional<RpcError> err;
  const json* pty = object_field(req.message, "pty", &err);
  if (err) co_return co_await reply_rpc_error(env, req.kind, *err);
  std::optional<sandbox::PtySize> want;
  if (pty != nullptr) {
    auto size = pty_size(*pty);
    if (!size) co_return co_await reply_rpc_error(env, req.kind, size.error());
    want = *size;
  }
  auto procs = co_await procs_of(env);
  if (!procs) co_return co_await reply_rpc_error(env, req.kind, procs.error());
  auto info = procs->table->get(*ref);
  if (!info || info->state != sandbox::ProcessState::kRunning) {
    Error e = info ? Error::make(Code::kNotFound, "") : info.error();
    co_return co_await reply_rpc_error(env, req.kind, process_error(e, *ref));
  }
  if (want) {
    if (auto st = procs->table->resize(*ref, *want); !st) {
      co_return co_await reply_rpc_error(env, req.kind, rpc::from_error(st.error()));
    }
  }
  co_return co_await send_reply(env->call, rpc::unary_ok(json::object()));
}

}  // namespace

asio::awaitable<bool> serve_process(EnvdCall* env, std::string method) {
  const bool stream = method == "Start" || method == "Connect";
  const CallKind want = stream ? CallKind::kServerStream : CallKind::kUnary;
  if (method == "StreamInput") {
    auto kind = rpc::call_kind(header_value(env->call, "Content-Type")).value_or(want);
    RpcError e = RpcError::make(RpcCode::kUnimplemented,
                                "process.Process/StreamInput (client streaming) is not served: "
                                "use SendInput");
    co_return co_await reply_rpc_error(env, kind, std::move(e));
  }
  static constexpr std::string_view kMethods[] = {"Start", "Connect", "List", "SendInput",
                                                  "CloseStdin", "SendSignal", "Update"};
  bool known = false;
  for (auto m : kMethods) known = known || m == method;
  if (!known) {
    auto kind = rpc::call_kind(header_value(env->call, "Content-Type")).value_or(want);
    RpcError e = RpcError::make(RpcCode::kUnimplemented,
                                "process.Process/" + method + " is not a method agentbox serves",
                                404);
    co_return co_await reply_rpc_error(env, kind, std::move(e));
  }
  // A kind mismatch is answered in the kind the client used (read before the body).
  const CallKind sent = rpc::call_kind(header_value(env->call, "Content-Type")).value_or(want);
  bool gone = false;
  auto req = co_await read_rpc(env, want, &gone);
  if (gone) co_return false;
  if (!req) co_return co_await reply_rpc_error(env, sent, req.error());
  if (method == "Start") co_return co_await start(env, std::move(*req));
  if (method == "Connect") co_return co_await connect_process(env, std::move(*req));
  if (method == "List") co_return co_await list(env, std::move(*req));
  if (method == "SendInput") co_return co_await send_input(env, std::move(*req), false);
  if (method == "CloseStdin") co_return co_await send_input(env, std::move(*req), true);
  if (method == "SendSignal") co_return co_await send_signal(env, std::move(*req));
  co_return co_await update(env, std::move(*req));
}

}  // namespace agentbox::server::detail
