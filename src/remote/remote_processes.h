#pragma once
// Commands of a `remote` session (remote_backend.h) as sandbox::Processes, over version 2 of the
// runner protocol (docs/runner-protocol.md "Process streams"): a command is a stdio_start stream
// (stdout and stderr pushed apart, stdin written with stdio_write, closed with `eof`) or a
// pty_create stream, signalled with stdio_signal. The Process handed back has local fds (pipes;
// a socketpair standing in for a pty master) bridged to that stream on the caller's executor, so
// the shared exec runner (sandbox/exec_runner.h: streaming exec, timeouts, a client that leaves)
// and the shared process table (sandbox/process_table.h: start/list/signal/stdin/output/attach)
// work on a runner as they do on every backend.
//
// - Output pushed by the runner is written to the pipes in order; the exit push completes
//   Process::wait() only once all of it is in the pipes (and they are closed), so nothing
//   printed before the exit is lost.
// - kill_tree() and signal() send stdio_signal (group / leader) and do not wait; the runner
//   pushes the exit. resize_pty() sends pty_resize.
// - The runner disconnecting ends the command (the runner kills every child on a disconnect,
//   PROTOCOLS.md 1.4): wait() completes as killed by SIGKILL and lost() says why.
// - Destroying the Process closes the stream on the runner (stdio_close / pty_close), which
//   forgets it.
//
// Threading: launch_remote() and the Process's calls run on one executor (the daemon's network
// thread, as process_table.h requires); the runner's pushes are posted to it.

#include <boost/asio/awaitable.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "sandbox/process_table.h"
#include "remote/runner_hub.h"

namespace agentbox::remote {

struct RemoteLaunchSpec {
  std::vector<std::string> argv;  // argv[0] the program (the runner looks it up in PATH)
  std::vector<std::string> env;   // "K=V", added to the runner's environment
  std::string dir;                // the runner's absolute path ("" = its workspace)
  bool with_stdin = false;        // else stdin is closed at once (EOF)
  std::optional<sandbox::PtySize> pty;
  // The session's box and the limits the runner enforces on it (sent only when set).
  proto::BoxLimits limits;
};

// What a launched remote command reports besides its Process.
class RemoteStreamState {
 public:
  virtual ~RemoteStreamState() = default;
  // Why the command ended without its exit (the runner disconnected); "" otherwise.
  virtual std::string lost() const = 0;
};

struct RemoteLaunched {
  sandbox::Launched launched;
  std::shared_ptr<RemoteStreamState> state;
};

// Starts `spec` on `conn` (which must speak version 2: ENOTSUP otherwise). Errors: the
// runner's (EIO "start process: ...", ...), EUNAVAILABLE when it is not connected.
boost::asio::awaitable<Result<RemoteLaunched>> launch_remote(std::shared_ptr<RunnerConn> conn,
                                                             RemoteLaunchSpec spec);

}  // namespace agentbox::remote
