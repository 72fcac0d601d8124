// agentbox shell | attach: a process's terminal (or its line-mode stdio) over a WebSocket
// (API.md "Processes and terminals": GET /v1/sessions/{id}/pty and .../processes/{ref}/attach).
//
// On a terminal our stdin goes raw (every key, ^C included, goes to the box), SIGWINCH becomes a
// resize message, and the terminal is restored however the socket ends. The exit code is the
// process's, from the close reason ("exit N", "signal N" -> 128+N).

#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "client/websocket.h"

namespace agentbox::cli {
namespace {

using json = nlohmann::json;

// Ctrl-] leaves an attached terminal without ending its process (as telnet's escape).
constexpr char kDetachKey = '\x1d';
// ^D: what a terminal sends for "end of input". A shell whose input is not a terminal gets it
// when that input ends, so `echo 'make test' | agentbox shell S` ends like `| sh` would. A ^D
// that arrives while the shell runs a command (the terminal then in canonical mode) can be lost
// to the line editor, so it is sent again each time the terminal has been quiet for a second,
// until the process ends (a bounded number of times).
constexpr char kEndOfInput = '\x04';
constexpr auto kEndOfInputQuiet = std::chrono::seconds(1);
constexpr int kEndOfInputTries = 60;

// Raw mode on `fd` while alive, if it is a terminal: bytes as typed, no echo, no signals from
// keys. The destructor (and restore()) put back what was there.
class RawTerminal {
 public:
  explicit RawTerminal(int fd) : fd_(fd) {
    if (::isatty(fd) != 1 || ::tcgetattr(fd, &saved_) != 0) return;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    active_ = ::tcsetattr(fd, TCSANOW, &raw) == 0;
  }
  ~RawTerminal() { restore(); }
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;
  void restore() {
    if (active_) ::tcsetattr(fd_, TCSANOW, &saved_);
    active_ = false;
  }
  bool active() const { return active_; }

 private:
  int fd_;
  termios saved_{};
  bool active_ = false;
};

struct Size {
  int cols = 80;
  int rows = 24;
};

// The size of our terminal (stdin's, else stdout's); nullopt when neither is one.
std::optional<Size> tty_size() {
  winsize ws{};
  for (int fd : {STDIN_FILENO, STDOUT_FILENO}) {
    if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
      return Size{ws.ws_col, ws.ws_row};
    }
  }
  return std::nullopt;
}

std::string resize_message(Size s) {
  return json{{"type", "resize"}, {"cols", s.cols}, {"rows", s.rows}}.dump();
}

// How the run ended, beyond what the socket says.
struct Outcome {
  bool detached = false;     // the user left (Ctrl-]): exit 0
  int signal = 0;            // we were told to end (SIGTERM, SIGHUP, ...): 128+N
  bool output_gone = false;  // our stdout closed: 128+SIGPIPE
};

int exit_code(const client::WsEnd& end, const Outcome& o) {
  if (o.output_gone) return 128 + SIGPIPE;
  if (o.signal != 0) return 128 + o.signal;
  if (o.detached) {
    std::cerr << "agentbox: detached" << std::endl;
    return kExitOk;
  }
  if (end.closed) {
    if (auto code = exit_code_of_close(end.reason)) return *code;
    // Not a process end: the server going away (1001), a frame it refused (1008), ...
    std::cerr << "agentbox: EUNAVAILABLE: the server closed the connection (" << end.code
              << (end.reason.empty() ? "" : ": " + end.reason) << ")" << std::endl;
    return kExitUnreachable;
  }
  if (end.error) return report(*end.error);
  return report(Error::make(Code::kUnavailable, "the connection ended without a close frame"));
}

// Signals that end us: the socket is closed first (so the terminal is restored and, for
// `shell`, the process ends with it).
const std::vector<int> kEndSignals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// A pty process's terminal on an open socket: our stdin -> binary frames, binary frames -> our
// stdout, SIGWINCH -> resize. `own`: the process is ours (shell): the end of a non-terminal
// stdin is sent as ^D. `detach_key`: Ctrl-] leaves (attach).
int run_terminal(client::WebSocket& ws, bool own, bool detach_key, bool send_size) {
  std::signal(SIGPIPE, SIG_IGN);
  RawTerminal raw(STDIN_FILENO);
  const bool tty = raw.active();
  if (send_size) {
    if (auto s = tty_size()) ws.send(resize_message(*s), false);
  }
  Outcome o;
  using Clock = std::chrono::steady_clock;
  Clock::time_point last_output = Clock::now();
  int eof_tries = 0;  // ^Ds sent since our stdin ended (0: it has not)
  client::WebSocket::Handlers h;
  h.on_message = [&](client::WsMessage m) {
    last_output = Clock::now();
    if (o.output_gone) return;
    if (!write_all(STDOUT_FILENO, m.data)) {
      o.output_gone = true;
      ws.close(1000, "client output closed");
    }
  };
  h.input_fd = STDIN_FILENO;
  h.on_input = [&](std::string_view in) {
    if (in.empty()) {
      if (own && !tty) {
        ws.send(std::string(1, kEndOfInput), true);
        eof_tries = 1;
      }
      return;
    }
    if (detach_key && tty) {
      if (auto k = in.find(kDetachKey); k != std::string_view::npos) {
        if (k > 0) ws.send(std::string(in.substr(0, k)), true);
        o.detached = true;
        ws.close(1000, "detach");
        return;
      }
    }
    ws.send(std::string(in), true);
  };
  if (own && !tty) {
    h.tick_interval = std::chrono::milliseconds(250);
    h.on_tick = [&] {
      if (eof_tries == 0 || eof_tries >= kEndOfInputTries) return;
      if (Clock::now() - last_output < kEndOfInputQuiet) return;
      ws.send(std::string(1, kEndOfInput), true);
      last_output = Clock::now();  // wait for another quiet second before the next
      ++eof_tries;
    };
  }
  h.signals = kEndSignals;
  h.signals.push_back(SIGWINCH);
  h.on_signal = [&](int signo) {
    if (signo == SIGWINCH) {
      if (auto s = tty_size()) ws.send(resize_message(*s), false);
      return;
    }
    o.signal = signo;
    ws.close(1000, "client ended");
  };
  client::WsEnd end = ws.run(std::move(h));
  raw.restore();
  return exit_code(end, o);
}

// A process without a pty in line mode: each line of our stdin is one text frame (without its
// newline), each frame one line of our stdout. Stays attached after our stdin ends, until the
// process ends or a signal (^C) detaches.
int run_lines(client::WebSocket& ws) {
  std::signal(SIGPIPE, SIG_IGN);
  Outcome o;
  std::string pending;
  client::WebSocket::Handlers h;
  h.on_message = [&](client::WsMessage m) {
    if (o.output_gone) return;
    m.data += '\n';
    if (!write_all(STDOUT_FILENO, m.data)) {
      o.output_gone = true;
      ws.close(1000, "client output closed");
    }
  };
  h.input_fd = STDIN_FILENO;
  h.on_input = [&](std::string_view in) {
    if (in.empty()) {  // a last line without its newline is still a line
      if (!pending.empty()) ws.send(std::move(pending), false);
      pending.clear();
      return;
    }
    pending.append(in);
    std::size_t start = 0;
    for (std::size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      ws.send(pending.substr(start, nl - start), false);
    }
    pending.erase(0, start);
  };
  h.signals = kEndSignals;
  h.on_signal = [&](int signo) {
    o.signal = signo;
    ws.close(1000, "detach");
  };
  client::WsEnd end = ws.run(std::move(h));
  return exit_code(end, o);
}

bool upgraded(const client::Response& r) {
  return r.status == 101;
}

}  // namespace

int shell(const Globals& g, const std::string& session, const std::vector<std::string>& argv) {
  Size size = tty_size().value_or(Size{});
  std::string target = session_target(session) + "/pty?cols=" + std::to_string(size.cols) +
                       "&rows=" + std::to_string(size.rows);
  if (!argv.empty()) target += "&command=" + client::url_encode(shell_join(argv));
  client::WebSocket ws(g.options());
  auto r = ws.connect(target);
  if (!r) return report(r.error());
  if (!upgraded(*r)) return report(*r);
  return run_terminal(ws, /*own=*/true, /*detach_key=*/false, /*send_size=*/false);
}

int attach(const Globals& g, const std::string& session, const std::string& ref) {
  // The process first: a pty is a terminal, anything else line mode.
  client::Client c(g.options());
  auto p = c.request("GET", process_target(session, ref));
  if (!p) return report(p.error());
  if (p->status < 200 || p->status >= 300) return report(*p);
  json info = json::parse(p->body, nullptr, /*allow_exceptions=*/false);
  if (!info.is_object()) {
    return report(Error::make(Code::kInternal, "server reply is not a process object"));
  }
  auto pty = info.find("pty");
  const bool is_pty = pty != info.end() && pty->is_object();
  client::WebSocket ws(g.options());
  auto r = ws.connect(process_target(session, ref) + "/attach");
  if (!r) return report(r.error());
  if (!upgraded(*r)) return report(*r);
  if (is_pty) return run_terminal(ws, /*own=*/false, /*detach_key=*/true, /*send_size=*/true);
  return run_lines(ws);
}

}  // namespace agentbox::cli
