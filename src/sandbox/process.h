#pragma once
// A started command, as the shared exec runner sees it: the daemon's ends of its stdio pipes,
// a way to wait for it and a way to kill everything it started. Each backend launches its
// commands its own way (host: posix fork/exec; ns: the box init forks them) and hands the
// runner a Process; run_process() (exec_runner.h) does the rest for all of them.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <optional>

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
};

}  // namespace agentbox::sandbox
