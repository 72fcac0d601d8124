#pragma once
// Starting the runner's children (exec, bg_exec, stdio_start, pty_create): fork + execvpe, each
// child in a process group of its own (pgid = pid) so that a timeout, bg_kill, a close or a
// disconnect kills the whole group, not just the direct child (PROTOCOLS.md 1.4: xbot's does not).

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"

namespace agentbox::runner {

struct SpawnSpec {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH (of `env`) when it has no '/'
  std::vector<std::string> env;   // the child's whole environment, "K=V"
  int cwd_fd = -1;                // the child fchdir()s here (-1: the runner's cwd)
  int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1;  // -1: /dev/null
  // setsid() and make stdin_fd (a pty slave) the controlling terminal.
  bool pty = false;
  // cgroup.procs files (open for writing) the child joins before exec, writing "0" to each
  // (runner/box_limits.h: the box's limits bound it from its first instruction).
  std::vector<int> join_fds;
};

// The child's pid (also its pgid). An exec failure is reported by the parent as kNotFound /
// kAccess ... "exec <argv0>: <why>"; nothing stays behind.
Result<pid_t> spawn(const SpawnSpec& spec);

// The runner's environment plus `extra` ("K=V", later entries win as with Go's exec).
std::vector<std::string> environment_with(const std::vector<std::string>& extra);

// Go's ExitCode(): the exit status, or -1 when a signal ended it.
int exit_code_of(int wait_status);

// waitpid with EINTR retried; the wait status.
int wait_for(pid_t pid);

// SIGKILL to the process group `pgid` (ignoring ESRCH).
void kill_group(pid_t pgid, int sig = 9);

// Reads `out_fd` and `err_fd` (-1: none) until both reach EOF or `deadline`; keeps at most `cap`
// bytes of each (the rest is read and dropped). false on timeout.
bool drain(int out_fd, int err_fd, std::string& out, std::string& err, std::size_t cap,
           std::chrono::steady_clock::time_point deadline);

}  // namespace agentbox::runner
