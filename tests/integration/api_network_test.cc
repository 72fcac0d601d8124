// Network egress against the real daemon (API.md "Network", issue 12): a session with network
// mode "allowlist" reaches a local HTTP server named through the config's `network.hosts` via
// the proxy the daemon serves inside the box's netns; a name not listed is 403 naming it and a
// `net.deny` audit line; a "none" box reaches nothing; POST /v1/sessions/{id}/network changes a
// live policy. Mode "open" (routed, filtered egress from the box's own netns) and the T6 items
// that need a whole box: UDP/DNS out, `ip route add`, raw sockets, the daemon's own port, the
// proxy given garbage, a slowloris client, a flood of CONNECTs, a target that never answers.
//
// Only this machine: the whole test binary runs in a network namespace of its own (set up before
// any thread exists), so its daemons, their boxes' veths, the nftables tables and the
// ip_forward switch of mode "open" are all inside it and vanish with it. "The internet" is a
// second namespace the test makes (Upstream), joined by a veth on private addresses.

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;

// The whole binary in its own network namespace, `lo` up (before any thread exists).
class OwnNetns : public ::testing::Environment {
 public:
  void SetUp() override {
    ASSERT_EQ(::unshare(CLONE_NEWNET), 0) << strerror(errno);
    int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    ASSERT_EQ(::ioctl(s, SIOCGIFFLAGS, &ifr), 0);
    ifr.ifr_flags |= IFF_UP;
    ASSERT_EQ(::ioctl(s, SIOCSIFFLAGS, &ifr), 0);
    ::close(s);
  }
};
const auto* const kOwnNetns = ::testing::AddGlobalTestEnvironment(new OwnNetns);

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/agentbox-it-net-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

// A tiny HTTP/1.0 file server on 127.0.0.1:<ephemeral>: GET <path> answers the bytes registered
// for that path (200; text/html for a path ending in "/", a links page) or 404, then closes. Counts
// the requests it served.
class FileServer {
 public:
  FileServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 64) != 0) {
      throw std::runtime_error("file server: bind/listen");
    }
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FileServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  void put(const std::string& path, std::string body) {
    std::lock_guard lk(mu_);
    files_[path] = std::move(body);
  }
  uint16_t port() const { return port_; }
  int served() const { return served_.load(); }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::string head;
      char buf[4096];
      while (head.find("\r\n\r\n") == std::string::npos && head.size() < 65536) {
        pollfd q{c, POLLIN, 0};
        if (::poll(&q, 1, 5000) <= 0) break;
        ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        head.append(buf, static_cast<size_t>(n));
      }
      std::string path;
      if (auto sp = head.find(' '); sp != std::string::npos) {
        auto sp2 = head.find(' ', sp + 1);
        if (sp2 != std::string::npos) path = head.substr(sp + 1, sp2 - sp - 1);
      }
      std::string body;
      bool found = false;
      {
        std::lock_guard lk(mu_);
        if (auto it = files_.find(path); it != files_.end()) {
          body = it->second;
          found = true;
        }
      }
      std::string resp =
          std::string(found ? "HTTP/1.0 200 OK" : "HTTP/1.0 404 Not Found") + "\r\nContent-Type: " +
          (!path.empty() && path.back() == '/' ? "text/html" : "application/octet-stream") +
          "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
          body;
      size_t off = 0;
      while (off < resp.size()) {
        ssize_t n = ::send(c, resp.data() + off, resp.size() - off, MSG_NOSIGNAL);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      ++served_;
      ::close(c);
    }
  }

  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> served_{0};
  std::mutex mu_;
  std::map<std::string, std::string> files_;
  std::thread thread_;
};

std::string write_config(const TempDir& dir) {
  std::string cfg = dir.path + "/agentboxd.yaml";
  std::ofstream(cfg) << "network:\n"
                        "  hosts:\n"
                        "    pkgs.example.test: 127.0.0.1\n"
                        "    other.example.test: 127.0.0.1\n";
  return cfg;
}

class NetworkApi : public ::testing::Test {
 protected:
  NetworkApi() : daemon_({"--backend", "ns", "--config", write_config(dir_)}), api_(daemon_) {
    server_.put("/hello.txt", "hello from the mirror\n");
  }

  std::string allow_entry(const std::string& name) const {
    return name + ":" + std::to_string(server_.port());
  }
  std::string url(const std::string& name, const std::string& path) const {
    return "http://" + name + ":" + std::to_string(server_.port()) + path;
  }
  // curl in the box: the body, then a line "code=<HTTP status>" (000 when it could not connect).
  ApiReply curl(const std::string& id, const std::string& u) {
    return api_.sh(id, "curl -sS --max-time 20 -w '\\ncode=%{http_code}' '" + u + "'");
  }
  std::string audit_log() const { return read_host_file(daemon_.data_dir() + "/audit.log"); }

  TempDir dir_;
  FileServer server_;
  Daemon daemon_;
  Api api_;
};

TEST_F(NetworkApi, AllowlistBoxFetchesFromAListedNameThroughTheProxy) {
  auto c = api_.post(
      "/v1/sessions",
      {{"id", "al"},
       {"network", {{"mode", "allowlist"}, {"allow", {allow_entry("pkgs.example.test")}}}}});
  ASSERT_EQ(c.status, 201) << c;
  EXPECT_EQ(c.body["network"]["mode"], "allowlist") << c;

  // The proxy variables are in every command's environment.
  auto env = api_.sh("al", "echo $HTTP_PROXY $https_proxy $NO_PROXY");
  ASSERT_EQ(env.status, 200) << env;
  EXPECT_EQ(env.body["stdout"], "http://127.0.0.1:3128 http://127.0.0.1:3128 localhost,127.0.0.1\n")
      << env;

  auto r = curl("al", url("pkgs.example.test", "/hello.txt"));
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["stdout"], "hello from the mirror\n\ncode=200") << r;
  EXPECT_EQ(server_.served(), 1);

  // A name not listed: 403 from the proxy naming the host, the server never asked.
  auto d = curl("al", url("other.example.test", "/hello.txt"));
  ASSERT_EQ(d.status, 200) << d;
  std::string out = d.body["stdout"];
  EXPECT_NE(out.find("code=403"), std::string::npos) << d;
  EXPECT_NE(out.find("other.example.test"), std::string::npos) << d;
  EXPECT_EQ(server_.served(), 1);
  ASSERT_TRUE(eventually([&] { return audit_log().find("\"net.deny\"") != std::string::npos; }))
      << audit_log();
  std::string log = audit_log();
  auto line_at = log.find("\"net.deny\"");
  std::string line = log.substr(log.rfind('\n', line_at) + 1,
                                log.find('\n', line_at) - log.rfind('\n', line_at) - 1);
  auto deny = json::parse(line, nullptr, false);
  EXPECT_EQ(deny["session"], "al") << line;
  EXPECT_EQ(deny["host"], "other.example.test") << line;
  EXPECT_EQ(deny["port"], server_.port()) << line;
  EXPECT_NE(deny["reason"].get<std::string>().find("other.example.test"), std::string::npos)
      << line;

  // No way around the proxy: no DNS, no route (a direct connection to the host's loopback
  // reaches the box's own loopback, where nothing listens on that port).
  auto direct =
      api_.sh("al", "curl -sS --noproxy '*' --max-time 5 -o /dev/null -w '%{http_code}' " +
                        url("127.0.0.1", "/hello.txt"));
  ASSERT_EQ(direct.status, 200) << direct;
  EXPECT_NE(direct.body["exit_code"], 0) << direct;
  EXPECT_EQ(server_.served(), 1);

  // Per-session egress counters.
  auto m = api_.get("/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.raw.find("agentbox_egress_denials_total{session=\"al\"} 1\n"), std::string::npos)
      << m.raw;
  EXPECT_NE(m.raw.find("agentbox_egress_bytes_in_total{session=\"al\"} "), std::string::npos);
  EXPECT_EQ(m.raw.find("agentbox_egress_bytes_in_total{session=\"al\"} 0\n"), std::string::npos);
}

TEST_F(NetworkApi, NoneBoxReachesNothing) {
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "nn"}}).status, 201);
  auto env = api_.sh("nn", "echo \"[$HTTP_PROXY]\"");
  EXPECT_EQ(env.body["stdout"], "[]\n") << env;
  // Through a proxy variable the box sets itself, and directly: nothing answers.
  auto r = api_.sh("nn", "HTTP_PROXY=http://127.0.0.1:3128 curl -sS --max-time 5 -o /dev/null " +
                             url("pkgs.example.test", "/hello.txt"));
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_NE(r.body["exit_code"], 0) << r;
  auto d = api_.sh("nn", "curl -sS --max-time 5 -o /dev/null " + url("127.0.0.1", "/hello.txt"));
  EXPECT_NE(d.body["exit_code"], 0) << d;
  EXPECT_EQ(server_.served(), 0);
}

TEST_F(NetworkApi, MalformedAllowEntryIs400NamingItAndMakesNothing) {
  auto r =
      api_.post("/v1/sessions",
                {{"id", "bad"},
                 {"network", {{"mode", "allowlist"}, {"allow", {"ok.test", "no spaces.test"}}}}});
  EXPECT_EQ(r.status, 400) << r;
  EXPECT_EQ(r.code(), "EINVAL") << r;
  EXPECT_NE(r.message().find("no spaces.test"), std::string::npos) << r;
  EXPECT_EQ(api_.get("/v1/sessions/bad").status, 404);
  auto open = api_.post("/v1/sessions",
                        {{"id", "op"}, {"network", {{"mode", "open"}, {"allow", {"a.test"}}}}});
  EXPECT_EQ(open.status, 400) << open;
  EXPECT_NE(open.message().find("network.allow"), std::string::npos) << open;
  auto wrong = api_.post("/v1/sessions", {{"id", "op"}, {"network", {{"mode", "wide"}}}});
  EXPECT_EQ(wrong.status, 400) << wrong;
  EXPECT_EQ(api_.get("/v1/sessions/op").status, 404);
}

TEST_F(NetworkApi, PolicyChangeTakesEffectOnTheLiveBoxAndSurvivesSuspend) {
  ASSERT_EQ(api_.post("/v1/sessions",
                      {{"id", "ch"},
                       {"network",
                        {{"mode", "allowlist"}, {"allow", {allow_entry("pkgs.example.test")}}}}})
                .status,
            201);
  EXPECT_NE(curl("ch", url("other.example.test", "/hello.txt"))
                .body["stdout"]
                .get<std::string>()
                .find("code=403"),
            std::string::npos);

  auto p = api_.post("/v1/sessions/ch/network",
                     {{"mode", "allowlist"}, {"allow", {allow_entry("other.example.test")}}});
  ASSERT_EQ(p.status, 200) << p;
  EXPECT_EQ(p.body["network"]["allow"], json::array({allow_entry("other.example.test")})) << p;
  EXPECT_EQ(curl("ch", url("other.example.test", "/hello.txt")).body["stdout"],
            "hello from the mirror\n\ncode=200");
  EXPECT_NE(curl("ch", url("pkgs.example.test", "/hello.txt"))
                .body["stdout"]
                .get<std::string>()
                .find("code=403"),
            std::string::npos);

  // Bad input changes nothing; unknown sessions are 404 (a live mode change:
  // OpenNetworkApi.ModeChangesLiveAndCutsWhatTheNewModeRefuses).
  auto bad = api_.post("/v1/sessions/ch/network", {{"mode", "allowlist"}, {"allow", {"a b"}}});
  EXPECT_EQ(bad.status, 400) << bad;
  EXPECT_EQ(api_.post("/v1/sessions/nope/network", {{"mode", "allowlist"}}).status, 404);
  EXPECT_EQ(api_.get("/v1/sessions/ch").body["network"]["allow"],
            json::array({allow_entry("other.example.test")}));

  // Suspend stops the proxy; the resumed box gets a new one with the stored policy.
  ASSERT_EQ(api_.post("/v1/sessions/ch/suspend", json::object()).status, 200);
  EXPECT_EQ(curl("ch", url("other.example.test", "/hello.txt")).body["stdout"],
            "hello from the mirror\n\ncode=200");
  EXPECT_NE(audit_log().find("\"session.network\""), std::string::npos);
}

// Runs `cmd` on the host (test inputs: a wheel, an npm tarball); true on exit 0.
bool host_sh(const std::string& cmd) {
  return std::system(cmd.c_str()) == 0;
}

// The point of the allowlist (issue 12 "Done when"): pip and npm install from a local mirror
// through the proxy in an allowlist box, and fail in a none box.
TEST_F(NetworkApi, PipAndNpmInstallFromALocalMirror) {
  const std::string d = dir_.path;
  // A hand-made wheel (a zip with the module and its dist-info) and an `npm pack` tarball.
  ASSERT_TRUE(host_sh("cd " + d +
                      " && /usr/bin/python3 - <<'PY'\n"
                      "import zipfile\n"
                      "w = zipfile.ZipFile('tinypkg-0.1-py3-none-any.whl', 'w')\n"
                      "w.writestr('tinypkg/__init__.py', 'VALUE = 42\\n')\n"
                      "w.writestr('tinypkg-0.1.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: "
                      "tinypkg\\nVersion: 0.1\\n')\n"
                      "w.writestr('tinypkg-0.1.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: "
                      "test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n"
                      "w.writestr('tinypkg-0.1.dist-info/RECORD', '')\n"
                      "w.close()\n"
                      "PY"));
  ASSERT_TRUE(host_sh("mkdir -p " + d + "/npm/tinynpm && cd " + d +
                      "/npm/tinynpm && printf '%s' '{\"name\":\"tinynpm\",\"version\":\"1.0.0\","
                      "\"main\":\"index.js\"}' > package.json && echo 'module.exports = 7;' > "
                      "index.js && npm pack --silent --pack-destination " +
                      d + " >/dev/null 2>&1"));
  server_.put("/wheels/tinypkg-0.1-py3-none-any.whl",
              read_host_file(d + "/tinypkg-0.1-py3-none-any.whl"));
  server_.put("/wheels/",
              "<html><body><a href=\"tinypkg-0.1-py3-none-any.whl\">"
              "tinypkg-0.1-py3-none-any.whl</a></body></html>");
  server_.put("/npm/tinynpm-1.0.0.tgz", read_host_file(d + "/tinynpm-1.0.0.tgz"));
  ASSERT_FALSE(read_host_file(d + "/tinynpm-1.0.0.tgz").empty());

  const std::string pip =
      "/usr/bin/python3 -m pip install --no-cache-dir --disable-pip-version-check --no-index "
      "--retries 0 --timeout 10 "
      "--break-system-packages --trusted-host pkgs.example.test --target /workspace/site "
      "--find-links " +
      url("pkgs.example.test", "/wheels/") + " tinypkg 2>&1";
  const std::string npm =
      "cd /workspace && npm install --no-audit --no-fund --loglevel=error --fetch-retries=0 " +
      url("pkgs.example.test", "/npm/tinynpm-1.0.0.tgz") + " 2>&1";

  ASSERT_EQ(api_.post("/v1/sessions",
                      {{"id", "pm"},
                       {"network",
                        {{"mode", "allowlist"}, {"allow", {allow_entry("pkgs.example.test")}}}}})
                .status,
            201);
  auto p = api_.exec("pm", {{"command", pip}, {"timeout_sec", 120}});
  ASSERT_EQ(p.status, 200) << p;
  EXPECT_EQ(p.body["exit_code"], 0) << p;
  auto pv = api_.sh("pm",
                    "PYTHONPATH=/workspace/site /usr/bin/python3 -c 'import tinypkg; "
                    "print(tinypkg.VALUE)'");
  EXPECT_EQ(pv.body["stdout"], "42\n") << pv;
  auto n = api_.exec("pm", {{"command", npm}, {"timeout_sec", 120}});
  ASSERT_EQ(n.status, 200) << n;
  EXPECT_EQ(n.body["exit_code"], 0) << n;
  auto nv = api_.sh("pm", "cd /workspace && node -e 'console.log(require(\"tinynpm\"))'");
  EXPECT_EQ(nv.body["stdout"], "7\n") << nv;

  // The same in a none box: nothing to install from.
  const int served = server_.served();
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "pn"}}).status, 201);
  auto p2 = api_.exec("pn", {{"command", pip}, {"timeout_sec", 120}});
  EXPECT_NE(p2.body["exit_code"], 0) << p2;
  auto n2 =
      api_.exec("pn", {{"command", npm + "; test -d node_modules/tinynpm"}, {"timeout_sec", 120}});
  EXPECT_NE(n2.body["exit_code"], 0) << n2;
  EXPECT_EQ(server_.served(), served);
}

// The host backend has no network namespace: an allowlist cannot be honoured there.
TEST(NetworkApiHost, AllowlistOnTheHostBackendIs501) {
  Daemon d({"--backend", "host"});
  Api api(d);
  auto r =
      api.post("/v1/sessions",
               {{"id", "h"}, {"network", {{"mode", "allowlist"}, {"allow", {"example.org"}}}}});
  EXPECT_EQ(r.status, 501) << r;
  EXPECT_EQ(r.code(), "ENOTSUP") << r;
  EXPECT_NE(r.message().find("host backend"), std::string::npos) << r;
  EXPECT_EQ(api.get("/v1/sessions/h").status, 404);
  // Nor "open": host commands would have the host's whole network, the daemon included.
  auto o = api.post("/v1/sessions", {{"id", "ho"}, {"network", {{"mode", "open"}}}});
  EXPECT_EQ(o.status, 501) << o;
  EXPECT_NE(o.message().find("network.mode \"open\" on the host backend"), std::string::npos) << o;
  EXPECT_EQ(api.get("/v1/sessions/ho").status, 404);
}

// ---- Mode "open" and the T6 items that need a whole box -----------------------------------------

// Runs `cmd` with /bin/sh; true on exit 0 (the test's own network setup).
bool sh_ok(const std::string& cmd) {
  return std::system(cmd.c_str()) == 0;
}

// "The internet": a network namespace beside the test's, joined by a veth (the test's side
// 10.77.0.1/24 on `upv`, the upstream's 10.77.0.2/24). A Python server in it answers HTTP on TCP
// 8080 ("upstream saw <peer address>"), echoes UDP on 53 ("echo:<data>"), holds every connection
// to TCP 7001 open without a word, and drops every SYN to TCP 9 (a target that never answers).
// Every TCP/UDP peer it sees is logged. Killed with the test: its namespace and the veth go with
// it.
class Upstream {
 public:
  static constexpr char kAddr[] = "10.77.0.2";
  static constexpr char kOurAddr[] = "10.77.0.1";

  Upstream() {
    log_ = dir_.path + "/upstream.log";
    static const char* kServer =
        "import socket,threading,sys\n"
        "log=open(sys.argv[1],'a',buffering=1)\n"
        "def udp():\n"
        "  u=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); u.bind(('0.0.0.0',53))\n"
        "  while True:\n"
        "    d,a=u.recvfrom(2048); log.write('udp '+a[0]+'\\n'); u.sendto(b'echo:'+d,a)\n"
        "t=socket.socket(); t.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        "t.bind(('0.0.0.0',8080)); t.listen(64)\n"
        "def hold():\n"
        "  h=socket.socket(); h.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        "  h.bind(('0.0.0.0',7001)); h.listen(16); held=[]\n"
        "  while True: held.append(h.accept()[0])\n"
        "threading.Thread(target=udp,daemon=True).start()\n"
        "threading.Thread(target=hold,daemon=True).start()\n"
        "log.write('ready\\n')\n"
        "while True:\n"
        "  c,a=t.accept(); log.write('tcp '+a[0]+'\\n'); c.settimeout(5)\n"
        "  try: c.recv(65536)\n"
        "  except OSError: pass\n"
        "  b=('upstream saw '+a[0]+'\\n').encode()\n"
        "  c.sendall(b'HTTP/1.0 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n'%len(b)+b); c.close()\n";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::unshare(CLONE_NEWNET) != 0) ::_exit(126);
      ::execl("/usr/bin/python3", "python3", "-c", kServer, log_.c_str(), nullptr);
      ::_exit(127);
    }
    if (!eventually([&] { return read_host_file(log_).find("ready") != std::string::npos; })) {
      throw std::runtime_error("upstream server did not start");
    }
    const std::string ns = "nsenter --net=/proc/" + std::to_string(pid_) + "/ns/net ";
    if (!sh_ok("ip link add upv type veth peer name eth0 netns " + std::to_string(pid_) +
               " && ip addr add " + kOurAddr + "/24 dev upv && ip link set upv up && " + ns +
               "ip link set lo up && " + ns + "ip addr add " + kAddr + "/24 dev eth0 && " + ns +
               "ip link set eth0 up && " + ns +
               "nft 'add table ip up; add chain ip up in { type filter hook input priority 0; "
               "}; add rule ip up in tcp dport 9 drop'")) {
      throw std::runtime_error("upstream network setup failed");
    }
  }
  ~Upstream() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  // The peers it saw ("tcp 10.77.0.1\nudp 10.77.0.1\n"), without the ready line.
  std::string peers() const {
    std::string l = read_host_file(log_);
    return l.substr(l.find('\n') + 1);
  }

 private:
  TempDir dir_;
  std::string log_;
  pid_t pid_ = -1;
};

// A TCP listener on `addr`:<ephemeral> in the test's (the host's) namespace that accepts nothing.
class HostListener {
 public:
  explicit HostListener(const char* addr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    ::inet_pton(AF_INET, addr, &sa.sin_addr);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd_, 16) != 0) {
      throw std::runtime_error(std::string("host listener on ") + addr);
    }
    socklen_t len = sizeof sa;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len);
    port_ = ntohs(sa.sin_port);
  }
  ~HostListener() { ::close(fd_); }
  std::string port() const { return std::to_string(port_); }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// What a box sees when it reaches out: `probe tcp H P` -> CONNECTED or the errno name,
// `probe http H P` -> "HTTP <body>", `probe udp H P` -> "UDP <reply>" (TIMEOUT after 5 s).
constexpr char kProbe[] =
    "import socket,errno,sys\n"
    "k,h,p=sys.argv[1],sys.argv[2],int(sys.argv[3])\n"
    "try:\n"
    "  if k=='udp':\n"
    "    s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(5); s.connect((h,p))\n"
    "    s.send(b'ping'); print('UDP '+s.recv(100).decode())\n"
    "  else:\n"
    "    s=socket.create_connection((h,p),timeout=5)\n"
    "    if k=='tcp': print('CONNECTED')\n"
    "    else:\n"
    "      s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); d=b''\n"
    "      while True:\n"
    "        x=s.recv(4096)\n"
    "        if not x: break\n"
    "        d+=x\n"
    "      print('HTTP '+d.split(b'\\r\\n\\r\\n',1)[-1].decode().strip())\n"
    "except socket.timeout: print('TIMEOUT')\n"
    "except OSError as e: print(errno.errorcode.get(e.errno,str(e.errno)))\n";

std::string open_config(const TempDir& dir, bool allow_private) {
  std::string cfg = dir.path + "/agentboxd.yaml";
  std::ofstream(cfg) << "network:\n"
                        "  allow_private: "
                     << (allow_private ? "true" : "false")
                     << "\n"
                        "  hosts:\n"
                        "    up.example.test: "
                     << Upstream::kAddr << "\n";
  return cfg;
}

class OpenNetworkApi : public ::testing::Test {
 protected:
  OpenNetworkApi()
      : daemon_({"--backend", "ns", "--config", open_config(dir_, /*allow_private=*/true)}),
        api_(daemon_) {}

  // The probe's one line of output from box `id` (as the session user).
  std::string probe(Api& api, const std::string& id, const std::string& kind,
                    const std::string& host, const std::string& port) {
    auto r =
        api.exec(id, {{"argv", {"python3", "-c", kProbe, kind, host, port}}, {"timeout_sec", 30}});
    if (r.status != 200) return "exec failed: " + r.raw;
    std::string out = r.body.value("stdout", "");
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out.empty() ? "no output: " + r.body.value("stderr", "") : out;
  }
  std::string probe(const std::string& id, const std::string& kind, const std::string& host,
                    const std::string& port) {
    return probe(api_, id, kind, host, port);
  }
  // The box's default gateway, read from /proc/net/route (hex, little-endian): the box has no
  // netlink for `ip route`.
  std::string gateway_of(const std::string& id) {
    auto gw = api_.sh(id,
                      "g=$(awk '$2==\"00000000\"{print $3}' /proc/net/route); printf "
                      "'%d.%d.%d.%d\\n' $(echo $g | sed 's/\\(..\\)\\(..\\)\\(..\\)\\(..\\)/0x\\4 "
                      "0x\\3 0x\\2 0x\\1/')");
    std::string out = gw.body.value("stdout", "");
    return out.substr(0, out.find('\n'));
  }
  std::string daemon_port() const {
    const std::string hp = daemon_.host_port();
    return hp.substr(hp.rfind(':') + 1);
  }

  Upstream up_;
  TempDir dir_;
  Daemon daemon_;
  Api api_;
};

TEST_F(OpenNetworkApi, OpenBoxReachesAnAllowedTargetOverTcpAndUdp) {
  auto c = api_.post("/v1/sessions", {{"id", "op"}, {"network", {{"mode", "open"}}}});
  ASSERT_EQ(c.status, 201) << c;
  EXPECT_EQ(c.body["network"]["mode"], "open") << c;
  // No proxy variables: the box's own route out, masqueraded to the host's address.
  // (The box has no netlink: its seccomp filter refuses AF_NETLINK, so /proc is read, not `ip`.)
  auto env = api_.sh("op", "echo \"[$HTTP_PROXY]\"; grep -c '^eth0[[:space:]]00000000' /proc/net/route");
  EXPECT_EQ(env.body["stdout"], "[]\n1\n") << env;
  EXPECT_EQ(probe("op", "http", Upstream::kAddr, "8080"),
            std::string("HTTP upstream saw ") + Upstream::kOurAddr);
  // UDP out (a DNS-port echo): the reply comes back through the NAT.
  EXPECT_EQ(probe("op", "udp", Upstream::kAddr, "53"), "UDP echo:ping");
  auto curl =
      api_.sh("op", std::string("curl -sS --max-time 10 http://") + Upstream::kAddr + ":8080/x");
  EXPECT_EQ(curl.body["stdout"], std::string("upstream saw ") + Upstream::kOurAddr + "\n") << curl;
  EXPECT_EQ(up_.peers(), std::string("tcp ") + Upstream::kOurAddr + "\nudp " + Upstream::kOurAddr +
                             "\ntcp " + Upstream::kOurAddr + "\n");
}

// POST /v1/sessions/{id}/network on a running session (API.md "Network"): none -> allowlist ->
// open -> none without a suspend (a file in the box's /tmp, a tmpfs, lives through it all), each
// mode in force for the next command, and a connection the new mode refuses is cut at once.
TEST_F(OpenNetworkApi, ModeChangesLiveAndCutsWhatTheNewModeRefuses) {
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "lv"}}).status, 201);
  ASSERT_EQ(api_.sh("lv", "echo up > /tmp/alive").body["exit_code"], 0);
  const std::string up = std::string("HTTP upstream saw ") + Upstream::kOurAddr;
  EXPECT_NE(probe("lv", "http", Upstream::kAddr, "8080"), up);
  auto mode = [&](const json& body) {
    auto r = api_.post("/v1/sessions/lv/network", body);
    EXPECT_EQ(r.status, 200) << r;
    return r.body["network"]["mode"];
  };
  // Holds a connection to host:port in the box until it ends; "CUT <why>" then (60 s at most).
  auto hold = [&](const std::string& host, int port) {
    return std::async(std::launch::async, [this, host, port] {
      Api api(daemon_);
      const std::string py =
          "import socket,errno\ns=socket.create_connection(('" + host + "'," +
          std::to_string(port) +
          "),timeout=60)\nopen('/workspace/held','w').close()\ntry:\n"
          "  print('CUT', 'EOF' if not s.recv(1) else 'DATA')\nexcept socket.timeout:\n"
          "  print('TIMEOUT')\nexcept OSError as e:\n"
          "  print('CUT', errno.errorcode.get(e.errno, e))\n";
      auto r = api.exec("lv", {{"argv", {"python3", "-c", py}}, {"timeout_sec", 90}});
      return r.body.value("stdout", r.raw);
    });
  };
  auto held = [&] {
    return eventually([&] { return api_.sh("lv", "rm /workspace/held").body["exit_code"] == 0; });
  };

  EXPECT_EQ(mode({{"mode", "allowlist"}, {"allow", {"up.example.test:8080"}}}), "allowlist");
  auto via_proxy = api_.sh("lv", "curl -sS --max-time 10 http://up.example.test:8080/x");
  EXPECT_EQ(via_proxy.body["stdout"], std::string("upstream saw ") + Upstream::kOurAddr + "\n")
      << via_proxy;
  auto to_proxy = hold("127.0.0.1", 3128);
  ASSERT_TRUE(held());

  // allowlist -> open: the proxy's connections end, the box routes out itself, no proxy vars.
  EXPECT_EQ(mode({{"mode", "open"}}), "open");
  const std::string proxy_end = to_proxy.get();  // EOF, or ECONNRESET: closed either way
  EXPECT_EQ(proxy_end.rfind("CUT ", 0), 0u) << proxy_end;
  EXPECT_EQ(api_.sh("lv", "echo \"[$HTTP_PROXY]\"").body["stdout"], "[]\n");
  EXPECT_EQ(probe("lv", "http", Upstream::kAddr, "8080"), up);
  auto direct = hold(Upstream::kAddr, 7001);
  ASSERT_TRUE(held());

  // open -> none: the flow out is aborted, nothing leaves the box any more.
  EXPECT_EQ(mode({{"mode", "none"}}), "none");
  EXPECT_EQ(direct.get(), "CUT ECONNABORTED\n");
  EXPECT_NE(probe("lv", "http", Upstream::kAddr, "8080"), up);
  EXPECT_EQ(api_.sh("lv", "cat /tmp/alive").body["stdout"], "up\n");  // never suspended
  auto s = api_.get("/v1/sessions/lv");
  EXPECT_EQ(s.body["state"], "running") << s;
  EXPECT_EQ(s.body["network"]["mode"], "none") << s;
}

TEST_F(OpenNetworkApi, OpenBoxCannotReachTheHostTheDaemonMetadataOrOtherBoxes) {
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "oa"}, {"network", {{"mode", "open"}}}}).status, 201);
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "ob"}, {"network", {{"mode", "open"}}}}).status, 201);
  // The daemon's port on the host's loopback: the box's 127.0.0.1 is its own, empty loopback.
  EXPECT_EQ(probe("oa", "tcp", "127.0.0.1", daemon_port()), "ECONNREFUSED");
  // The host itself on any of its addresses (the box's gateway, the host's other interface),
  // where a listener on 0.0.0.0 waits: refused by the host's input filter.
  HostListener any("0.0.0.0");
  const std::string gateway = gateway_of("oa");
  ASSERT_FALSE(gateway.empty());
  EXPECT_EQ(probe("oa", "tcp", gateway, any.port()), "EHOSTUNREACH");
  EXPECT_EQ(probe("oa", "tcp", gateway, daemon_port()), "EHOSTUNREACH");
  EXPECT_EQ(probe("oa", "tcp", Upstream::kOurAddr, any.port()), "EHOSTUNREACH");
  // Link-local/metadata, TCP and UDP; IPv6 at all.
  EXPECT_EQ(probe("oa", "tcp", "169.254.169.254", "80"), "EHOSTUNREACH");
  EXPECT_EQ(probe("oa", "udp", "169.254.169.254", "53"), "EPERM");  // UDP: the send fails
  EXPECT_EQ(probe("oa", "tcp", "::ffff:169.254.169.254", "80"), "EHOSTUNREACH");
  // Another box (its address is in the box pool, never reachable).
  // Its address is its gateway's + 1 (a /30 each: pool+4N+1 the host side, +2 the box).
  const std::string ob_gateway = gateway_of("ob");
  ASSERT_FALSE(ob_gateway.empty());
  const std::string other = ob_gateway.substr(0, ob_gateway.rfind('.') + 1) +
                            std::to_string(std::stoi(ob_gateway.substr(ob_gateway.rfind('.') + 1)) + 1);
  auto listen = api_.post("/v1/sessions/ob/processes",
                          {{"argv",
                            {"python3", "-c",
                             "import socket,time\ns=socket.socket()\n"
                             "s.bind(('0.0.0.0',7000));s.listen(4);time.sleep(60)"}}});
  ASSERT_EQ(listen.status, 201) << listen;
  ASSERT_TRUE(eventually(
      // 7000 = 0x1B58, state 0A = LISTEN (no `ss`: the box has no netlink).
      [&] {
        return api_.sh("ob", "grep -q ':1B58 00000000:0000 0A' /proc/net/tcp")
                   .body.value("exit_code", 1) == 0;
      }));
  EXPECT_EQ(probe("oa", "tcp", other, "7000"), "EHOSTUNREACH");
  // The session user cannot change the network: route, address, link, filter; no raw sockets.
  // (`ip` fails before it asks: the box's seccomp filter refuses netlink sockets; without the
  // filter the kernel would refuse it for want of CAP_NET_ADMIN.) The routes stay as they were.
  const std::string routes = api_.sh("oa", "cat /proc/net/route").body.value("stdout", "");
  auto route = api_.sh("oa", "ip route add 192.0.2.0/24 dev eth0 2>&1; echo rc=$?");
  EXPECT_EQ(route.body.value("stdout", "").find("rc=0"), std::string::npos) << route;
  auto addr = api_.sh("oa", "ip addr add 10.77.0.9/24 dev eth0 2>&1; echo rc=$?");
  EXPECT_EQ(addr.body.value("stdout", "").find("rc=0"), std::string::npos) << addr;
  EXPECT_EQ(api_.sh("oa", "cat /proc/net/route").body.value("stdout", ""), routes);
  auto flush = api_.sh("oa", "nft flush ruleset 2>&1; echo rc=$?");
  EXPECT_EQ(flush.body.value("stdout", "").find("rc=0"), std::string::npos) << flush;
  auto raw = api_.exec(
      "oa",
      {{"argv",
        {"python3", "-c",
         "import socket\n"
         "try: socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP); print('RAW')\n"
         "except PermissionError: print('EPERM')\n"}}});
  EXPECT_EQ(raw.body["stdout"], "EPERM\n") << raw;
  // After all that the box still reaches what it may, and nothing above reached the upstream.
  EXPECT_EQ(probe("oa", "http", Upstream::kAddr, "8080"),
            std::string("HTTP upstream saw ") + Upstream::kOurAddr);
  EXPECT_EQ(up_.peers(), std::string("tcp ") + Upstream::kOurAddr + "\n");
}

TEST_F(OpenNetworkApi, WithoutAllowPrivateAnOpenBoxCannotReachPrivateAddresses) {
  TempDir dir;
  Daemon strict({"--backend", "ns", "--config", open_config(dir, /*allow_private=*/false)});
  Api api(strict);
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "os"}, {"network", {{"mode", "open"}}}}).status, 201);
  EXPECT_EQ(probe(api, "os", "tcp", Upstream::kAddr, "8080"), "EHOSTUNREACH");
  EXPECT_EQ(probe(api, "os", "udp", Upstream::kAddr, "53"), "EPERM");
  for (const char* a : {"192.168.1.1", "172.16.0.1", "100.64.0.1"}) {
    EXPECT_EQ(probe(api, "os", "tcp", a, "80"), "EHOSTUNREACH") << a;
  }
  // The box of the daemon that allows private ranges, side by side, still does.
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "op"}, {"network", {{"mode", "open"}}}}).status, 201);
  EXPECT_EQ(probe("op", "udp", Upstream::kAddr, "53"), "UDP echo:ping");
  EXPECT_EQ(up_.peers(), std::string("udp ") + Upstream::kOurAddr + "\n");
}

TEST_F(OpenNetworkApi, NoneAndAllowlistBoxesSendNoUdpAndNoDirectTcp) {
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "nn"}}).status, 201);
  ASSERT_EQ(api_.post("/v1/sessions",
                      {{"id", "al"},
                       {"network", {{"mode", "allowlist"}, {"allow", {"up.example.test:8080"}}}}})
                .status,
            201);
  for (const char* id : {"nn", "al"}) {
    EXPECT_EQ(probe(id, "udp", Upstream::kAddr, "53"), "ENETUNREACH") << id;
    EXPECT_EQ(probe(id, "tcp", Upstream::kAddr, "8080"), "ENETUNREACH") << id;
    auto dns = api_.exec(
        id, {{"argv",
              {"python3", "-c",
               "import socket\ntry: socket.getaddrinfo('leak.example.test',80); print('RESOLVED')\n"
               "except OSError: print('NORESOLVE')\n"}}});
    EXPECT_EQ(dns.body["stdout"], "NORESOLVE\n") << id << dns;
  }
  EXPECT_EQ(up_.peers(), "");
  // Through the proxy, the allowlist box gets there (network.hosts names the upstream).
  auto r = api_.sh("al", "curl -sS --max-time 10 http://up.example.test:8080/");
  EXPECT_EQ(r.body["stdout"], std::string("upstream saw ") + Upstream::kOurAddr + "\n") << r;
}

// A suspended session takes a mode change when it resumes (a running one switches at once:
// ModeChangesLiveAndCutsWhatTheNewModeRefuses).
TEST_F(OpenNetworkApi, ModeChangesOfASuspendedSessionApplyWhenItResumes) {
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "mc"}}).status, 201);
  EXPECT_EQ(probe("mc", "tcp", Upstream::kAddr, "8080"), "ENETUNREACH");
  // Suspended: the answer says the new mode and that the session is suspended; it applies on
  // resume.
  ASSERT_EQ(api_.post("/v1/sessions/mc/suspend", json::object()).status, 200);
  auto to_open = api_.post("/v1/sessions/mc/network", {{"mode", "open"}});
  ASSERT_EQ(to_open.status, 200) << to_open;
  EXPECT_EQ(to_open.body["network"]["mode"], "open") << to_open;
  EXPECT_EQ(to_open.body["state"], "suspended") << to_open;
  EXPECT_EQ(probe("mc", "http", Upstream::kAddr, "8080"),
            std::string("HTTP upstream saw ") + Upstream::kOurAddr);
  // open -> allowlist: the proxy and its variables, no route.
  ASSERT_EQ(api_.post("/v1/sessions/mc/suspend", json::object()).status, 200);
  auto to_al = api_.post("/v1/sessions/mc/network",
                         {{"mode", "allowlist"}, {"allow", {"up.example.test:8080"}}});
  ASSERT_EQ(to_al.status, 200) << to_al;
  EXPECT_EQ(probe("mc", "tcp", Upstream::kAddr, "8080"), "ENETUNREACH");
  auto via = api_.sh("mc", "curl -sS --max-time 10 http://up.example.test:8080/");
  EXPECT_EQ(via.body["stdout"], std::string("upstream saw ") + Upstream::kOurAddr + "\n") << via;
  // allowlist -> none.
  ASSERT_EQ(api_.post("/v1/sessions/mc/suspend", json::object()).status, 200);
  ASSERT_EQ(api_.post("/v1/sessions/mc/network", {{"mode", "none"}}).status, 200);
  auto none = api_.sh("mc",
                      "echo \"[$HTTP_PROXY]\"; curl -sS --max-time 5 http://up.example.test:8080/ "
                      ">/dev/null 2>&1; echo rc=$?");
  EXPECT_NE(none.body["stdout"].get<std::string>().find("[]\n"), std::string::npos) << none;
  EXPECT_EQ(none.body["stdout"].get<std::string>().find("rc=0"), std::string::npos) << none;
  EXPECT_EQ(up_.peers(),
            std::string("tcp ") + Upstream::kOurAddr + "\ntcp " + Upstream::kOurAddr + "\n");
}

// The proxy of a real box under abuse (SECURITY.md T6 faults): garbage, a client that never
// finishes its head, more CONNECTs than the per-session cap, and a target that never answers.
TEST_F(OpenNetworkApi, ProxyFaultsGarbageSlowlorisFloodAndSilentTarget) {
  const json al = {{"mode", "allowlist"}, {"allow", {"up.example.test:8080", "up.example.test:9"}}};
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "fa"}, {"network", al}}).status, 201);
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "fb"}, {"network", al}}).status, 201);
  // Garbage: 400, and the proxy serves on.
  auto g = api_.exec("fa", {{"argv",
                             {"python3", "-c",
                              "import socket\ns=socket.create_connection(('127.0.0.1',3128))\n"
                              "s.sendall(b'\\x00\\xff garbage \\r\\n\\r\\n')\n"
                              "print(s.recv(200).split(b'\\r\\n')[0].decode())\n"}}});
  EXPECT_EQ(g.body["stdout"], "HTTP/1.1 400 Bad Request\n") << g;
  // Slowloris: a head that never ends is cut at the header timeout (10 s).
  auto slow = api_.exec(
      "fa",
      {{"argv",
        {"python3", "-c",
         "import socket,time\ns=socket.create_connection(('127.0.0.1',3128))\n"
         "s.sendall(b'CONNECT up.example.test:8080 HTTP/1.1\\r\\nX-a: ')\n"
         "t=time.time();s.settimeout(40)\n"
         "try:\n  d=s.recv(200)\nexcept OSError as e: d=b'ERR'\n"
         "print('closed' if time.time()-t < 30 else 'kept', d.split(b'\\r\\n')[0].decode())\n"}},
       {"timeout_sec", 60}});
  EXPECT_EQ(slow.body.value("stdout", ""), "closed HTTP/1.1 408 Request Timeout\n") << slow;
  // A flood of 400 connections from one box: past the cap (256 per session) the proxy answers
  // 503 and closes; the daemon's fds stay bounded; the other session is served meanwhile.
  const std::string fd_dir = "/proc/" + std::to_string(daemon_.pid()) + "/fd";
  auto count_fds = [&] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(fd_dir)) ++n;
    return n;
  };
  const size_t fds_before = count_fds();
  auto flood =
      api_.post("/v1/sessions/fa/processes",
                {{"argv",
                  {"python3", "-c",
                   "import socket,select,time\n"
                   "ss=[socket.create_connection(('127.0.0.1',3128)) for i in range(400)]\n"
                   "time.sleep(1)\n"
                   "r,_,_=select.select(ss,[],[],1)\n"
                   "busy=sum(1 for s in r if s.recv(100).startswith(b'HTTP/1.1 503 '))\n"
                   "open('/workspace/flood.out','w').write('busy %d\\n'%busy)\n"
                   "time.sleep(30)\n"}}});
  ASSERT_EQ(flood.status, 201) << flood;
  ASSERT_TRUE(eventually(
      [&] { return api_.sh("fa", "test -s /workspace/flood.out").body.value("exit_code", 1) == 0; },
      30));
  const size_t fds_during = count_fds();
  EXPECT_LT(fds_during, fds_before + 256 + 64) << fds_before << " -> " << fds_during;
  EXPECT_EQ(api_.sh("fa", "cat /workspace/flood.out").body["stdout"], "busy 144\n");
  auto other = api_.sh("fb", "curl -sS --max-time 10 http://up.example.test:8080/");
  EXPECT_EQ(other.body["stdout"], std::string("upstream saw ") + Upstream::kOurAddr + "\n")
      << other;
  // A target that never answers (SYNs dropped): 504 naming it, after the connect timeout.
  auto silent = api_.sh("fb",
                        "curl -sS --max-time 40 -o /workspace/silent.out -w '%{http_code}' "
                        "-x http://127.0.0.1:3128 http://up.example.test:9/; "
                        "cat /workspace/silent.out");
  EXPECT_NE(silent.body.value("stdout", "").find("504"), std::string::npos) << silent;
  EXPECT_NE(silent.body.value("stdout", "").find("up.example.test:9"), std::string::npos) << silent;
}

}  // namespace
}  // namespace agentbox::testing
