// SECURITY.md T13, the dashboard (API.md "Dashboard"): its files are served without a token and
// with a policy that forbids inline script and outside origins; `ui: false` turns them off; a
// WebSocket ticket is single-use, short-lived and bound to the caller that asked for it; a
// WebSocket from any browser Origin but the daemon's own (and the operator's allowed_origins)
// is 403, also through a DNS name rebound to the daemon; no reply ever carries a CORS grant.
// The browser side (no token in any URL, the policy enforced by chromium) is tests/ui.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "client/client.h"
#include "integration/daemon.h"
#include "support/support.h"

namespace agentbox::security {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kTokenA[] = "t13-token-a-0123456789abcdef";
constexpr char kTokenB[] = "t13-token-b-0123456789abcdef";

// One request written by hand (its Host and Origin are what the test says). Returns the raw
// response head and body.
std::string raw(Daemon& d, const std::string& method, const std::string& target,
                const std::vector<std::string>& headers, const std::string& host = "") {
  RawConnection c(d.host_port());
  std::string req = method + " " + target +
                    " HTTP/1.1\r\nHost: " + (host.empty() ? d.host_port() : host) + "\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  req += "Content-Length: 0\r\n\r\n";
  if (!c.send(req)) return "";
  return c.read_response(std::chrono::seconds(30));
}

std::string upgrade(Daemon& d, const std::string& target, std::vector<std::string> headers,
                    const std::string& host = "") {
  headers.insert(headers.begin(),
                 {"Upgrade: websocket", "Connection: Upgrade",
                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"});
  return raw(d, "GET", target, headers, host);
}

// A response header's value ("" when absent); names compare without regard to case.
std::string header(const std::string& response, std::string name) {
  std::string lower = response.substr(0, response.find("\r\n\r\n"));
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  auto at = lower.find("\r\n" + name + ":");
  if (at == std::string::npos) return "";
  auto start = at + 2 + name.size() + 1;
  auto end = response.find("\r\n", start);
  std::string v = response.substr(start, end - start);
  while (!v.empty() && v.front() == ' ') v.erase(0, 1);
  return v;
}

std::string body_of(const std::string& response) {
  auto at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// The sources of one CSP directive ("script-src 'self'" -> "'self'").
std::string directive(const std::string& csp, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(csp, m, std::regex("(^|;)\\s*" + name + "\\s+([^;]*)"))) return "<none>";
  return m[2];
}

std::string ticket(Daemon& d, const std::string& token) {
  client::Client c(d.options(token));
  auto r = c.request("POST", "/v1/ws-tickets", "{}");
  if (!r || r->status != 200) return "";
  return json::parse(r->body).value("ticket", "");
}

TEST(DashboardSecurity, FilesComeWithoutATokenUnderAPolicyForbiddingInlineScript) {
  Daemon d({"--token", kTokenA});
  std::string res = raw(d, "GET", "/ui/", {});
  ASSERT_EQ(http_status_of(res), 200) << res.substr(0, 400);
  EXPECT_THAT(header(res, "Content-Type"), HasSubstr("text/html"));
  const std::string csp = header(res, "Content-Security-Policy");
  EXPECT_EQ(directive(csp, "default-src"), "'self'") << csp;
  EXPECT_EQ(directive(csp, "script-src"), "'self'") << "no inline script, no eval: " << csp;
  EXPECT_EQ(directive(csp, "frame-ancestors"), "'none'") << csp;
  EXPECT_EQ(directive(csp, "object-src"), "'none'") << csp;
  EXPECT_EQ(directive(csp, "connect-src"),
            "'self' ws://" + d.host_port() + " wss://" + d.host_port())
      << "no outside origin: " << csp;
  EXPECT_THAT(csp, Not(HasSubstr("http:"))) << csp;
  EXPECT_THAT(csp, Not(HasSubstr("*"))) << csp;
  EXPECT_EQ(header(res, "X-Content-Type-Options"), "nosniff");
  EXPECT_EQ(header(res, "Referrer-Policy"), "no-referrer");
  EXPECT_EQ(header(res, "Access-Control-Allow-Origin"), "");
  EXPECT_EQ(header(res, "Set-Cookie"), "") << "no cookie auth: nothing to forge cross-site";
  // The page itself: every script is a file of this origin.
  const std::string page = body_of(res);
  EXPECT_THAT(page, HasSubstr("<script src=\"app.js\""));
  EXPECT_EQ(std::regex_search(page, std::regex("<script(?![^>]*\\bsrc=)[^>]*>")), false) << page;
  EXPECT_THAT(page, Not(HasSubstr("http://"))) << "nothing loaded from outside";
  EXPECT_THAT(page, Not(HasSubstr("https://")));

  std::string js = raw(d, "GET", "/ui/app.js", {});
  ASSERT_EQ(http_status_of(js), 200);
  EXPECT_THAT(header(js, "Content-Type"), HasSubstr("text/javascript"));
  EXPECT_EQ(header(js, "X-Content-Type-Options"), "nosniff");
  EXPECT_THAT(header(js, "Content-Security-Policy"), HasSubstr("script-src 'self'"));
  EXPECT_EQ(http_status_of(raw(d, "GET", "/ui/app.css", {})), 200);
  // Anything else under /ui is 404, and nothing there reads the disk.
  for (const char* t :
       {"/ui/nope.js", "/ui/../ui/app.js", "/ui/%2e%2e/etc/passwd", "/ui/app.js/x"}) {
    EXPECT_EQ(http_status_of(raw(d, "GET", t, {})), 404) << t;
  }
  std::string redirect = raw(d, "GET", "/ui", {});
  EXPECT_EQ(http_status_of(redirect), 301);
  EXPECT_EQ(header(redirect, "Location"), "/ui/");
  // The API around it still wants the token; a foreign page gets no CORS grant.
  std::string api = raw(d, "GET", "/v1/sessions", {"Origin: https://evil.example"});
  EXPECT_EQ(http_status_of(api), 401);
  api = raw(d, "GET", "/v1/sessions",
            {"Origin: https://evil.example", std::string("Authorization: Bearer ") + kTokenA});
  EXPECT_EQ(http_status_of(api), 200);
  EXPECT_EQ(header(api, "Access-Control-Allow-Origin"), "");
  EXPECT_EQ(http_status_of(raw(d, "OPTIONS", "/v1/sessions",
                               {"Origin: https://evil.example",
                                "Access-Control-Request-Method: "
                                "DELETE"})),
            401)
      << "a preflight is never granted";
}

TEST(DashboardSecurity, UiFalseTurnsTheDashboardOff) {
  testing::TempDir dir("agentbox-t13-ui");
  const std::string config = dir / "ui.yaml";
  ASSERT_TRUE(testing::spit(config, "ui: false\n"));
  for (const std::vector<std::string>& how :
       {std::vector<std::string>{"--no-ui"}, std::vector<std::string>{"--config", config}}) {
    std::vector<std::string> args = {"--token", kTokenA};
    args.insert(args.end(), how.begin(), how.end());
    Daemon d(args);
    for (const char* t : {"/ui/", "/ui/app.js", "/ui"}) {
      std::string res = raw(d, "GET", t, {});
      EXPECT_EQ(http_status_of(res), 404) << how.back() << " " << t;
      EXPECT_THAT(res, HasSubstr("ENOENT"));
    }
    // Without a dashboard the daemon's own origin is no exception either.
    std::string own = upgrade(
        d, "/v1/events",
        {std::string("Authorization: Bearer ") + kTokenA, "Origin: http://" + d.host_port()});
    EXPECT_EQ(http_status_of(own), 403) << own;
  }
}

TEST(DashboardSecurity, ATicketIsSingleUseAndBoundToItsCaller) {
  testing::TempDir dir("agentbox-t13-tickets");
  const std::string config = dir / "tenants.yaml";
  ASSERT_TRUE(testing::spit(config, std::string("tenants:\n  - {name: a, tokens: [") + kTokenA +
                                        "]}\n  - {name: b, tokens: [" + kTokenB + "]}\n"));
  Daemon d({"--config", config});
  // A ticket needs the token (in the header).
  EXPECT_EQ(http_status_of(raw(d, "POST", "/v1/ws-tickets", {})), 401);
  client::Client a(d.options(kTokenA));
  auto r = a.request("POST", "/v1/ws-tickets", "{}");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : r.error().message);
  json j = json::parse(r->body);
  EXPECT_EQ(j.value("expires_in", 0), 30);
  EXPECT_TRUE(std::regex_match(j.value("ticket", ""), std::regex("[0-9a-f]{64}"))) << j;
  EXPECT_EQ(r->headers["cache-control"], "no-store");
  EXPECT_EQ(a.request("POST", "/v1/ws-tickets", R"({"ttl": 600})")->status, 400)
      << "no field is silently ignored";

  // Single use.
  const std::string t = j["ticket"];
  EXPECT_EQ(http_status_of(upgrade(d, "/v1/events?ticket=" + t, {})), 101);
  EXPECT_EQ(http_status_of(upgrade(d, "/v1/events?ticket=" + t, {})), 401) << "used twice";
  EXPECT_EQ(http_status_of(upgrade(d, "/v1/events?ticket=" + std::string(64, 'a'), {})), 401);
  // Only WebSockets take one, and an HTTP request showing one does not spend it.
  const std::string u = ticket(d, kTokenA);
  EXPECT_EQ(http_status_of(raw(d, "GET", "/v1/sessions?ticket=" + u, {})), 401);
  EXPECT_EQ(http_status_of(upgrade(d, "/v1/events?ticket=" + u, {})), 101);

  // Bound to its caller: a's ticket opens a's terminal, and b's session is a's 404.
  client::Client b(d.options(kTokenB));
  ASSERT_EQ(a.request("POST", "/v1/sessions", R"({"id": "t13-a"})")->status, 201);
  ASSERT_EQ(b.request("POST", "/v1/sessions", R"({"id": "t13-b"})")->status, 201);
  EXPECT_EQ(http_status_of(
                upgrade(d, "/v1/sessions/t13-b/pty?command=true&ticket=" + ticket(d, kTokenA), {})),
            404);
  EXPECT_EQ(http_status_of(
                upgrade(d, "/v1/sessions/t13-a/pty?command=true&ticket=" + ticket(d, kTokenA), {})),
            101);
  auto procs = b.request("GET", "/v1/sessions/t13-b/processes");
  ASSERT_TRUE(procs && procs->status == 200);
  EXPECT_EQ(json::parse(procs->body)["processes"].size(), 0u) << "nothing ran in b's session";
}

TEST(DashboardSecurity, WebSocketsFromAnyOriginButTheDaemonsOwnAre403) {
  Daemon d({"--token", kTokenA});
  const std::string port = d.host_port().substr(d.host_port().rfind(':') + 1);
  const std::string auth = std::string("Authorization: Bearer ") + kTokenA;
  // The dashboard's own origin, by the address or by "localhost".
  EXPECT_EQ(http_status_of(upgrade(d, "/v1/events", {auth, "Origin: http://" + d.host_port()})),
            101);
  EXPECT_EQ(http_status_of(upgrade(d, "/v1/events", {auth, "Origin: http://localhost:" + port},
                                   "localhost:" + port)),
            101);
  EXPECT_EQ(http_status_of(upgrade(d, "/v1/events?ticket=" + ticket(d, kTokenA),
                                   {"Origin: http://" + d.host_port()})),
            101);
  // Clients that are not browsers send no Origin.
  EXPECT_EQ(http_status_of(upgrade(d, "/v1/events", {auth})), 101);
  // Any other origin, even with a valid token or ticket.
  for (const std::string& origin :
       {std::string("https://evil.example"), std::string("null"),
        "http://127.0.0.1:" + std::to_string(std::stoi(port) == 65535 ? 1 : std::stoi(port) + 1),
        "https://" + d.host_port() + ".evil.example", std::string("http://localhost")}) {
    std::string res = upgrade(d, "/v1/events", {auth, "Origin: " + origin});
    EXPECT_EQ(http_status_of(res), 403) << origin << "\n" << res;
    EXPECT_THAT(res, HasSubstr("EACCES"));
    EXPECT_EQ(http_status_of(
                  upgrade(d, "/v1/events?ticket=" + ticket(d, kTokenA), {"Origin: " + origin})),
              403)
        << origin;
  }
  // DNS rebinding: a page whose own name now points at the daemon sends Origin == its Host.
  // A name is never the daemon's own origin.
  std::string rebound = upgrade(d, "/v1/events", {auth, "Origin: http://evil.example:" + port},
                                "evil.example:" + port);
  EXPECT_EQ(http_status_of(rebound), 403) << rebound;
}

TEST(DashboardSecurity, TheAuditLogShowsATenantItsOwnLinesOnly) {
  testing::TempDir dir("agentbox-t13-audit");
  const std::string config = dir / "tenants.yaml";
  ASSERT_TRUE(testing::spit(config, std::string("tenants:\n  - {name: a, tokens: [") + kTokenA +
                                        "]}\n  - {name: b, tokens: [" + kTokenB +
                                        "]}\n  - {name: ops, admin: true, tokens: [t13-ops-token-"
                                        "0123456789]}\n"));
  Daemon d({"--config", config});
  client::Client a(d.options(kTokenA)), b(d.options(kTokenB)),
      ops(d.options("t13-ops-token-0123456789"));
  ASSERT_EQ(a.request("POST", "/v1/sessions", R"({"id": "t13-audit-a"})")->status, 201);
  ASSERT_EQ(b.request("POST", "/v1/sessions", R"({"id": "t13-audit-b"})")->status, 201);
  auto lines = [](client::Client& c, const std::string& q) {
    auto r = c.request("GET", "/v1/audit" + q);
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : r.error().message);
    return r && r->status == 200 ? json::parse(r->body)["lines"] : json::array();
  };
  auto sessions_of = [](const json& ls) {
    std::set<std::string> out;
    for (const auto& l : ls) out.insert(l.value("session", ""));
    return out;
  };
  json mine = lines(a, "");
  ASSERT_FALSE(mine.empty());
  for (const auto& l : mine) EXPECT_EQ(l.value("tenant", ""), "a") << l;
  EXPECT_TRUE(sessions_of(mine).count("t13-audit-a"));
  EXPECT_FALSE(sessions_of(mine).count("t13-audit-b")) << "b's lines are not a's to read";
  EXPECT_TRUE(lines(a, "?tenant=b").empty()) << "a filter does not widen a tenant's view";
  json all = lines(ops, "");
  EXPECT_TRUE(sessions_of(all).count("t13-audit-a") && sessions_of(all).count("t13-audit-b"));
  json one = lines(ops, "?event=session.&session=t13-audit-b&limit=1");
  ASSERT_EQ(one.size(), 1u) << one;
  EXPECT_EQ(one[0]["session"], "t13-audit-b");
  EXPECT_EQ(one[0]["event"], "session.create");
  EXPECT_EQ(a.request("GET", "/v1/audit?limit=0")->status, 400);
  EXPECT_EQ(a.request("GET", "/v1/audit?evnt=x")->status, 400) << "a misspelt filter is refused";
  EXPECT_EQ(http_status_of(raw(d, "GET", "/v1/audit", {})), 401);
}

}  // namespace
}  // namespace agentbox::security
