// API.md "General" against the real daemon: an unknown field in any /v1 JSON body, nested objects
// included, is 400 EINVAL naming it, and nothing happens (a misspelt `limts` makes no session
// with defaults; an exec that would create its session creates none).
#include <string>
#include <vector>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

struct Case {
  std::string target;  // POST
  json body;
  std::string field;  // what the error names
};

class UnknownFields : public ::testing::Test {
 protected:
  Daemon d_;
  Api api_{d_};
};

TEST_F(UnknownFields, EveryV1BodyRefusesAnUnknownFieldNamingIt) {
  const std::string s = "/v1/sessions/u";
  const json mount = {{"host_path", "/nowhere"}, {"mount_path", "/workspace/m"}};
  const std::vector<Case> cases = {
      {"/v1/sessions", {{"id", "u"}, {"limts", {{"memory_mb", 256}}}}, "limts"},
      {"/v1/sessions", {{"id", "u"}, {"netwrk", {{"mode", "none"}}}}, "netwrk"},
      {"/v1/sessions", {{"id", "u"}, {"limits", {{"memry_mb", 256}}}}, "limits.memry_mb"},
      {"/v1/sessions",
       {{"id", "u"}, {"network", {{"mode", "none"}, {"alow", json::array()}}}},
       "network.alow"},
      {"/v1/sessions",
       {{"id", "u"}, {"mounts", {{{"host_path", "/x"}, {"mount_path", "/y"}, {"rw", true}}}}},
       "mounts[0].rw"},
      {"/v1/sessions",
       {{"id", "u"}, {"extra_mounts", {{{"host_path", "/x"}, {"mountpath", "/y"}}}}},
       "extra_mounts[0].mountpath"},
      {s + "/exec", {{"command", "true"}, {"timeout", 5}}, "timeout"},
      {s + "/exec/stream", {{"command", "true"}, {"cmd", "x"}}, "cmd"},
      {s + "/mkdir", {{"path", "a"}, {"parents", true}}, "parents"},
      {s + "/rename", {{"from", "a"}, {"to", "b"}, {"overwrite", true}}, "overwrite"},
      {s + "/processes", {{"command", "sleep 1"}, {"name", "x"}}, "name"},
      {s + "/processes",
       {{"command", "sh"}, {"pty", {{"cols", 80}, {"rows", 24}, {"w", 1}}}},
       "pty.w"},
      {s + "/processes/p/signal", {{"signal", "TERM"}, {"sig", 15}}, "sig"},
      {s + "/processes/p/resize", {{"cols", 80}, {"rows", 24}, {"width", 1}}, "width"},
      {s + "/network", {{"mode", "none"}, {"allowed", json::array()}}, "allowed"},
      {s + "/mounts", {{"mounts", {mount}}, {"skils", json::object()}}, "skils"},
      {s + "/packages", {{"manager", "pip"}, {"packages", {"x"}}, {"upgrade", true}}, "upgrade"},
      {s + "/health", {{"deep", true}}, "deep"},
      {s + "/repair", {{"force", true}}, "force"},
      {s + "/suspend", {{"now", true}}, "now"},
      {s + "/resume", {{"wait", true}}, "wait"},
      {s + "/keepalive", {{"ttl", 5}}, "ttl"},
      {s + "/restore", {{"archive", "a.tar.gz"}, {"from", "x"}}, "from"},
      {"/v1/templates/t/rollback", {{"version", 1}, {"ver", 1}}, "ver"},
  };
  for (const Case& c : cases) {
    auto r = api_.post(c.target, c.body);
    EXPECT_EQ(r.status, 400) << c.target << " " << c.body.dump() << ": " << r;
    EXPECT_EQ(r.code(), "EINVAL") << c.target << ": " << r;
    EXPECT_NE(r.message().find("'" + c.field + "'"), std::string::npos)
        << c.target << " should name " << c.field << ": " << r;
  }
  // None of them made the session (a create with a misspelt field, or an exec, which creates).
  EXPECT_EQ(api_.get(s).status, 404);
  EXPECT_EQ(api_.get("/v1/sessions").body["sessions"].size(), 0u) << api_.get("/v1/sessions");
}

TEST_F(UnknownFields, KnownFieldsAndEmptyBodiesStillWork) {
  // Seed 002's names are fields of the create; the routes without fields take {} or nothing.
  auto r = api_.post("/v1/sessions", {{"id", "k"},
                                      {"limits", {{"memory_mb", 256}}},
                                      {"network", {{"mode", "none"}}},
                                      {"extra_mounts", json::array()},
                                      {"labels", {{"a", "b"}}}});
  ASSERT_EQ(r.status, 201) << r;
  EXPECT_EQ(r.body["limits"]["memory_mb"], 256) << r;
  EXPECT_EQ(api_.post("/v1/sessions/k/keepalive", json::object()).status, 200);
  EXPECT_EQ(api_.call("POST", "/v1/sessions/k/keepalive").status, 200);  // no body at all
  auto x = api_.exec("k", {{"command", "echo ok"}, {"timeout_sec", 10}, {"env", {{"A", "1"}}}});
  EXPECT_EQ(x.body["stdout"], "ok\n") << x;
  // Seed 001's /exec is a dialect: what its clients add is not refused.
  auto seed = api_.post("/exec", {{"command", "echo seed"},
                                  {"env", {{"AGENT_ID", "k"}, {"AGENT_WORKSPACE", "/w"}}},
                                  {"client_version", "1.2"}});
  EXPECT_EQ(seed.status, 200) << seed;
  EXPECT_EQ(seed.body["stdout"], "seed\n") << seed;
}

}  // namespace
}  // namespace agentbox::testing
