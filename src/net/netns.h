#pragma once
// Sockets inside another network namespace: the proxy's listener is opened in the box's netns
// (so the box reaches it on its own loopback) while the daemon serves it from the host side.

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/error.h"
#include "common/unique_fd.h"

namespace agentbox::net {

// The proxy's address inside a box (API.md "Network").
inline constexpr char kProxyAddress[] = "127.0.0.1";
inline constexpr uint16_t kProxyPort = 3128;

// A TCP socket bound to `address`:`port` and listening, created in the network namespace `netns`
// (an fd of /proc/<pid>/ns/net). setns(2) runs on a short-lived thread of its own, so no thread
// of the caller changes namespace. Needs CAP_SYS_ADMIN over that namespace. The fd is
// O_CLOEXEC and non-blocking.
Result<UniqueFd> listen_in_netns(int netns_fd, const std::string& address, uint16_t port);
// The same for the network namespace of process `pid`.
Result<UniqueFd> listen_in_netns_of(pid_t pid, const std::string& address, uint16_t port);

}  // namespace agentbox::net
