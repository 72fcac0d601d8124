// Network egress against the real daemon (API.md "Network", issue 12): a session with network
// mode "allowlist" reaches a local HTTP server named through the config's `network.hosts` via
// the proxy the daemon serves inside the box's netns; a name not listed is 403 naming it and a
// `net.deny` audit line; a "none" box reaches nothing; POST /v1/sessions/{id}/network changes a
// live policy. Only this machine: the server listens on the host's loopback.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;

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
  auto open = api_.post("/v1/sessions", {{"id", "op"}, {"network", {{"mode", "open"}}}});
  EXPECT_EQ(open.status, 501) << open;
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

  // Bad input changes nothing; a mode change is not built; unknown sessions are 404.
  auto bad = api_.post("/v1/sessions/ch/network", {{"mode", "allowlist"}, {"allow", {"a b"}}});
  EXPECT_EQ(bad.status, 400) << bad;
  auto mode = api_.post("/v1/sessions/ch/network", {{"mode", "none"}});
  EXPECT_EQ(mode.status, 501) << mode;
  EXPECT_EQ(mode.code(), "ENOTSUP") << mode;
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
}

}  // namespace
}  // namespace agentbox::testing
