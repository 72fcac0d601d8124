#pragma once
// The integration fixture: one real agentboxd process ($AGENTBOX_BIN_DIR/agentboxd) on
// 127.0.0.1:0 with a fresh temp data dir and the host backend (override with extra args, e.g.
// {"--backend", "ns"}). The constructor returns once the daemon listens (it writes its bound
// address to --ready-file); it throws std::runtime_error, with the daemon's log tail, if the
// daemon exits or does not come up. The destructor stops the daemon (SIGTERM, then SIGKILL)
// and removes the temp dir.
//
// The daemon dies with the test process (PR_SET_PDEATHSIG), so a crashed test leaks nothing.

#include <sys/types.h>

#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include "client/client.h"

namespace agentbox {

class Daemon {
 public:
  explicit Daemon(std::vector<std::string> extra_args = {});
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // "http://127.0.0.1:PORT".
  std::string url() const;
  // "127.0.0.1:PORT".
  std::string host_port() const { return host_port_; }
  // The --data-dir the daemon runs with (workspaces are under data_dir()/workspaces/<id>).
  std::string data_dir() const { return data_dir_; }
  // A scratch directory of this fixture, removed with it (for pid files, test inputs, ...).
  std::string temp_dir() const { return temp_dir_; }
  pid_t pid() const { return pid_; }
  // Client options for this daemon; `token` is sent as the bearer token when not empty.
  client::ClientOptions options(std::string token = "") const;

  // Sends `sig` and waits for the daemon to exit (SIGKILL after 15 s). Returns its exit status:
  // the exit code, or 128+N when it died of signal N. Idempotent: later calls return the same.
  int stop(int sig = SIGTERM);
  bool running() const { return !exit_status_.has_value(); }

  // Everything the daemon wrote to stdout/stderr so far.
  std::string log() const;

  // Runs agentboxd with exactly `args` (no defaults added) to completion, for flags the daemon
  // must refuse. Returns the exit status (as stop()) and fills `output` with its stdout+stderr.
  // Kills it and returns -1 if it is still running after `timeout_sec`.
  static int run_to_exit(const std::vector<std::string>& args, std::string* output,
                         int timeout_sec = 15);

  // Path of the agentboxd binary under test.
  static std::string binary();

 private:
  std::string temp_dir_;
  std::string data_dir_;
  std::string ready_file_;
  std::string log_file_;
  std::string host_port_;
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
};

}  // namespace agentbox
