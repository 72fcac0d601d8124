#pragma once
// The exec runner (exec.cc), shared by the v1 exec surface, seed 001's /exec, /exec-stream and
// the MCP surface.

#include <memory>
#include <optional>

#include "server/internal/transport.h"

namespace agentbox::server::detail {

asio::awaitable<bool> seed_exec(Call* call);

// A string `command` (argv empty) becomes {shell, "-c", command}; "" shell: left to the
// backend (/bin/sh -c).
void apply_shell(const std::string& shell, std::string* command, std::vector<std::string>* argv);
asio::awaitable<bool> seed_exec_stream(Call* call);

// Runs `spec` in `box` to its end (service::Exec::run), collecting its output (the runner's caps
// apply), while watching the client: a client gone kills the command's tree and gives nullopt.
// Shared by /exec and the MCP surface's exec tool.
asio::awaitable<std::optional<Result<sandbox::ExecResult>>> run_collected(
    Call* call, std::shared_ptr<sandbox::Sandbox> box, std::string session_id,
    sandbox::ExecSpec spec, service::Surface surface);

// run_collected for a caller that is not an HTTP request of its own (the LangBot RPC): `req`
// names the caller for the audit line, and the command's tree is killed when `stop` completes
// first with *gone set (nullopt then). The sink stops taking output once *gone is set.
asio::awaitable<std::optional<Result<sandbox::ExecResult>>> run_collected_until(
    Context* ctx, const Request& req, std::shared_ptr<sandbox::Sandbox> box,
    std::string session_id, sandbox::ExecSpec spec, asio::awaitable<void> stop, bool* gone,
    service::Surface surface);

}  // namespace agentbox::server::detail
