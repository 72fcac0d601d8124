#pragma once
// The exec runner (exec.cc), shared by the v1 exec surface and seed 001's /exec, /exec-stream.

#include "server/internal/transport.h"

namespace agentbox::server::detail {

asio::awaitable<bool> seed_exec(Call* call);
asio::awaitable<bool> seed_exec_stream(Call* call);

}  // namespace agentbox::server::detail
