#pragma once
// agentbox-runner: dials agentboxd's (or xbot's) /ws/{user}, registers, and serves every request
// of PROTOCOLS.md 1.3 on its own machine, in its workspace, until stopped; reconnects with
// back-off 1 s -> 60 s plus jitter [0, delay/4), starting again at 1 s after a registration that
// succeeded (xbot's never resets). On every disconnect it kills the process groups of all its
// children (exec, bg, stdio, pty) and forgets them.
//
// Threads: one I/O thread (Boost.Asio: the WebSocket, its one writer) plus a thread per request
// in flight (file I/O, waiting on a child), per running child's output reader and per stream's
// input writer; replies and pushes go through one outbox to the writer. Pushes block when the
// outbox holds more than 4 MiB (backpressure on a child's output); replies never wait.

#include <chrono>
#include <string>

namespace agentbox::runner {

struct RunnerOptions {
  std::string server;  // ws[s]://host[:port]/ws/<user>
  std::string token;
  std::string workspace;  // must exist
  std::string user_id;    // default: the last path segment of `server`
  std::string ca_file;    // an extra CA for wss (the system CAs are always trusted)
  std::chrono::milliseconds backoff_base{1000};
  std::chrono::milliseconds backoff_max{60000};
  // The version said in `register` (docs/runner-protocol.md); lower only to test older peers.
  int protocol_version = 3;  // proto::kProtocolVersion
};

// Runs until SIGINT/SIGTERM; the process exit code (2: bad options).
int run(const RunnerOptions& opts);

}  // namespace agentbox::runner
