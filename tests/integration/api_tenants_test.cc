// Tenants (DESIGN.md "tenant", SECURITY.md T7 last line) and quotas against the real daemon:
// tenants from the YAML config, each seeing only its own sessions (another tenant's session is
// 404 ENOENT on every /v1/sessions/{id} route, word for word what a missing session gets), an
// admin seeing all, and the session quotas answering 429 EQUOTA.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

constexpr char kTokenA[] = "token-a-0123456789";
constexpr char kTokenB[] = "token-b-0123456789";
constexpr char kTokenAdmin[] = "token-admin-0123456789";
constexpr char kTokenPlain[] = "token-plain-0123456789";

// A YAML config file for the daemon, removed with the fixture.
class ConfigFile {
 public:
  explicit ConfigFile(const std::string& yaml) {
    char tmpl[] = "/tmp/agentbox-tenants-XXXXXX.yaml";
    int fd = ::mkstemps(tmpl, 5);
    if (fd < 0) throw std::runtime_error("mkstemps failed");
    ::close(fd);
    path_ = tmpl;
    std::ofstream(path_) << yaml;
  }
  ~ConfigFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string tenants_yaml(int max_sessions_a) {
  return std::string("tenants:\n") + "  - {name: a, tokens: [" + kTokenA +
         "], max_sessions: " + std::to_string(max_sessions_a) + "}\n" + "  - {name: b, tokens: [" +
         kTokenB + "]}\n" + "  - {name: ops, tokens: [" + kTokenAdmin + "], admin: true}\n";
}

class TenantsApi : public ::testing::Test {
 protected:
  ConfigFile config_{tenants_yaml(3)};
  Daemon daemon_{{"--config", config_.path(), "--token", kTokenPlain}};
  Api a_{daemon_, kTokenA};
  Api b_{daemon_, kTokenB};
  Api admin_{daemon_, kTokenAdmin};
  Api plain_{daemon_, kTokenPlain};
};

std::vector<std::string> ids_of(const ApiReply& r) {
  std::vector<std::string> out;
  for (const auto& s : r.body["sessions"]) out.push_back(s["id"].get<std::string>());
  return out;
}

TEST_F(TenantsApi, AnotherTenantsSessionIs404OnEveryRouteExactlyLikeAMissingOne) {
  a_.create("sa");
  ASSERT_EQ(a_.put(files_target("sa", "keep.txt"), "a's data").status, 200);

  struct Call {
    std::string method;
    std::string target;  // "{id}" is replaced
    std::string body;
  };
  const std::vector<Call> calls = {
      {"GET", "/v1/sessions/{id}", ""},
      {"DELETE", "/v1/sessions/{id}", ""},
      {"DELETE", "/v1/sessions/{id}?archive=true", ""},
      {"POST", "/v1/sessions/{id}/suspend", "{}"},
      {"POST", "/v1/sessions/{id}/resume", "{}"},
      {"POST", "/v1/sessions/{id}/keepalive", "{}"},
      {"POST", "/v1/sessions/{id}/health", "{}"},
      {"POST", "/v1/sessions/{id}/repair", "{}"},
      {"POST", "/v1/sessions/{id}/exec", R"({"command":"echo pwned > /tmp/x"})"},
      {"POST", "/v1/sessions/{id}/exec/stream", R"({"command":"echo pwned"})"},
      {"GET", "/v1/sessions/{id}/files?path=keep.txt", ""},
      {"PUT", "/v1/sessions/{id}/files?path=keep.txt", "overwritten"},
      {"DELETE", "/v1/sessions/{id}/files?path=keep.txt", ""},
      {"GET", "/v1/sessions/{id}/stat?path=keep.txt", ""},
      {"GET", "/v1/sessions/{id}/dir?path=/", ""},
      {"POST", "/v1/sessions/{id}/mkdir", R"({"path":"newdir"})"},
      {"POST", "/v1/sessions/{id}/rename", R"({"from":"keep.txt","to":"moved.txt"})"},
      {"POST", "/exec", R"({"agent_id":"{id}","command":"echo pwned"})"},
      {"POST", "/exec-stream", R"({"agent_id":"{id}","command":"echo pwned"})"},
      {"POST", "/workspace/read", R"({"agent_id":"{id}","path":"keep.txt"})"},
      {"POST", "/workspace/write", R"({"agent_id":"{id}","path":"keep.txt","content":"x"})"},
  };
  auto fill = [](std::string s, const std::string& id) {
    for (std::size_t p; (p = s.find("{id}")) != std::string::npos;) s.replace(p, 4, id);
    return s;
  };
  for (const Call& c : calls) {
    SCOPED_TRACE(c.method + " " + c.target);
    // B on A's session ...
    auto theirs = b_.call(c.method, fill(c.target, "sa"), fill(c.body, "sa"),
                          c.method == "PUT" ? "application/octet-stream" : "application/json");
    EXPECT_EQ(theirs.status, 404) << theirs;
    EXPECT_EQ(theirs.code(), "ENOENT") << theirs;
    // ... reads exactly like A on a session nobody has (same status, same words), so B cannot
    // tell "exists but not mine" from "does not exist". (Routes that create a missing session
    // are asked on a read route instead: their 404 has nothing to compare with.)
    auto missing = a_.call("GET", "/v1/sessions/nobody");
    std::string want = missing.message();
    for (std::size_t p; (p = want.find("nobody")) != std::string::npos;) want.replace(p, 6, "sa");
    EXPECT_EQ(theirs.message(), want) << theirs;
  }
  // A's session and file are untouched.
  auto got = a_.get("/v1/sessions/sa");
  ASSERT_EQ(got.status, 200) << got;
  EXPECT_EQ(got.body["tenant"], "a");
  auto file = a_.get(files_target("sa", "keep.txt"));
  EXPECT_EQ(file.status, 200);
  EXPECT_EQ(file.raw, "a's data");
  auto dir = a_.get("/v1/sessions/sa/dir?path=.");
  ASSERT_EQ(dir.status, 200) << dir;
  EXPECT_EQ(dir.body["entries"].size(), 1u) << dir;  // no newdir, no moved.txt

  // Creating routes: the id is global, so they cannot succeed; 409 says only "taken".
  auto create = b_.post("/v1/sessions", {{"id", "sa"}});
  EXPECT_EQ(create.status, 409) << create;
  EXPECT_EQ(create.code(), "EEXIST");
  EXPECT_EQ(create.message().find(" a "), std::string::npos) << "must not name the owner";
  auto restore = b_.post("/v1/sessions/sa/restore", {{"archive", "x.tar.zst"}});
  EXPECT_EQ(restore.status, 409) << restore;
  EXPECT_EQ(restore.code(), "EEXIST");
}

TEST_F(TenantsApi, ListShowsOnlyTheCallersSessionsAndTheAdminSeesAll) {
  a_.create("a1");
  a_.create("a2");
  b_.create("b1");
  ASSERT_EQ(b_.sh("b2", "true").status, 200);  // exec creates, for B
  plain_.create("p1");

  auto la = a_.get("/v1/sessions");
  ASSERT_EQ(la.status, 200) << la;
  EXPECT_EQ(ids_of(la), (std::vector<std::string>{"a1", "a2"}));
  auto lb = b_.get("/v1/sessions");
  EXPECT_EQ(ids_of(lb), (std::vector<std::string>{"b1", "b2"}));
  auto lp = plain_.get("/v1/sessions");
  EXPECT_EQ(ids_of(lp), (std::vector<std::string>{"p1"}));
  EXPECT_EQ(lp.body["sessions"][0]["tenant"], "default");
  auto all = admin_.get("/v1/sessions");
  EXPECT_EQ(ids_of(all), (std::vector<std::string>{"a1", "a2", "b1", "b2", "p1"}));
  std::set<std::string> tenants;
  for (const auto& s : all.body["sessions"]) tenants.insert(s["tenant"].get<std::string>());
  EXPECT_EQ(tenants, (std::set<std::string>{"a", "b", "default"}));

  // The admin may use any session; what it creates is its own.
  auto ex = admin_.sh("a1", "echo from-admin");
  ASSERT_EQ(ex.status, 200) << ex;
  EXPECT_EQ(ex.body["stdout"], "from-admin\n");
  EXPECT_EQ(admin_.get("/v1/sessions/b1").status, 200);
  EXPECT_EQ(admin_.del("/v1/sessions/b2").status, 200);
  EXPECT_EQ(ids_of(b_.get("/v1/sessions")), std::vector<std::string>{"b1"});
}

TEST_F(TenantsApi, WrongOrMissingTokenIs401) {
  Api nobody{daemon_, "token-c-0123456789"};
  EXPECT_EQ(nobody.get("/v1/sessions").status, 401);
  Api none{daemon_};
  EXPECT_EQ(none.get("/v1/sessions").status, 401);
  // A prefix of a valid token is not valid.
  Api prefix{daemon_, std::string(kTokenA).substr(0, 10)};
  EXPECT_EQ(prefix.get("/v1/sessions").status, 401);
  // Tokens never reach the log.
  a_.create("logged");
  std::string log = daemon_.log();
  for (const char* t : {kTokenA, kTokenB, kTokenAdmin, kTokenPlain}) {
    EXPECT_EQ(log.find(t), std::string::npos) << t;
  }
}

TEST_F(TenantsApi, MaxSessionsPerTenantIs429NamingTheLimit) {
  a_.create("q1");
  a_.create("q2");
  a_.create("q3");
  auto over = a_.post("/v1/sessions", {{"id", "q4"}});
  EXPECT_EQ(over.status, 429) << over;
  EXPECT_EQ(over.code(), "EQUOTA");
  EXPECT_NE(over.message().find("max_sessions"), std::string::npos) << over;
  EXPECT_NE(over.message().find("3"), std::string::npos) << over;
  auto exec = a_.sh("q5", "true");  // an exec that would create is refused too
  EXPECT_EQ(exec.status, 429) << exec;
  EXPECT_EQ(exec.code(), "EQUOTA");
  // Existing sessions still work; other tenants are not limited by a's quota.
  EXPECT_EQ(a_.post("/v1/sessions", {{"id", "q1"}}).status, 200);
  EXPECT_EQ(a_.sh("q1", "true").status, 200);
  b_.create("b-free");
  // Deleting one makes room again.
  ASSERT_EQ(a_.del("/v1/sessions/q1").status, 200);
  EXPECT_EQ(a_.post("/v1/sessions", {{"id", "q4"}}).status, 201);
  EXPECT_EQ(ids_of(a_.get("/v1/sessions")), (std::vector<std::string>{"q2", "q3", "q4"}));
}

TEST(TenantsQuota, MaxRunningBoxesIs429ForEveryTenant) {
  Daemon daemon({"--max-running-boxes", "2"});
  Api api(daemon);
  api.create("r1");
  ASSERT_EQ(api.sh("r2", "true").status, 200);
  auto over = api.post("/v1/sessions", {{"id", "r3"}});
  EXPECT_EQ(over.status, 429) << over;
  EXPECT_EQ(over.code(), "EQUOTA");
  EXPECT_NE(over.message().find("max_running_boxes"), std::string::npos) << over;
  EXPECT_NE(over.message().find("2"), std::string::npos) << over;
  EXPECT_EQ(api.sh("r3", "true").status, 429);
  EXPECT_EQ(api.get("/v1/sessions/r3").status, 404);  // nothing half-made
  ASSERT_EQ(api.del("/v1/sessions/r1").status, 200);
  EXPECT_EQ(api.post("/v1/sessions", {{"id", "r3"}}).status, 201);
}

TEST(TenantsConfig, BadTenantConfigsAreRefusedAtStartup) {
  struct Case {
    std::string yaml;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"tenants:\n  - {name: a, tokens: [t1]}\n  - {name: a, tokens: [t2]}\n", "twice"},
      {"tenants:\n  - {name: a, tokens: [same-token]}\n  - {name: b, tokens: [same-token]}\n",
       "token is configured twice"},
      {"tenants:\n  - {name: a}\n", "no tokens"},
      {"tenants:\n  - {name: 'a/b', tokens: [t]}\n", "tenant name"},
      {"tenants:\n  - {name: a, tokens: [t], admn: true}\n", "unknown key 'admn'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    ConfigFile f(c.yaml);
    std::string out;
    int rc = Daemon::run_to_exit(
        {"--config", f.path(), "--data-dir", "/tmp/agentbox-unused", "--listen", "127.0.0.1:0"},
        &out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find(c.needle), std::string::npos) << out;
    EXPECT_EQ(out.find("same-token"), std::string::npos) << "tokens are never echoed: " << out;
  }
}

}  // namespace
}  // namespace agentbox::testing
