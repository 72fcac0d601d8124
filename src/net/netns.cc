#include "net/netns.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>

#include <thread>

namespace agentbox::net {
namespace {

Result<UniqueFd> listen_here(const std::string& address, uint16_t port) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, address.c_str(), &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    len = sizeof *s4;
  } else if (inet_pton(AF_INET6, address.c_str(), &s6->sin6_addr) == 1) {
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(port);
    len = sizeof *s6;
  } else {
    return fail(Code::kInvalid, "listen address \"" + address + "\" is not an IP address");
  }
  UniqueFd fd(socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return fail_errno(errno, "socket(proxy listener)");
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const std::string where = address + ":" + std::to_string(port);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return fail_errno(errno, "bind(" + where + ")");
  }
  if (listen(fd.get(), 512) != 0) return fail_errno(errno, "listen(" + where + ")");
  return fd;
}

}  // namespace

Result<UniqueFd> listen_in_netns(int netns_fd, const std::string& address, uint16_t port) {
  Result<UniqueFd> out = fail(Code::kInternal, "listen_in_netns: helper thread did not run");
  // The namespace switch is per thread; doing it on a thread that exits right after keeps every
  // other thread (the io_context's above all) in the daemon's namespace.
  std::thread t([&] {
    if (setns(netns_fd, CLONE_NEWNET) != 0) {
      out = fail_errno(errno, "setns(CLONE_NEWNET)");
      return;
    }
    out = listen_here(address, port);
  });
  t.join();
  return out;
}

Result<UniqueFd> listen_in_netns_of(pid_t pid, const std::string& address, uint16_t port) {
  const std::string path = "/proc/" + std::to_string(pid) + "/ns/net";
  UniqueFd ns(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ns) return fail_errno(errno, "open(" + path + ")");
  return listen_in_netns(ns.get(), address, port);
}

}  // namespace agentbox::net
