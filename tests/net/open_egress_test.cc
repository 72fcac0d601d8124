// Network mode "open" (net/open_egress.h) without a whole box: the test binary runs in a network
// namespace of its own (its "host": the nftables table, ip_forward and the veths stay in it), a
// "box" is a child process in a further network namespace, and box-side commands run as an
// unprivileged uid (the session user has no capabilities).
#include "net/open_egress.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "net/net_fixture.h"

namespace agentbox::net::testing {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kBoxUid = 65534;

class OwnNetns : public ::testing::Environment {
 public:
  void SetUp() override {
    ASSERT_EQ(unshare(CLONE_NEWNET), 0) << strerror(errno);
    UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    ifreq ifr{};
    strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    ASSERT_EQ(ioctl(s.get(), SIOCGIFFLAGS, &ifr), 0);
    ifr.ifr_flags |= IFF_UP;
    ASSERT_EQ(ioctl(s.get(), SIOCSIFFLAGS, &ifr), 0);
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new OwnNetns);

// A process in a network namespace of its own, as a box's init would be; killed at the end.
class FakeBox {
 public:
  FakeBox() {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (unshare(CLONE_NEWNET) != 0) _exit(1);
      (void)!write(p[1], "x", 1);
      for (;;) pause();
    }
    close(p[1]);
    char c;
    (void)!read(p[0], &c, 1);
    close(p[0]);
    ns_ = UniqueFd(open(("/proc/" + std::to_string(pid_) + "/ns/net").c_str(), O_RDONLY));
  }
  ~FakeBox() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  int netns() const { return ns_.get(); }
  std::string in_box(const std::vector<std::string>& argv) {
    auto r = run_in_netns(ns_.get(), argv, 0);
    return r.out + r.err;
  }
  // What the session user sees connecting to host:port (TCP, or UDP send+recv).
  std::string probe(const std::string& kind, const std::string& host, const std::string& port) {
    const std::string py =
        "import socket,errno,sys\n"
        "try:\n"
        "  if sys.argv[1]=='udp':\n"
        "    s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(3)\n"
        "    s.connect((sys.argv[2],int(sys.argv[3]))); s.send(b'x'); s.recv(10); print('REPLY')\n"
        "  else:\n"
        "    socket.create_connection((sys.argv[2],int(sys.argv[3])),timeout=3); "
        "print('CONNECTED')\n"
        "except socket.timeout: print('TIMEOUT')\n"
        "except OSError as e: print(errno.errorcode.get(e.errno,str(e.errno)))\n";
    auto r = run_in_netns(ns_.get(), {"python3", "-c", py, kind, host, port}, kBoxUid);
    return r.out.empty() ? r.err : r.out.substr(0, r.out.size() - 1);
  }

 private:
  pid_t pid_ = -1;
  UniqueFd ns_;
};

std::string read_file(const std::string& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(OpenEgressTest, BoxGetsAFilteredRouteOutAndTheHostItsTable) {
  NetworkConfig cfg;
  FakeBox box;
  auto eg = OpenEgress::start(box.pid(), cfg);
  ASSERT_TRUE(eg) << eg.error().message;
  EXPECT_THAT((*eg)->host_ifname(), ::testing::StartsWith("abo"));
  EXPECT_THAT((*eg)->box_address(), ::testing::StartsWith("10.201."));
  // The box: eth0 with its /30, the default route via our side, the filter loaded.
  EXPECT_THAT(box.in_box({"ip", "-4", "-o", "addr", "show", "dev", "eth0"}),
              HasSubstr("inet " + (*eg)->box_address() + "/30"));
  EXPECT_EQ(box.in_box({"ip", "-4", "route", "show", "default"}),
            "default via " + (*eg)->gateway() + " dev eth0 \n");
  const std::string rules = box.in_box({"nft", "list", "table", "inet", "agentbox"});
  EXPECT_THAT(rules, HasSubstr("ip daddr 169.254.0.0/16 reject with icmpx admin-prohibited"));
  EXPECT_THAT(rules, HasSubstr("ip daddr 10.0.0.0/8 reject"));
  // The host: forwarding on, its table in place.
  EXPECT_EQ(read_file("/proc/sys/net/ipv4/ip_forward"), "1\n");
  auto host = run_tool({"/usr/sbin/nft", "list", "table", "inet", "agentbox_open"}, "");
  ASSERT_TRUE(host) << host.error().message;
  EXPECT_THAT(*host, HasSubstr("masquerade"));

  // The session user: the host itself (a listener on every address), metadata, private and
  // other reserved ranges are refused at once; its own loopback works as always.
  UniqueFd l(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  ASSERT_EQ(bind(l.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(listen(l.get(), 8), 0);
  socklen_t len = sizeof sa;
  getsockname(l.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  const std::string port = std::to_string(ntohs(sa.sin_port));
  EXPECT_EQ(box.probe("tcp", (*eg)->gateway(), port), "EHOSTUNREACH");
  // (A UDP datagram the box's filter rejects fails its send with EPERM.)
  EXPECT_EQ(box.probe("udp", (*eg)->gateway(), "53"), "EPERM");
  EXPECT_EQ(box.probe("tcp", "169.254.169.254", "80"), "EHOSTUNREACH");
  EXPECT_EQ(box.probe("tcp", "10.1.2.3", "80"), "EHOSTUNREACH");
  EXPECT_EQ(box.probe("tcp", "127.0.0.1", port), "ECONNREFUSED");
  // ... and cannot undo any of it.
  auto flush = run_in_netns(box.netns(), {"nft", "flush", "ruleset"}, kBoxUid);
  EXPECT_NE(flush.exit_code, 0);
  auto del = run_in_netns(box.netns(), {"ip", "route", "del", "default"}, kBoxUid);
  EXPECT_NE(del.exit_code, 0);
  EXPECT_THAT(del.err, HasSubstr("Operation not permitted"));

  // stop(): the pair is gone on both sides.
  const std::string name = (*eg)->host_ifname();
  (*eg)->stop();
  EXPECT_EQ(if_nametoindex(name.c_str()), 0u);
  EXPECT_THAT(box.in_box({"ip", "-o", "link"}), ::testing::Not(HasSubstr("eth0")));
}

TEST(OpenEgressTest, TakenNamesAreSkippedAndEveryBoxGetsItsOwnAddress) {
  NetworkConfig cfg;
  cfg.allow_private = true;
  // Another daemon's boxes hold some names (the claim is the interface name): skipped.
  std::set<std::string> taken;
  for (int i = 0; i < 8; ++i) {
    taken.insert("abo" + std::to_string(i));
    ASSERT_TRUE(run_tool({"/usr/sbin/ip", "link", "add", "abo" + std::to_string(i), "type", "veth",
                          "peer", "name", "abp" + std::to_string(i)},
                         ""));
  }
  FakeBox a, b;
  std::vector<std::unique_ptr<OpenEgress>> held;
  std::set<std::string> names, addrs;
  for (FakeBox* box : {&a, &b}) {
    auto eg = OpenEgress::start(box->pid(), cfg);
    ASSERT_TRUE(eg) << eg.error().message;
    names.insert((*eg)->host_ifname());
    addrs.insert((*eg)->box_address());
    held.push_back(std::move(*eg));
  }
  EXPECT_EQ(names.size(), 2u);
  for (const auto& n : names) EXPECT_EQ(taken.count(n), 0u) << n;
  EXPECT_EQ(addrs.size(), 2u);
  // With allow_private the box filter has no private ranges, but still the pool.
  const std::string rules = a.in_box({"nft", "list", "table", "inet", "agentbox"});
  EXPECT_THAT(rules, ::testing::Not(HasSubstr("10.0.0.0/8")));
  EXPECT_THAT(rules, HasSubstr("ip daddr 10.201.0.0/16 reject"));
  // Box to box: refused (the pool, and the host's forward chain).
  EXPECT_EQ(a.probe("tcp", held[1]->box_address(), "80"), "EHOSTUNREACH");
}

TEST(OpenEgressTest, AGoneBoxIsAnErrorAndLeavesNothing) {
  NetworkConfig cfg;
  pid_t gone;
  {
    FakeBox box;
    gone = box.pid();
  }
  auto eg = OpenEgress::start(gone, cfg);
  ASSERT_FALSE(eg);
  EXPECT_THAT(eg.error().message, HasSubstr(std::to_string(gone)));
  auto links = run_tool({"/usr/sbin/ip", "-o", "link"}, "");
  ASSERT_TRUE(links);
  EXPECT_THAT(*links, ::testing::Not(HasSubstr("abo")));
}

}  // namespace
}  // namespace agentbox::net::testing
