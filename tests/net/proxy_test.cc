// The egress proxy end to end: local HTTP/HTTPS servers on the host's loopback named through
// network.hosts, and the box side in a network namespace of the test's own (only `lo`, no route
// out) reaching the proxy at 127.0.0.1:3128 with curl or a raw socket.
#include "net/proxy.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net/box_egress.h"
#include "net/net_fixture.h"

namespace agentbox::net::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kPkgs[] = "pkgs.example.test";

std::vector<std::string> curl(std::vector<std::string> extra, const std::string& url) {
  std::vector<std::string> argv = {"curl",       "-sS",
                                   "--max-time", "30",
                                   "--noproxy",  "",
                                   "-x",         "http://127.0.0.1:3128",
                                   "-w",         "\n%{http_code} %{http_connect}"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(url);
  return argv;
}

std::string url(const char* scheme, const std::string& host, uint16_t port,
                const std::string& path = "/hello") {
  return std::string(scheme) + "://" + host + ":" + std::to_string(port) + path;
}

std::string connect_req(const std::string& authority) {
  return "CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n";
}

class ProxyTest : public ::testing::Test {
 protected:
  ProxyTest() : http_("pkgs"), other_("other") {}

  std::unique_ptr<ProxyHarness> harness(std::vector<std::string> extra_allow = {},
                                        ProxyLimits limits = {}) {
    std::vector<std::string> allow = {std::string(kPkgs) + ":" + std::to_string(http_.port())};
    allow.insert(allow.end(), extra_allow.begin(), extra_allow.end());
    return std::make_unique<ProxyHarness>(
        allow,
        std::map<std::string, std::string>{{kPkgs, "127.0.0.1"},
                                           {"other.example.test", "127.0.0.1"}},
        limits);
  }
  std::string raw(ProxyHarness& h, const std::string& request) {
    UniqueFd fd = connect_in_netns(h.netns(), 3128);
    if (!fd) return "no connection";
    return roundtrip(fd.get(), request);
  }

  LocalServer http_;
  LocalServer other_;
};

TEST_F(ProxyTest, AllowedNameOverPlainHttpIs200) {
  auto h = harness();
  auto r = run_in_netns(h->netns(), curl({}, url("http", kPkgs, http_.port())));
  EXPECT_EQ(r.out, "pkgs got GET /hello Host=" + std::string(kPkgs) + ":" +
                       std::to_string(http_.port()) + "\n\n200 000")
      << r.err;
  // Also spelled with capitals and a trailing dot.
  auto r2 = run_in_netns(h->netns(), curl({}, url("http", "PKGS.Example.TEST.", http_.port())));
  EXPECT_THAT(r2.out, HasSubstr("pkgs got GET /hello")) << r2.err;
  EXPECT_THAT(r2.out, HasSubstr("\n200 ")) << r2.err;
  auto c = h->proxy().counters();
  EXPECT_GT(c.bytes_in, 0u);
  EXPECT_GT(c.bytes_out, 0u);
  EXPECT_EQ(c.denials, 0u);
}

TEST_F(ProxyTest, AllowedNameOverHttpsThroughConnectIs200) {
  TempDir certs;
  make_cert(certs.path(), {kPkgs});
  LocalServer https("pkgs-tls", certs.path());
  auto h = harness({std::string(kPkgs) + ":" + std::to_string(https.port())});
  auto r = run_in_netns(h->netns(), curl({"--cacert", certs.path() + "/cert.pem"},
                                         url("https", kPkgs, https.port())));
  EXPECT_THAT(r.out, StartsWith("pkgs-tls got GET /hello")) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\n200 200")) << r.err;
}

TEST_F(ProxyTest, NonListedNameIs403NamingIt) {
  auto h = harness();
  auto r = run_in_netns(h->netns(), curl({}, url("http", "other.example.test", other_.port())));
  EXPECT_EQ(r.out, "agentbox proxy: other.example.test is not in the allowlist\n\n403 000")
      << r.err;
  auto t = run_in_netns(h->netns(), curl({}, url("https", "other.example.test", 443)));
  EXPECT_THAT(t.out, HasSubstr("\n000 403")) << t.err;
  const std::string raw403 = raw(*h, connect_req("other.example.test:443"));
  EXPECT_THAT(raw403, StartsWith("HTTP/1.1 403 Forbidden\r\n"));
  EXPECT_THAT(raw403,
              HasSubstr("\r\n\r\nagentbox proxy: other.example.test is not in the allowlist\n"));
  EXPECT_EQ(other_.log(), "") << "nothing reached the non-listed server";
  auto d = h->denials();
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].host, "other.example.test");
  EXPECT_EQ(d[0].method, "GET");
  EXPECT_EQ(d[2].method, "CONNECT");
  EXPECT_EQ(d[2].port, 443);
  EXPECT_EQ(h->proxy().counters().denials, 3u);
}

TEST_F(ProxyTest, IpLiteralSpellingsAre403) {
  auto h = harness();
  const std::string p = std::to_string(http_.port());
  for (const std::string host :
       {"127.0.0.1", "127.1", "0x7f.0.0.1", "2130706433", "0177.0.0.1", "[::ffff:127.0.0.1]"}) {
    auto r = raw(*h, connect_req(host + ":" + p));
    EXPECT_THAT(r, StartsWith("HTTP/1.1 403 ")) << host;
    EXPECT_THAT(r, HasSubstr("IP address 127.0.0.1 is not in the allowlist")) << host;
    auto g = raw(*h, "GET http://" + host + ":" + p + "/hello HTTP/1.1\r\nHost: " + host + ":" + p +
                         "\r\n\r\n");
    EXPECT_THAT(g, StartsWith("HTTP/1.1 403 ")) << host;
  }
  EXPECT_EQ(http_.log(), "");
}

TEST_F(ProxyTest, AllowedNameResolvingToLoopbackThroughDnsIsRefused) {
  // "localhost" is not in network.hosts: the system resolver answers 127.0.0.1 / ::1.
  auto h = harness({"localhost:" + std::to_string(http_.port())});
  auto r = raw(*h, connect_req("localhost:" + std::to_string(http_.port())));
  EXPECT_THAT(r, StartsWith("HTTP/1.1 403 "));
  EXPECT_THAT(r, HasSubstr("agentbox proxy: localhost resolves to "));
  EXPECT_THAT(r, HasSubstr(", a loopback ("));
  EXPECT_EQ(http_.log(), "");
}

TEST_F(ProxyTest, TargetThatNeverAnswersIs504NamingIt) {
  BlackholeServer hole;
  SilentServer silent;
  ProxyLimits lim;
  lim.connect_timeout = std::chrono::milliseconds(500);
  lim.response_timeout = std::chrono::milliseconds(500);
  auto h = harness({std::string(kPkgs) + ":" + std::to_string(hole.port()),
                    std::string(kPkgs) + ":" + std::to_string(silent.port())},
                   lim);
  const std::string where = std::string(kPkgs) + ":" + std::to_string(hole.port());
  auto r = raw(*h, connect_req(where));
  EXPECT_THAT(r, StartsWith("HTTP/1.1 504 Gateway Timeout\r\n"));
  EXPECT_THAT(r, HasSubstr("agentbox proxy: " + where + " did not answer within 500 ms"));
  // Connected, but no response byte ever: the plain request gets the 504 too.
  const std::string swhere = std::string(kPkgs) + ":" + std::to_string(silent.port());
  auto g = raw(*h, "GET http://" + swhere + "/ HTTP/1.1\r\nHost: " + swhere + "\r\n\r\n");
  EXPECT_THAT(g, StartsWith("HTTP/1.1 504 Gateway Timeout\r\n"));
  EXPECT_THAT(g, HasSubstr("agentbox proxy: " + swhere + " sent no response in time"));
}

TEST_F(ProxyTest, ForeignHostInsideATunnelGoesToTheAllowedHostOnly) {
  auto h = harness();
  const std::string where = std::string(kPkgs) + ":" + std::to_string(http_.port());
  UniqueFd fd = connect_in_netns(h->netns(), 3128);
  ASSERT_TRUE(fd);
  std::string r = roundtrip(
      fd.get(),
      connect_req(where) +
          "GET /inside HTTP/1.1\r\nHost: other.example.test\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200"));
  EXPECT_THAT(r, HasSubstr("pkgs got GET /inside Host=other.example.test"));
  EXPECT_EQ(other_.log(), "");
}

TEST_F(ProxyTest, PlainRequestsAreCheckedOneByOne) {
  auto h = harness();
  const std::string where = std::string(kPkgs) + ":" + std::to_string(http_.port());
  const std::string foreign = "other.example.test:" + std::to_string(other_.port());
  // A Host header naming another host than the checked target: refused.
  auto r = raw(*h, "GET http://" + where + "/a HTTP/1.1\r\nHost: " + foreign + "\r\n\r\n");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 403 "));
  EXPECT_THAT(r, HasSubstr("Host header \"" + foreign + "\" does not match " + where));
  // Keep-alive with a second, pipelined request for another host: the first is served, the
  // second is never forwarded anywhere (one request per connection; a new one is checked anew).
  auto k = raw(*h, "GET http://" + where + "/first HTTP/1.1\r\nHost: " + where +
                       "\r\nConnection: keep-alive\r\n\r\n"
                       "GET http://" +
                       foreign + "/second HTTP/1.1\r\nHost: " + foreign + "\r\n\r\n");
  EXPECT_THAT(k, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(k, HasSubstr("pkgs got GET /first"));
  EXPECT_THAT(k, Not(HasSubstr("second")));
  EXPECT_EQ(http_.log(), "GET /first Host=" + where + "\n");
  EXPECT_EQ(other_.log(), "");
  auto again =
      raw(*h, "GET http://" + foreign + "/second HTTP/1.1\r\nHost: " + foreign + "\r\n\r\n");
  EXPECT_THAT(again, StartsWith("HTTP/1.1 403 "));
  // A body goes along, exactly Content-Length bytes of it.
  auto post = raw(*h, "POST http://" + where + "/up HTTP/1.1\r\nHost: " + where +
                          "\r\nContent-Length: 5\r\n\r\nhelloGET /smuggled HTTP/1.1\r\n\r\n");
  EXPECT_THAT(post, HasSubstr("pkgs got POST /up"));
  EXPECT_THAT(http_.log(), Not(HasSubstr("smuggled")));
}

TEST_F(ProxyTest, PolicyCanBeSwappedOnALiveProxy) {
  auto h = harness();
  const std::string u = url("http", kPkgs, http_.port());
  EXPECT_THAT(run_in_netns(h->netns(), curl({}, u)).out, HasSubstr("\n200 "));
  h->proxy().set_policy(std::make_shared<const Policy>(
      *Policy::parse({"other.example.test:" + std::to_string(other_.port())})));
  EXPECT_THAT(run_in_netns(h->netns(), curl({}, u)).out,
              HasSubstr("is not in the allowlist\n\n403 "));
  EXPECT_THAT(
      run_in_netns(h->netns(), curl({}, url("http", "other.example.test", other_.port()))).out,
      HasSubstr("other got GET /hello"));
}

TEST_F(ProxyTest, GarbageOversizedHeadsAndSlowClients) {
  ProxyLimits lim;
  lim.header_timeout = std::chrono::milliseconds(500);
  lim.max_header_bytes = 4096;
  auto h = harness({}, lim);
  EXPECT_THAT(raw(*h, "\x16\x03\x01\x02\x01\r\n\r\n"), StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_THAT(raw(*h, "GET /relative HTTP/1.1\r\nHost: x\r\n\r\n"), StartsWith("HTTP/1.1 400 "));
  EXPECT_THAT(raw(*h, "CONNECT pkgs.example.test HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 400 "));
  EXPECT_THAT(raw(*h, "GET http://a.test/ HTTP/1.1\r\nX: " + std::string(5000, 'a') + "\r\n\r\n"),
              StartsWith("HTTP/1.1 431 "));
  // A slowloris client: half a head, then nothing. At the header timeout the proxy answers 408
  // naming it and closes.
  UniqueFd slow = connect_in_netns(h->netns(), 3128);
  ASSERT_TRUE(slow);
  const std::string r = roundtrip(slow.get(), "CONNECT pkgs.exa");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 408 Request Timeout\r\n"));
  EXPECT_THAT(r, HasSubstr("agentbox proxy: no complete request head within 500 ms"));
}

TEST_F(ProxyTest, ThousandConcurrentConnectsAreBounded) {
  rlimit rl{8192, 8192};
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
  SilentServer sink(4096);  // tunnels that stay open: the kernel accepts, nobody reads
  ProxyLimits lim;
  lim.max_connections = 256;
  lim.half_closed_timeout = std::chrono::milliseconds(500);
  auto h = harness({std::string(kPkgs) + ":" + std::to_string(sink.port())}, lim);
  const size_t before = open_fds();
  auto flood = connect_many_in_netns(h->netns(), 3128, 1000);
  ASSERT_EQ(flood.size(), 1000u);
  const std::string req = connect_req(std::string(kPkgs) + ":" + std::to_string(sink.port()));
  size_t ok = 0, busy = 0;
  for (auto& fd : flood) {
    // Every connection gets an answer: a tunnel, or 503 beyond the limit.
    std::string r = roundtrip(fd.get(), req, 39);
    if (r.starts_with("HTTP/1.1 200 Connection established")) ++ok;
    if (r.starts_with("HTTP/1.1 503")) ++busy;
  }
  EXPECT_EQ(ok + busy, 1000u);
  EXPECT_LE(ok, 256u);
  EXPECT_GE(busy, 744u);
  // Proxy fds: at most two per admitted connection (box side, upstream side).
  EXPECT_LE(open_fds() - before - flood.size(), 2 * 256u + 8);
  auto c = h->proxy().counters();
  EXPECT_LE(c.connections_active, 256u);
  EXPECT_GE(c.rejected_busy, 744u);
  // The proxy still answers someone else (here: with a clear 503 while the flood holds).
  EXPECT_THAT(raw(*h, req), StartsWith("HTTP/1.1 503 Service Unavailable"));
  flood.clear();
  // Once the flood is gone, service is back.
  std::string r;
  for (int i = 0; i < 200 && !r.starts_with("HTTP/1.1 200"); ++i) {
    r = run_in_netns(h->netns(), curl({}, url("http", kPkgs, http_.port()))).out;
    if (r.find("\n200 ") != std::string::npos) break;
    usleep(50'000);
  }
  EXPECT_THAT(r, HasSubstr("pkgs got GET /hello"));
}

TEST_F(ProxyTest, ListenerIsInsideTheNamespaceOnly) {
  auto h = harness();
  // The host's 127.0.0.1:3128 is not the proxy (the box's loopback is another one).
  UniqueFd host(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(3128);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool host_has_3128 = connect(host.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  if (host_has_3128) {
    GTEST_LOG_(INFO) << "something else listens on the host's 3128; not asserting on it";
  } else {
    EXPECT_EQ(errno, ECONNREFUSED);
  }
  // The box's namespace has nothing but lo: no route out.
  auto r =
      run_in_netns(h->netns(), {"sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"});
  EXPECT_EQ(r.out, "lo\n");
}

TEST_F(ProxyTest, BigDownloadCountsBytes) {
  auto h = harness();
  auto r = run_in_netns(h->netns(),
                        {"sh", "-c",
                         "curl -sS --noproxy '' -x http://127.0.0.1:3128 " +
                             url("http", kPkgs, http_.port(), "/big?n=8388608") + " | wc -c"});
  EXPECT_EQ(r.out, "8388608\n") << r.err;
  if (r.out != "8388608\n") {
    auto d = run_in_netns(h->netns(),
                          curl({"-r", "0-100"}, url("http", kPkgs, http_.port(), "/big?n=100")));
    ADD_FAILURE() << d.out << d.err;
  }
  EXPECT_GE(h->proxy().counters().bytes_in, 8388608u);
}

}  // namespace
}  // namespace agentbox::net::testing

namespace agentbox::net::testing {
namespace {

// A stand-in for a box's init: a child in a new network namespace with lo up, until killed.
class NetnsChild {
 public:
  NetnsChild() {
    int p[2];
    EXPECT_EQ(pipe2(p, O_CLOEXEC), 0);
    pid_ = fork();
    if (pid_ == 0) {
      if (unshare(CLONE_NEWNET) != 0) _exit(1);
      int s = socket(AF_INET, SOCK_DGRAM, 0);
      ifreq ifr{};
      memcpy(ifr.ifr_name, "lo", 3);
      if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) _exit(1);
      ifr.ifr_flags |= IFF_UP;
      if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) _exit(1);
      char c = 1;
      if (write(p[1], &c, 1) != 1) _exit(1);
      pause();
      _exit(0);
    }
    close(p[1]);
    char c = 0;
    EXPECT_EQ(read(p[0], &c, 1), 1);
    close(p[0]);
    ns_ =
        UniqueFd(open(("/proc/" + std::to_string(pid_) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
  }
  ~NetnsChild() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  int ns() const { return ns_.get(); }

 private:
  pid_t pid_ = -1;
  UniqueFd ns_;
};

TEST(BoxEgressTest, ServesTheBoxWhileRunningAndTheEnvPointsAtIt) {
  LocalServer http("pkgs");
  NetnsChild box;
  boost::asio::io_context io;
  auto policy = std::make_shared<const Policy>(
      *Policy::parse({std::string(kPkgs) + ":" + std::to_string(http.port())}));
  auto cfg = std::make_shared<NetworkConfig>();
  cfg->hosts = *parse_hosts({{kPkgs, "127.0.0.1"}});
  auto egress = BoxEgress::start(io, box.pid(), policy, cfg);
  ASSERT_TRUE(egress) << egress.error().message;
  std::thread t([&] { io.run(); });
  std::vector<std::string> argv = {"env"};
  for (const auto& [k, v] : BoxEgress::box_env()) argv.push_back(k + "=" + v);
  EXPECT_EQ(argv[1], "HTTP_PROXY=http://127.0.0.1:3128");
  for (const char* a : {"curl", "-sS", "-w", "\n%{http_code}"}) argv.push_back(a);
  argv.push_back(url("http", kPkgs, http.port()));
  auto r = run_in_netns(box.ns(), argv);
  EXPECT_THAT(r.out, StartsWith("pkgs got GET /hello")) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\n200")) << r.err;
  // Counted on the proxy's thread as the relay's writes complete: curl may have the reply a
  // moment before the counter has it.
  for (int i = 0; i < 200 && (*egress)->counters().bytes_in == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT((*egress)->counters().bytes_in, 0u);
  // A second proxy for the same box: the port is taken.
  auto again = BoxEgress::start(io, box.pid(), policy, cfg);
  ASSERT_FALSE(again);
  EXPECT_THAT(again.error().message, HasSubstr("bind(127.0.0.1:3128)"));
  // Stopped with the box: nothing listens any more.
  egress->reset();
  io.stop();
  t.join();
  auto after = run_in_netns(box.ns(), argv);
  EXPECT_EQ(after.exit_code, 7) << after.out << after.err;  // CURLE_COULDNT_CONNECT
}

}  // namespace
}  // namespace agentbox::net::testing
