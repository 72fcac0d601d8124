// SECURITY.md T10, the process items: the process attach and pty WebSockets require auth (the
// header or ?token=); tenant B can neither list, get, attach to, signal, write the stdin of, nor
// read the output of tenant A's processes (404, exactly like a missing session); a WebSocket
// upgrade from a browser Origin the operator did not allow is refused (CSWSH). Real ns boxes,
// real upgrades over loopback.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "security/box_fixture.h"

namespace agentbox::security {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// One WebSocket upgrade request, written by hand so every header is what the test says (a
// browser's Origin, a token or none). Returns the raw response head (and body, if any).
std::string upgrade(Daemon& d, const std::string& target, const std::vector<std::string>& headers) {
  RawConnection c(d.host_port());
  std::string req = "GET " + target + " HTTP/1.1\r\nHost: " + d.host_port() +
                    "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  req += "\r\n";
  if (!c.send(req)) return "";
  return c.read_response(std::chrono::seconds(30));
}

std::string bearer(const std::string& token) {
  return "Authorization: Bearer " + token;
}

// The status of an upgrade that should be let in. A process takes one attacher at a time, and
// the server notices the previous test socket's end a moment after it closed: 409 is retried.
int admitted_status(Daemon& d, const std::string& target, const std::vector<std::string>& headers) {
  int status = -1;
  for (int i = 0; i < 100; ++i) {
    status = http_status_of(upgrade(d, target, headers));
    if (status != 409) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return status;
}

// The processes of session `id` as `client` sees them (the reply object; "status" added).
json list_processes(client::Client& c, const std::string& id) {
  auto r = c.request("GET", "/v1/sessions/" + id + "/processes");
  if (!r) return json{{"status", 0}};
  json j = json::parse(r->body, nullptr, false);
  if (!j.is_object()) j = json::object();
  j["status"] = r->status;
  return j;
}

json start_process(client::Client& c, const std::string& id, const json& body) {
  auto r = c.request("POST", "/v1/sessions/" + id + "/processes", body.dump());
  if (!r) return json{{"status", 0}};
  json j = json::parse(r->body, nullptr, false);
  if (!j.is_object()) j = json::object();
  j["status"] = r->status;
  return j;
}

TEST(ProcessesSecurity, AttachAndPtyWebSocketsRequireAuth) {
  Daemon& d = shared_daemon();
  Box a(d, "t10-auth");
  auto started =
      start_process(a.client(), a.id(), {{"command", "exec cat"}, {"tag", "srv"}, {"stdin", true}});
  ASSERT_EQ(started.value("status", 0), 201) << started;
  const std::string attach = "/v1/sessions/t10-auth/processes/srv/attach";
  const std::string pty = "/v1/sessions/t10-auth/pty?cols=80&rows=24&command=sleep%20600";

  struct Case {
    std::string target;
    std::vector<std::string> headers;
  };
  const std::vector<Case> refused = {
      {attach, {}},
      {attach, {bearer("wrong-token")}},
      {attach + "?token=wrong-token", {}},
      {attach + "?token=", {}},
      {attach + "?token=" + std::string(kSuiteToken) + "x", {}},
      {pty, {}},
      {pty, {bearer("wrong-token")}},
      {pty + "&token=wrong-token", {}},
  };
  for (const auto& c : refused) {
    std::string res = upgrade(d, c.target, c.headers);
    EXPECT_EQ(http_status_of(res), 401) << c.target << "\n" << res;
    EXPECT_THAT(res, HasSubstr("EUNAUTHORIZED")) << c.target;
  }
  // None of the refused pty upgrades started a terminal.
  auto l = list_processes(a.client(), a.id());
  ASSERT_EQ(l.value("status", 0), 200) << l;
  EXPECT_EQ(l["processes"].size(), 1u) << l;

  // The controls: the right token, in the header or the query, is let in.
  EXPECT_EQ(admitted_status(d, attach + "?token=" + kSuiteToken, {}), 101);
  EXPECT_EQ(admitted_status(d, attach, {bearer(kSuiteToken)}), 101);
  EXPECT_EQ(admitted_status(d, pty, {bearer(kSuiteToken)}), 101);
}

constexpr char kTokenA[] = "t10-token-a-0123456789";
constexpr char kTokenB[] = "t10-token-b-0123456789";

TEST(ProcessesSecurity, AnotherTenantsProcessesAre404LikeAMissingSession) {
  testing::TempDir dir("agentbox-t10-tenants");
  const std::string config = dir / "tenants.yaml";
  ASSERT_TRUE(testing::spit(config, std::string("tenants:\n") + "  - {name: a, tokens: [" +
                                        kTokenA + "]}\n" + "  - {name: b, tokens: [" + kTokenB +
                                        "]}\n"));
  Daemon d({"--backend", "ns", "--config", config});
  Box a(d, "t10-tenant-a", json::object(), kTokenA);
  auto started =
      start_process(a.client(), a.id(),
                    {{"command", "echo secret-output; while read l; do echo \"a:$l\"; done"},
                     {"tag", "srv"},
                     {"stdin", true}});
  ASSERT_EQ(started.value("status", 0), 201) << started;
  const std::string pid = std::to_string(started.value("pid", 0));
  client::Client b(d.options(kTokenB));

  // Each call by B on A's session, and the same call on a session nobody has: same status,
  // same body (the id swapped), so B cannot even tell A's session exists.
  struct Call {
    const char* method;
    std::string path;  // after /v1/sessions/<id>
    std::string body;
    const char* type;
  };
  const std::vector<Call> calls = {
      {"GET", "/processes", "", "application/json"},
      {"GET", "/processes/srv", "", "application/json"},
      {"GET", "/processes/" + pid, "", "application/json"},
      {"GET", "/processes/srv/output", "", "application/json"},
      {"GET", "/processes/srv/output?follow=true&since=0", "", "application/json"},
      {"POST", "/processes/srv/stdin", "pwned\n", "application/octet-stream"},
      {"POST", "/processes/srv/stdin?close=true", "", "application/octet-stream"},
      {"POST", "/processes/srv/signal", R"({"signal":"SIGKILL"})", "application/json"},
      {"POST", "/processes/" + pid + "/signal", R"({"signal":"SIGTERM"})", "application/json"},
      {"POST", "/processes/srv/resize", R"({"cols":100,"rows":40})", "application/json"},
      {"DELETE", "/processes/srv", "", "application/json"},
  };
  const std::string missing_id = "t10-tenant-z";
  for (const auto& c : calls) {
    auto theirs = b.request(c.method, "/v1/sessions/" + a.id() + c.path, c.body, c.type);
    auto none = b.request(c.method, "/v1/sessions/" + missing_id + c.path, c.body, c.type);
    ASSERT_TRUE(theirs && none) << c.method << " " << c.path;
    EXPECT_EQ(theirs->status, 404) << c.method << " " << c.path << ": " << theirs->body;
    EXPECT_EQ(none->status, 404) << c.method << " " << c.path << ": " << none->body;
    std::string body = theirs->body;
    for (auto at = body.find(a.id()); at != std::string::npos; at = body.find(a.id(), at)) {
      body.replace(at, a.id().size(), missing_id);
    }
    EXPECT_EQ(body, none->body) << c.method << " " << c.path;
    EXPECT_THAT(theirs->body, Not(HasSubstr("secret-output"))) << c.method << " " << c.path;
  }
  // Attach over WebSocket: refused before the upgrade, as for a missing session.
  for (const std::string& ref : {std::string("srv"), pid}) {
    std::string res =
        upgrade(d, "/v1/sessions/" + a.id() + "/processes/" + ref + "/attach", {bearer(kTokenB)});
    EXPECT_EQ(http_status_of(res), 404) << res;
    EXPECT_THAT(res, Not(HasSubstr("secret-output")));
    std::string q =
        upgrade(d, "/v1/sessions/" + a.id() + "/processes/" + ref + "/attach?token=" + kTokenB, {});
    EXPECT_EQ(http_status_of(q), 404) << q;
  }
  // The creating routes cannot start anything in A's session either (its id is taken).
  auto start = start_process(b, a.id(), {{"command", "echo pwned > /workspace/pwned"}});
  EXPECT_NE(start.value("status", 0) / 100, 2) << start;
  std::string pty =
      upgrade(d, "/v1/sessions/" + a.id() + "/pty?command=sleep%20600", {bearer(kTokenB)});
  EXPECT_NE(http_status_of(pty), 101) << pty;

  // A's process is untouched: still running, alone, its stdin never got B's line, and it
  // still answers its owner.
  auto mine = list_processes(a.client(), a.id());
  ASSERT_EQ(mine.value("status", 0), 200) << mine;
  ASSERT_EQ(mine["processes"].size(), 1u) << mine;
  EXPECT_EQ(mine["processes"][0]["state"], "running") << mine;
  auto w = a.client().request("POST", "/v1/sessions/" + a.id() + "/processes/srv/stdin?close=true",
                              "mine\n", "application/octet-stream");
  ASSERT_TRUE(w && w->status == 200) << (w ? w->body : w.error().message);
  auto out =
      a.client().request("GET", "/v1/sessions/" + a.id() + "/processes/srv/output?follow=true");
  ASSERT_TRUE(out && out->status == 200);
  EXPECT_THAT(out->body, HasSubstr("secret-output"));
  EXPECT_THAT(out->body, HasSubstr("a:mine"));
  EXPECT_THAT(out->body, Not(HasSubstr("pwned")));
  EXPECT_EQ(a.sh("ls -A /workspace").value("stdout", ""), ".probe\n");
}

TEST(ProcessesSecurity, WebSocketFromABrowserOriginNotAllowedIsRefused) {
  // The shared daemon allows no origin: any Origin header on an upgrade is refused, even with
  // the right token (the page may have learnt it).
  Daemon& d = shared_daemon();
  Box a(d, "t10-origin");
  auto started =
      start_process(a.client(), a.id(), {{"command", "exec cat"}, {"tag", "srv"}, {"stdin", true}});
  ASSERT_EQ(started.value("status", 0), 201) << started;
  const std::string attach = "/v1/sessions/t10-origin/processes/srv/attach";
  const std::string pty = "/v1/sessions/t10-origin/pty?command=sleep%20600";
  for (const std::string& target : {attach, pty, std::string("/v1/events")}) {
    for (const char* origin : {"https://evil.example.org", "null", "http://127.0.0.1:9090"}) {
      std::string res = upgrade(d, target, {bearer(kSuiteToken), std::string("Origin: ") + origin});
      EXPECT_EQ(http_status_of(res), 403) << target << " " << origin << "\n" << res;
      EXPECT_THAT(res, HasSubstr("EACCES"));
      EXPECT_THAT(res, HasSubstr(origin)) << "the refusal names the origin";
      std::string q = upgrade(
          d, target + (target.find('?') == std::string::npos ? "?" : "&") + "token=" + kSuiteToken,
          {std::string("Origin: ") + origin});
      EXPECT_EQ(http_status_of(q), 403) << target << " " << origin << "\n" << q;
    }
  }
  // No terminal was started by the refused pty upgrades; without an Origin (not a browser) the
  // same upgrade is let in.
  auto l = list_processes(a.client(), a.id());
  ASSERT_EQ(l.value("status", 0), 200) << l;
  EXPECT_EQ(l["processes"].size(), 1u) << l;
  EXPECT_EQ(admitted_status(d, attach, {bearer(kSuiteToken)}), 101);

  // A daemon that lists an origin lets exactly that one in (scheme and host compare without
  // regard to case, as browsers send them lower-case anyway), and still refuses the rest.
  testing::TempDir dir("agentbox-t10-origins");
  const std::string config = dir / "origins.yaml";
  ASSERT_TRUE(testing::spit(config, "allowed_origins: [https://app.example.org]\n"));
  for (const std::vector<std::string>& how :
       {std::vector<std::string>{"--allow-origin", "https://app.example.org"},
        std::vector<std::string>{"--config", config}}) {
    std::vector<std::string> args = {"--backend", "ns", "--token", kTokenA};
    args.insert(args.end(), how.begin(), how.end());
    Daemon o(args);
    Box b(o, "t10-origin-ok", json::object(), kTokenA);
    ASSERT_EQ(start_process(b.client(), b.id(),
                            {{"command", "exec cat"}, {"tag", "srv"}, {"stdin", true}})
                  .value("status", 0),
              201);
    const std::string t = "/v1/sessions/t10-origin-ok/processes/srv/attach";
    EXPECT_EQ(admitted_status(o, t, {bearer(kTokenA), "Origin: https://app.example.org"}), 101);
    EXPECT_EQ(admitted_status(o, t, {bearer(kTokenA), "Origin: HTTPS://App.Example.ORG"}), 101);
    for (const char* other : {"https://app.example.org.evil.test", "http://app.example.org",
                              "https://app.example.org:8443", "https://evil.test", "null"}) {
      EXPECT_EQ(http_status_of(upgrade(o, t, {bearer(kTokenA), std::string("Origin: ") + other})),
                403)
          << other;
    }
    // Auth still comes first: the allowed origin without a token is 401.
    EXPECT_EQ(http_status_of(upgrade(o, t, {"Origin: https://app.example.org"})), 401);
  }

  // A malformed allowed origin is a configuration error: the daemon does not start.
  for (const char* bad : {"https://app.example.org/", "app.example.org", "*",
                          "https://*.example.org", "https://App.example.org"}) {
    std::string out;
    int rc = Daemon::run_to_exit({"--listen", "127.0.0.1:0", "--backend", "host", "--data-dir",
                                  dir / "data", "--allow-origin", bad},
                                 &out);
    EXPECT_NE(rc, 0) << bad << ": " << out;
    EXPECT_THAT(out, HasSubstr("allowed origin")) << bad << ": " << out;
  }
}

}  // namespace
}  // namespace agentbox::security
