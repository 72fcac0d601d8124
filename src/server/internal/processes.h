#pragma once
// What the process surface (processes.cc) shares with the MCP surface's process tools.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "sandbox/process_table.h"
#include "service/processes.h"
#include "server/internal/transport.h"
#include "server/websocket.h"

namespace agentbox::server::detail {

// Kills `ref` and everything it started and waits until the table has seen it end
// (service/processes.h).
using service::kill_and_wait;

// The WebSocket options of the server's sockets (ServerOptions ws_*).
WsOptions ws_options(const ServerOptions& o);

// What a dialect changes in a process attach (the LangBot relay).
struct AttachHooks {
  std::string subprotocol;     // selected in the 101 ("" = none)
  bool ignore_binary = false;  // binary frames are dropped, not written to stdin
  // Once upgraded: the socket, e.g. to close it when the dialect's own rules say so.
  std::function<void(std::weak_ptr<WsSession>)> opened;
};

// GET .../processes/{ref}/attach once the process is known: the one attacher (409 EEXIST when
// another holds it), stdin from text frames ("\n" appended), one stdout line per text frame.
// Returns false (the connection was the WebSocket's) unless the reply was an error.
asio::awaitable<bool> attach_to_process(Call* call, std::shared_ptr<sandbox::Sandbox> box,
                                        std::string session, sandbox::ProcessInfo info,
                                        AttachHooks hooks);

// The end of the output `pid` has kept now: where a client that wants only what comes next
// starts following (an attacher in line mode, E2B's Connect).
std::optional<std::uint64_t> output_end(sandbox::ProcessTable* table, const std::string& pid);

}  // namespace agentbox::server::detail
