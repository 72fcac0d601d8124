// SECURITY.md T6, network mode "none" (the default): the box's own network namespace with only
// `lo` up. Nothing on the host is reachable from it, above all not the host's loopback services
// and agentboxd itself: a connect to 127.0.0.1 lands on the box's own (empty) loopback.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "security/box_fixture.h"

namespace agentbox::security {
namespace {

// A TCP listener on the host: `addr`:<ephemeral port>, accepting nothing (the backlog is enough
// for a connect to succeed, which is what an escape would look like).
class HostListener {
 public:
  explicit HostListener(const char* addr) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    inet_pton(AF_INET, addr, &sa.sin_addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || listen(fd_, 16) != 0) {
      throw std::runtime_error("host listener on " + std::string(addr));
    }
    socklen_t len = sizeof sa;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len);
    port_ = ntohs(sa.sin_port);
  }
  ~HostListener() { close(fd_); }
  std::string port() const { return std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The host's first non-loopback IPv4 address ("" if it has none).
std::string host_ipv4() {
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return "";
  std::string out;
  for (ifaddrs* i = ifs; i != nullptr && out.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
    if (std::string(buf).rfind("127.", 0) != 0) out = buf;
  }
  freeifaddrs(ifs);
  return out;
}

TEST(NetworkTest, HostLoopbackAndTheDaemonAreUnreachable) {
  Box a(shared_daemon(), "t6-none");
  // The daemon's own port, from the host's point of view reachable (sanity: it serves us).
  const std::string hp = shared_daemon().host_port();
  const std::string daemon_port = hp.substr(hp.rfind(':') + 1);
  ASSERT_EQ(hp.substr(0, hp.rfind(':')), "127.0.0.1");
  // From the box: the box's own loopback, where nothing listens.
  EXPECT_EQ(a.probe("connect", {"127.0.0.1", daemon_port}), "DENIED ECONNREFUSED");
  HostListener loopback("127.0.0.1");
  EXPECT_EQ(a.probe("connect", {"127.0.0.1", loopback.port()}), "DENIED ECONNREFUSED");
  // Other loopback addresses are the box's too.
  EXPECT_EQ(a.probe("connect", {"127.0.0.2", loopback.port()}), "DENIED ECONNREFUSED");
  // Anything beyond loopback: no route at all, TCP and UDP.
  HostListener any("0.0.0.0");
  const std::string host_ip = host_ipv4();
  if (!host_ip.empty()) {
    EXPECT_EQ(a.probe("connect", {host_ip, any.port()}), "DENIED ENETUNREACH") << host_ip;
  }
  EXPECT_EQ(a.probe("connect", {"192.0.2.1", "80"}), "DENIED ENETUNREACH");
  EXPECT_EQ(a.probe("udp", {"192.0.2.1", "53"}), "DENIED ENETUNREACH");
  // Only `lo` exists in the box, and it is up.
  auto r = a.sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
  EXPECT_EQ(r.value("stdout", ""), "lo\n") << r.dump();
  // The loopback works inside the box itself (a box-internal server is reachable).
  auto inner = a.exec({"python3", "-c",
                       "import socket\n"
                       "s=socket.socket();s.bind(('127.0.0.1',0));s.listen(1)\n"
                       "c=socket.create_connection(s.getsockname());print('inner ok')\n"});
  EXPECT_EQ(inner.value("stdout", ""), "inner ok\n") << inner.dump();
}

}  // namespace
}  // namespace agentbox::security
