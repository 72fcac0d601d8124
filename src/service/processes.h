#pragma once
// Processes as operations (API.md "Processes and terminals"; LangBot's managed processes; E2B's
// process.Process; the MCP process tools): start (one-shot or managed), get, list, kill, signal,
// resize, and the supervision of managed processes across the session's boxes: their specs are
// part of the session's state, and every box the session gets (a resume by any surface or by the
// daemon, a daemon restart) starts them again. That revival lives here, not in a surface: it
// works with no HTTP server built.
//
// Threading: a session's ProcessTable is driven from the network loop (sandbox/process_table.h);
// call these from a coroutine on Deps::ioc.

#include <boost/asio/awaitable.hpp>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "sandbox/process_table.h"
#include "service/deps.h"
#include "service/origin.h"
#include "service/sessions.h"
#include "session/events.h"

namespace agentbox::service {

// A session's process table, with the lease that keeps its sandbox alive while it is used.
struct ProcTarget {
  Lease lease;
  sandbox::ProcessTable* table = nullptr;
};

class Processes {
 public:
  explicit Processes(Deps deps) : d_(deps) {}

  // The table of session `id` (made first when `create`): ENOTSUP naming the session when its
  // backend has none.
  asio::awaitable<Result<ProcTarget>> target(Origin origin, std::string id, bool create);

  // Starts a process (emits "process.start"). A managed one (spec.restart other than kNever) is
  // recorded in the session's state before it runs (a crash between the two brings it back
  // rather than losing it) and leaves the state when its supervision ends for good.
  asio::awaitable<Result<sandbox::ProcessInfo>> start(Origin origin, ProcTarget target,
                                                      sandbox::ProcessSpec spec);
  // table->get(ref), but a tagged process being launched right now (a managed one coming back
  // after a resume or restart) is waited for, up to 10 s, rather than answered ENOENT.
  asio::awaitable<Result<sandbox::ProcessInfo>> get(ProcTarget target, std::string ref);
  // Kills `ref` and everything it started, waits (a few seconds at most) until the table has
  // seen it end, and returns its final state (emits "process.kill").
  asio::awaitable<Result<sandbox::ProcessInfo>> kill(Origin origin, ProcTarget target,
                                                     std::string ref);

  // Sends `signo` to `ref` (SIGKILL: kills its whole tree); emits "process.signal".
  asio::awaitable<Status> signal(Origin origin, ProcTarget target, std::string ref, int signo);

  // The session manager's kResumed events: the session's managed processes start in its new
  // box. Subscribe this once (Services does); any thread.
  void on_session_event(const session::SessionEvent& ev);
  // Once, when the daemon starts serving: resumes the sessions that have managed processes.
  void resume_managed_sessions();

 private:
  asio::awaitable<void> start_managed(std::string session);
  sandbox::ProcessTable::ExitCallback managed_hook(std::string session, std::string key);
  void emit_start(const Origin& origin, const std::string& session,
                  const sandbox::ProcessInfo& p) const;

  Deps d_;
};

// The same kill-and-wait on a table the caller already holds (E2B's stream ends).
asio::awaitable<Result<sandbox::ProcessInfo>> kill_and_wait(sandbox::ProcessTable* table,
                                                            std::string ref);
// The get-or-wait of Processes::get on a table the caller already holds.
asio::awaitable<Result<sandbox::ProcessInfo>> get_settled(sandbox::ProcessTable* table,
                                                          std::string ref);

}  // namespace agentbox::service
