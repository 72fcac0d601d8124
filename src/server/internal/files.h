#pragma once
// What the native files surface (files.cc) lends the dialects that serve files too.

#include <string>

#include "sandbox/sandbox.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {

// Answers `call` with `file` as a 200 application/octet-stream reply, sent with sendfile(2)
// straight from the page cache (no copy through our memory). `shown` names the file in logs.
// Returns whether the connection may serve another request.
asio::awaitable<bool> send_file(Call* call, sandbox::FileReader file, std::string shown);

}  // namespace agentbox::server::detail
