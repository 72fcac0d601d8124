// agentbox exec SESSION [--cwd D] [--env K=V] [--timeout S] [-i] -- CMD...
//
// Streams the command's output live from /exec/stream (NDJSON) to our stdout/stderr, and exits
// with the command's status: its exit code, 128+N when killed by signal N, 124 on timeout (as
// coreutils timeout does).

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/cli.h"

namespace agentbox::cli {
namespace {

using json = nlohmann::json;

// The exec API carries stdin inside the JSON request; keep it to what a request body may hold
// (client.h: the server's exec body cap is kMaxExecBodyBytes).
constexpr std::size_t kMaxStdinBytes = client::kMaxExecStdinBytes;
static_assert(client::kMaxExecStdinBytes < client::kMaxExecBodyBytes);

struct ExitEvent {
  int exit_code = 0;
  std::optional<int> signal;
  bool timed_out = false;
};

// Splits the NDJSON stream into lines and acts on each event as it arrives.
class EventReader {
 public:
  // Returns false to stop the stream (our stdout is gone).
  bool feed(std::string_view chunk) {
    pending_.append(chunk);
    std::size_t start = 0;
    for (;;) {
      std::size_t nl = pending_.find('\n', start);
      if (nl == std::string::npos) break;
      bool go_on = line(std::string_view(pending_).substr(start, nl - start));
      start = nl + 1;
      if (!go_on) return false;
    }
    pending_.erase(0, start);
    return true;
  }
  // A last line without its newline.
  void end() {
    if (!pending_.empty()) (void)line(pending_);
    pending_.clear();
  }

  const std::optional<ExitEvent>& exit() const { return exit_; }
  bool output_closed() const { return output_closed_; }
  const std::string& protocol_error() const { return protocol_error_; }
  // The wire code of protocol_error() ("EUNAVAILABLE"), for the exit code.
  const std::string& protocol_code() const { return protocol_code_; }

 private:
  bool line(std::string_view l) {
    if (l.empty()) return true;
    json ev = json::parse(l, nullptr, /*allow_exceptions=*/false);
    if (ev.is_discarded() || !ev.is_object()) {
      protocol_code_ = "EINTERNAL";
      protocol_error_ = "EINTERNAL: unparsable event in exec stream";
      return true;
    }
    auto type = ev.find("type");
    if (type == ev.end() || !type->is_string()) return true;
    const std::string& t = type->get_ref<const std::string&>();
    if (t == "stdout" || t == "stderr") {
      auto data = ev.find("data");
      if (data == ev.end() || !data->is_string()) return true;
      int fd = t == "stdout" ? STDOUT_FILENO : STDERR_FILENO;
      if (!write_all(fd, data->get_ref<const std::string&>())) {
        // EPIPE (`agentbox exec ... | head`): stop reading, which ends the command.
        output_closed_ = true;
        return false;
      }
    } else if (t == "exit") {
      ExitEvent e;
      if (auto c = ev.find("exit_code"); c != ev.end() && c->is_number_integer()) {
        e.exit_code = c->get<int>();
      }
      if (auto s = ev.find("signal"); s != ev.end() && s->is_number_integer()) {
        e.signal = s->get<int>();
      }
      if (auto to = ev.find("timed_out"); to != ev.end() && to->is_boolean()) {
        e.timed_out = to->get<bool>();
      }
      exit_ = e;
    } else if (t == "error") {
      // The box failed after the stream started: {"type":"error","error":{code,message}}.
      protocol_code_ = "EINTERNAL";
      protocol_error_ = "exec failed";
      auto err = ev.find("error");
      if (err != ev.end() && err->is_object()) {
        auto code = err->find("code");
        auto msg = err->find("message");
        if (code != err->end() && code->is_string()) protocol_code_ = code->get<std::string>();
        protocol_error_ = protocol_code_ + ": " +
                          (msg != err->end() && msg->is_string() ? msg->get<std::string>()
                                                                 : std::string("exec failed"));
      }
    }
    return true;
  }

  std::string pending_;
  std::optional<ExitEvent> exit_;
  bool output_closed_ = false;
  std::string protocol_error_;
  std::string protocol_code_;
};

Result<std::string> read_stdin() {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "read(stdin)");
    if (n == 0) return out;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > kMaxStdinBytes) {
      return fail(Code::kTooBig, "stdin is over " + human_bytes(kMaxStdinBytes) +
                                     "; copy it in with `agentbox cp` instead");
    }
  }
}

}  // namespace

int exec(const Globals& g, const ExecArgs& a) {
  if (a.argv.empty() == a.command.empty()) {
    return usage("exec: give the command after -- (or as -c 'shell command')");
  }
  auto env = parse_pairs(a.env, "--env");
  if (!env) return usage(env.error().message);

  json body = json::object();
  if (!a.argv.empty()) {
    body["argv"] = a.argv;
  } else {
    body["command"] = a.command;
  }
  if (!a.cwd.empty()) body["cwd"] = a.cwd;
  if (!env->empty()) body["env"] = *env;
  if (a.timeout_sec) body["timeout_sec"] = *a.timeout_sec;
  if (a.send_stdin) {
    auto in = read_stdin();
    if (!in) return report(in.error());
    body["stdin"] = std::move(*in);
  }

  // Writes to a closed pipe fail with EPIPE (handled above) instead of killing us silently.
  std::signal(SIGPIPE, SIG_IGN);

  client::ClientOptions opts = g.options();
  // The server enforces the command's timeout; the client only needs to outlast it, since a
  // silent command sends nothing for that long.
  if (a.timeout_sec) {
    auto want = std::chrono::milliseconds(std::int64_t{*a.timeout_sec} * 1000 + 60'000);
    if (want > opts.timeout) opts.timeout = want;
  }
  std::string request = body.dump(-1, ' ', false, json::error_handler_t::replace);
  if (request.size() > client::kMaxExecBodyBytes) {
    // Only stdin can make it this big: bytes JSON must escape (control characters) take up to
    // six bytes each on the wire.
    return report(Error::make(Code::kTooBig, "stdin encodes to a " + human_bytes(request.size()) +
                                                 " request, over the server's limit of " +
                                                 human_bytes(client::kMaxExecBodyBytes) +
                                                 "; copy it in with `agentbox cp` instead"));
  }
  client::Client c(opts);
  EventReader events;
  auto r = c.request_stream("POST", session_target(a.session) + "/exec/stream", request,
                            [&events](std::string_view chunk) { return events.feed(chunk); });
  if (events.output_closed()) return 128 + SIGPIPE;
  if (!r) return report(r.error());
  if (r->status < 200 || r->status >= 300) return report(*r);
  events.end();
  if (!events.exit()) {
    if (!events.protocol_error().empty()) {
      std::cerr << "agentbox: " << events.protocol_error() << std::endl;
      // The stream began with 200; the error came from behind the server (500: unknown code).
      return exit_code_for(events.protocol_code(), 500);
    }
    return report(Error::make(Code::kUnavailable, "exec stream ended without an exit status"));
  }
  const ExitEvent& e = *events.exit();
  if (e.timed_out) {
    std::cerr << "agentbox: ETIMEDOUT: command timed out" << std::endl;
    return kExitTimedOut;
  }
  if (e.signal) return 128 + *e.signal;
  if (e.exit_code < 0 || e.exit_code > 255) {
    std::cerr << "agentbox: EINTERNAL: the command's exit status " << e.exit_code
              << " is not an exit code" << std::endl;
    return kExitServerError;
  }
  return e.exit_code;
}

}  // namespace agentbox::cli
