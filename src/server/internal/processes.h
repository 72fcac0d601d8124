#pragma once
// What the process surface (processes.cc) shares with the MCP surface's process tools.

#include <cstdint>
#include <optional>
#include <string>

#include "sandbox/process_table.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {

// Kills `ref` and everything it started, then waits (at most a few seconds) until the table has
// seen it end, and returns its final state. The wait goes by pid: a tag is free for a new process
// once this one ended.
asio::awaitable<Result<sandbox::ProcessInfo>> kill_and_wait(sandbox::ProcessTable* table,
                                                             std::string ref);

// The end of the output `pid` has kept now: where a client that wants only what comes next
// starts following (an attacher in line mode, E2B's Connect).
std::optional<std::uint64_t> output_end(sandbox::ProcessTable* table, const std::string& pid);

}  // namespace agentbox::server::detail
