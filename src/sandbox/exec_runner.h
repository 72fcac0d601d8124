#pragma once
// The exec runner shared by every backend: given a started Process (its pipe ends, a way to wait
// for its leader and to kill its tree), feeds stdin, collects or streams stdout/stderr under a
// byte cap, enforces the timeout and measures the duration. Everything is asynchronous on the
// caller's executor: no thread per command, so 100 long-running execs cost 100 coroutines and
// ~300 fds, not 100 threads.
//
// Lifecycle of one run:
//   1. stdin_data is written (asynchronously, in pieces) then stdin is closed; a command that
//      exits or closes stdin early just ends the writing (EPIPE is expected, never a SIGPIPE).
//   2. stdout and stderr are read concurrently; per stream at most max_output_bytes are kept (or
//      forwarded to the sink), the rest is read and discarded and *_truncated is set, so the
//      command never blocks on a full pipe.
//   3. When the leader exits, what is already buffered in the pipes is drained (bounded) and the
//      run finishes WITHOUT waiting for EOF: a background child (`sleep 30 &`) that inherited the
//      pipes must not hold the reply. The pipes are then closed.
//   4. On timeout the whole tree is killed (Process::kill_tree): timed_out, exit_code -1, signal 9,
//      killed_by kTimeout (the backend names the other causes: it knows its limits).
//   5. A sink returning false (consumer gone) kills the tree too; the run then finishes as in 3.
//   6. So does cancelling the awaiting coroutine (any cancellation type reaching its
//      cancellation slot, e.g. the losing side of `a || b`: the client went away while the
//      command printed nothing). The run still completes, with the killed result; it does not
//      throw operation_aborted.

#include <boost/asio/awaitable.hpp>
#include <boost/asio/this_coro.hpp>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "sandbox/process.h"
#include "sandbox/sandbox.h"

namespace agentbox::sandbox {

struct RunOptions {
  // <= 0 means no deadline (callers validate and default it; see ExecSpec).
  std::chrono::milliseconds timeout = kDefaultExecTimeout;
  std::size_t max_output_bytes = kDefaultMaxOutputBytes;  // per stream
  std::string stdin_data;  // ignored when the process has no stdin pipe
};

// Runs `p` to completion (see above) and returns its result. With a sink, output goes to the
// sink (one call at a time, in order; stdout_data/stderr_data stay empty) and the caps still
// apply to what is forwarded. The sink must bound its own waits (e.g. a socket write timeout):
// the run cannot finish while a sink call is pending.
//
// Internally the run is serialised on a strand of the caller's executor, so a multi-threaded
// io_context is fine. Cancellation (6) does not abandon the run midway: it kills the command and
// the run ends as the command does, so `sink` is never called after the returned awaitable
// completed. `sink` must outlive that completion. artifacts stay empty: the backend fills them.
boost::asio::awaitable<ExecResult> run_process(std::unique_ptr<Process> p, RunOptions opts,
                                               OutputSink* sink);

// Awaits `op` with the caller's throw-on-cancellation switched off, then restores it. For an
// exec: cancellation (the client went away) kills the command inside run_process, and must not
// abandon the clean-up after it (exec cgroup, process bookkeeping) midway.
template <typename T>
boost::asio::awaitable<T> without_throw_on_cancel(boost::asio::awaitable<T> op) {
  const bool throw_if_cancelled = co_await boost::asio::this_coro::throw_if_cancelled();
  co_await boost::asio::this_coro::throw_if_cancelled(false);
  T r = co_await std::move(op);
  co_await boost::asio::this_coro::throw_if_cancelled(throw_if_cancelled);
  co_return r;
}

}  // namespace agentbox::sandbox
