#include "server/routes.h"

#include <gtest/gtest.h>

#include <set>

namespace agentbox::server {
namespace {

TEST(Routes, TableIsUniqueAndCoversTheApi) {
  std::set<std::pair<std::string, std::string>> seen;
  for (const auto& r : route_table()) {
    EXPECT_TRUE(seen.emplace(r.method, r.path).second) << r.method << " " << r.path;
  }
  for (const auto& [m, p] : std::vector<std::pair<std::string, std::string>>{
           {"POST", "/v1/sessions"},
           {"GET", "/v1/sessions"},
           {"GET", "/v1/sessions/{id}"},
           {"DELETE", "/v1/sessions/{id}"},
           {"POST", "/v1/sessions/{id}/exec"},
           {"POST", "/v1/sessions/{id}/exec/stream"},
           {"GET", "/v1/sessions/{id}/files"},
           {"PUT", "/v1/sessions/{id}/files"},
           {"DELETE", "/v1/sessions/{id}/files"},
           {"GET", "/v1/sessions/{id}/stat"},
           {"GET", "/v1/sessions/{id}/dir"},
           {"POST", "/v1/sessions/{id}/mkdir"},
           {"POST", "/v1/sessions/{id}/rename"},
           {"POST", "/exec"},
           {"POST", "/exec-stream"},
           {"POST", "/workspace/read"},
           {"POST", "/workspace/write"},
           {"GET", "/healthz"},
           {"GET", "/readyz"},
           {"GET", "/metrics"},
       }) {
    EXPECT_TRUE(seen.count({m, p})) << m << " " << p << " missing";
  }
}

TEST(Routes, MatchesTemplatesAndDecodesParameters) {
  auto m = match_route("POST", "/v1/sessions/group_123/exec");
  ASSERT_NE(m.route, nullptr);
  EXPECT_EQ(m.route->id, RouteId::kExec);
  EXPECT_EQ(m.params.at("id"), "group_123");

  auto s = match_route("POST", "/v1/sessions/a%2Fb/exec/stream");
  ASSERT_NE(s.route, nullptr);
  EXPECT_EQ(s.route->id, RouteId::kExecStream);
  EXPECT_EQ(s.params.at("id"), "a/b");  // decoded; the id check refuses it later

  auto h = match_route("GET", "/healthz");
  ASSERT_NE(h.route, nullptr);
  EXPECT_FALSE(h.route->needs_auth);
  EXPECT_TRUE(match_route("GET", "/metrics").route->needs_auth);
}

TEST(Routes, UnknownPathAndWrongMethod) {
  for (const char* p : {"/", "", "v1/sessions", "/v1/sessions/", "/v1/sessions//exec",
                        "/v1/sessions/x/exec/", "/v1/sessions/x/y/z", "/healthz/x"}) {
    auto m = match_route("GET", p);
    EXPECT_EQ(m.route, nullptr) << p;
    EXPECT_TRUE(m.allowed.empty()) << p;
  }
  auto m = match_route("PATCH", "/v1/sessions/x/files");
  EXPECT_EQ(m.route, nullptr);
  std::set<std::string> allowed(m.allowed.begin(), m.allowed.end());
  EXPECT_EQ(allowed, (std::set<std::string>{"GET", "PUT", "DELETE"}));
}

TEST(Routes, UrlDecode) {
  EXPECT_EQ(url_decode("a%20b%2f%C3%A9", false).value(), "a b/\xC3\xA9");
  EXPECT_EQ(url_decode("a+b", false).value(), "a+b");
  EXPECT_EQ(url_decode("a+b", true).value(), "a b");
  for (const char* bad : {"%", "%2", "%zz", "a%g0"}) {
    auto r = url_decode(bad, true);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code, Code::kInvalid);
  }
}

TEST(Routes, ParseQuery) {
  auto q = parse_query("path=%2Fworkspace%2Fa%20b.txt&mkdirs=true&mode=0644&path=second&flag&=x");
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->at("path"), "/workspace/a b.txt");  // the first of repeated keys wins
  EXPECT_EQ(q->at("mkdirs"), "true");
  EXPECT_EQ(q->at("mode"), "0644");
  EXPECT_EQ(q->at("flag"), "");
  EXPECT_FALSE(parse_query("path=%zz").has_value());
  EXPECT_TRUE(parse_query("").value().empty());
}

}  // namespace
}  // namespace agentbox::server
