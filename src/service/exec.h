#pragma once
// Exec as an operation (API.md "Exec"; seed 001's /exec; LangBot's box_exec; the MCP exec tool;
// E2B runs through Processes): runs one command in a session's box to its end beside a stop
// signal (the caller gone: the command's whole tree is killed), and emits one "exec" event
// (audit line and metrics) for every command that ran. What was run is recorded, never its
// stdin, env or output.

#include <boost/asio/awaitable.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"
#include "sandbox/sandbox.h"
#include "service/deps.h"
#include "service/origin.h"
#include "service/sessions.h"

namespace agentbox::service {

// The caller is gone: `wait` completes (and sets *gone) when it leaves; a caller that cannot
// leave passes a `wait` that never completes and a flag that stays false.
struct StopSignal {
  asio::awaitable<void> wait;
  bool* gone;
};

// An in-box artifact_dir must lie under the workspace (API.md "Exec"): `/workspace/...` on every
// backend, or the box's own workspace path (the host backend's dir). Relative: fine.
Status check_artifact_dir(const std::string& dir, std::string_view workspace);

class Exec {
 public:
  explicit Exec(Deps deps) : d_(deps) {}

  // Runs `spec` in the leased box. With a sink, output goes to it as it comes (the result's
  // stdout/stderr stay empty); without, it is collected into the result (the caps apply).
  // nullopt: the caller left first (the command was killed). An Error: nothing could run.
  asio::awaitable<std::optional<Result<sandbox::ExecResult>>> run(Origin origin, Lease lease,
                                                                  sandbox::ExecSpec spec,
                                                                  sandbox::OutputSink* sink,
                                                                  StopSignal stop);
  // Leases session `id` first (creating it with the default spec when missing, as the exec
  // routes do), then run().
  asio::awaitable<std::optional<Result<sandbox::ExecResult>>> run(Origin origin, std::string id,
                                                                  sandbox::ExecSpec spec,
                                                                  sandbox::OutputSink* sink,
                                                                  StopSignal stop);

 private:
  void emit(const Origin& origin, const std::string& session, const std::vector<std::string>& argv,
            const std::string& command, const Result<sandbox::ExecResult>& r,
            bool caller_gone) const;

  Deps d_;
};

}  // namespace agentbox::service
