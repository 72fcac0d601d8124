#pragma once
// A started command, as the shared exec runner sees it: the daemon's ends of its stdio pipes,
// a way to wait for it and a way to kill everything it started. Each backend launches its
// commands its own way (host: posix fork/exec; ns: the box init forks them) and hands the
// runner a Process; run_process() (exec_runner.h) does the rest for all of them.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <cstdint>
#include <optional>

#include "common/error.h"
#include "common/unique_fd.h"

namespace agentbox::sandbox {

struct ExitStatus {
  int exit_code = 0;           // 128+N when killed by signal N
  std::optional<int> signal;
};

class Process {
 public:
  virtual ~Process() = default;
  // Daemon ends, O_CLOEXEC; the runner makes them non-blocking and takes them over.
  UniqueFd stdin_fd;  // invalid when the command gets /dev/null
  UniqueFd stdout_fd;
  UniqueFd stderr_fd;

  // Completes when the command's leader has exited. Called once.
  virtual boost::asio::awaitable<ExitStatus> wait() = 0;
  // SIGKILL to the leader and everything it started (process group, cgroup, ...). Idempotent;
  // safe to call after the leader exited.
  virtual void kill_tree() = 0;

  // Sends `signo` to the leader while it runs (a no-op once it has exited). Backends that
  // support processes (process_table.h) implement it; the exec runner never calls it.
  virtual Status signal(int signo) {
    (void)signo;
    return fail(Code::kInternal, "signal: not supported for this process");
  }
  // Sets the terminal size of a pty process whose terminal is not the Launched::pty_master the
  // table holds (the remote backend's is on the runner's machine). nullopt: the table sets it
  // with TIOCSWINSZ on pty_master, as for every local backend.
  virtual std::optional<Status> resize_pty(std::uint16_t cols, std::uint16_t rows) {
    (void)cols;
    (void)rows;
    return std::nullopt;
  }
  // After wait() completed and the tree was killed: releases what the backend kept for the
  // command (the ns backend's per-command cgroup). Called once, by the process table.
  virtual boost::asio::awaitable<void> release() { co_return; }
};

}  // namespace agentbox::sandbox
