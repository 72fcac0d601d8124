#pragma once
// The integration fixture: one real agentboxd process ($AGENTBOX_BIN_DIR/agentboxd) on
// 127.0.0.1:0 with a fresh temp data dir and the host backend (override with extra args, e.g.
// {"--backend", "ns"}; seed 001's --port replaces --listen, its --multi-agent the --backend
// default). The constructor returns once the daemon listens (it writes its bound
// address to --ready-file); it throws std::runtime_error, with the daemon's log tail, if the
// daemon exits or does not come up. The destructor stops the daemon (SIGTERM, then SIGKILL)
// and removes the temp dir.
//
// The daemon dies with the test process (PR_SET_PDEATHSIG), so a crashed test leaks nothing.
//
// AGENTBOX_TEST_POOL=N gives the daemon `--pool N` (its warm pool of ns boxes) unless the test
// passes --pool itself; unset, the daemon's default applies.
//
// AGENTBOX_TEST_BACKEND=remote (a daemon given no --backend): the daemon runs with a runner
// user and --default-runner, and the fixture starts a real agentbox-runner for it (workspace
// temp_dir()/runner-ws) and waits until it registered, so the sessions a test creates without
// a backend are remote sessions served by that runner.

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client/client.h"
#include "support/support.h"

namespace agentbox {

// The daemon memory bound the tests hold it to: 64 MiB (the foundation issue). Under
// AddressSanitizer (make test-asan) its quarantine (256 MiB of freed blocks by default) and
// shadow memory come on top, so there the bound only catches growth with the data size.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr long kDaemonRssCapKib = 384 * 1024;
#else
inline constexpr long kDaemonRssCapKib = 64 * 1024;
#endif

// A real agentbox-runner (beside agentboxd) dialing ws://<host_port>/ws/<user> with `token` and
// serving `workspace`, its output to `log_file` ("" = discarded). The destructor stops it
// (SIGTERM, then SIGKILL); it dies with the test process too.
class RunnerProcess {
 public:
  RunnerProcess(const std::string& host_port, const std::string& user, const std::string& token,
                const std::string& workspace, const std::string& log_file = "",
                std::vector<std::string> extra_args = {});
  ~RunnerProcess();
  RunnerProcess(const RunnerProcess&) = delete;
  RunnerProcess& operator=(const RunnerProcess&) = delete;
  pid_t pid() const { return pid_; }
  // As Daemon::stop. Idempotent.
  int stop(int sig = SIGTERM);
  static std::string binary();

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
};

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
  // Where session `id`'s files are on this host: data_dir()/workspaces/<id>, or the runner's
  // workspace (shared by all its sessions) when AGENTBOX_TEST_BACKEND=remote started one.
  std::string workspace_dir(const std::string& id) const;
  // A scratch directory of this fixture, removed with it (for pid files, test inputs, ...).
  std::string temp_dir() const { return temp_.path(); }
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
  // Starts runner_ and waits until the daemon logged its registration (throws otherwise).
  void start_runner(const std::string& user, const std::string& token);

  // First member: removed last, after the destructor stopped the daemon (and on a throwing
  // constructor), with any mount the daemon left beneath it detached first.
  testing::TempDir temp_{"agentbox-it"};
  std::string data_dir_;
  std::string ready_file_;
  std::string log_file_;
  std::string host_port_;
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
  std::unique_ptr<RunnerProcess> runner_;  // AGENTBOX_TEST_BACKEND=remote
};

// A bare TCP connection to the daemon, for what a well-behaved client never sends (malformed
// HTTP, oversized headers, a body cut off mid-way, a client that vanishes mid-command).
class RawConnection {
 public:
  explicit RawConnection(const std::string& host_port);  // throws std::runtime_error
  ~RawConnection();
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool send(std::string_view bytes);  // false once the peer is gone
  // One HTTP response: its header and a Content-Length body ("" on timeout or EOF first).
  std::string read_response(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // Everything until the peer closes or `timeout` passes.
  std::string read_until_close(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  void close();

 private:
  int fd_ = -1;
  std::string pending_;  // bytes read past the last response (pipelined replies)
};

// The status code of a raw HTTP response ("HTTP/1.1 404 Not Found\r\n..."), -1 if none.
int http_status_of(std::string_view raw_response);

// Whether process `pid` is alive (a zombie counts as dead).
bool process_alive(pid_t pid);

}  // namespace agentbox
