// GET /v1/sessions/{id}/usage as a dashboard or an operator uses it: a box's memory, CPU time
// and tasks follow what runs in it, the workspace's size follows what is written there, a
// suspended session uses nothing and is not woken by the question, and the question is not a
// use (it does not extend the TTL). The host backend, which keeps no cgroup per session,
// answers 501 naming itself.
//
// The daemons pick their backends themselves, so the suite is left out of the "ns/" re-run
// (tests/integration/CMakeLists.txt).

#include <string>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

std::string usage_of(const std::string& id) {
  return "/v1/sessions/" + id + "/usage";
}

class Usage : public ::testing::Test {
 protected:
  TempDir dir_{"agentbox-usage"};
  Daemon daemon_{{"--backend", "ns", "--data-dir", dir_.path()}};
  Api api_{daemon_};
};

TEST_F(Usage, FollowsWhatRunsInTheBoxAndWhatTheWorkspaceHolds) {
  api_.create("u1");
  auto first = api_.get(usage_of("u1"));
  ASSERT_EQ(first.status, 200) << first;
  EXPECT_EQ(first.body["id"], "u1");
  EXPECT_EQ(first.body["state"], "running");
  EXPECT_TRUE(is_rfc3339_utc(first.body["sampled_at"].get<std::string>())) << first;
  EXPECT_GE(first.body["pids"].get<int>(), 1) << first;  // the box's init
  ASSERT_TRUE(first.body["cpu_usec"].is_number()) << first;

  // A process holding 64 MiB shows in memory and in tasks.
  auto p = api_.post("/v1/sessions/u1/processes",
                     {{"command",
                       "exec python3 -c 'import time; b=bytearray(64<<20); "
                       "b[::4096]=b\"x\"*(len(b)//4096); time.sleep(600)'"}});
  ASSERT_EQ(p.status, 201) << p;
  ApiReply now;
  EXPECT_TRUE(eventually([&] {
    now = api_.get(usage_of("u1"));
    return now.status == 200 && now.body["memory_bytes"].get<std::uint64_t>() >= (64u << 20);
  })) << now;
  EXPECT_GE(now.body["pids"].get<int>(), 2) << now;

  // Half a second of CPU in a command that has exited is still counted.
  const auto cpu_before = api_.get(usage_of("u1")).body["cpu_usec"].get<std::uint64_t>();
  auto burn = api_.exec("u1", {{"argv",
                                {"python3", "-c",
                                 "import time\nt=time.process_time()\n"
                                 "while time.process_time()-t<0.5: pass"}}});
  ASSERT_EQ(burn.status, 200) << burn;
  const auto cpu_after = api_.get(usage_of("u1")).body["cpu_usec"].get<std::uint64_t>();
  EXPECT_GE(cpu_after - cpu_before, 450000u) << cpu_before << " -> " << cpu_after;

  // 5 MiB written to the workspace.
  const auto ws_before = first.body["workspace_bytes"].get<std::uint64_t>();
  auto w = api_.exec("u1", {{"command", "head -c 5242880 /dev/urandom > big.bin && sync"}});
  ASSERT_EQ(w.status, 200) << w;
  auto after = api_.get(usage_of("u1"));
  EXPECT_GE(after.body["workspace_bytes"].get<std::uint64_t>(), ws_before + (5u << 20)) << after;
}

TEST_F(Usage, ASuspendedSessionUsesNothingAndStaysSuspended) {
  api_.create("u2");
  ASSERT_EQ(api_.exec("u2", {{"command", "head -c 1048576 /dev/zero > f.bin"}}).status, 200);
  ASSERT_EQ(api_.post("/v1/sessions/u2/suspend", json::object()).status, 200);
  auto u = api_.get(usage_of("u2"));
  ASSERT_EQ(u.status, 200) << u;
  EXPECT_EQ(u.body["state"], "suspended");
  EXPECT_EQ(u.body["memory_bytes"], 0);
  EXPECT_EQ(u.body["pids"], 0);
  EXPECT_TRUE(u.body["cpu_usec"].is_null()) << u;
  EXPECT_GE(u.body["workspace_bytes"].get<std::uint64_t>(), 1u << 20) << u;
  EXPECT_EQ(api_.get("/v1/sessions/u2").body["state"], "suspended");
}

TEST_F(Usage, AskingIsNotAUseOfTheSession) {
  api_.create("u3");
  ASSERT_EQ(api_.exec("u3", {{"command", "true"}}).status, 200);
  const auto before = api_.get("/v1/sessions/u3").body["last_used_at"];
  // last_used_at has a resolution of a second: asking a second later would show in it.
  ::usleep(1100000);
  ASSERT_EQ(api_.get(usage_of("u3")).status, 200);
  EXPECT_EQ(api_.get("/v1/sessions/u3").body["last_used_at"], before);
  // The same second later, a command is a use.
  ASSERT_EQ(api_.exec("u3", {{"command", "true"}}).status, 200);
  EXPECT_NE(api_.get("/v1/sessions/u3").body["last_used_at"], before);
}

TEST_F(Usage, UnknownSessionsAndOtherBackends) {
  auto missing = api_.get(usage_of("nope"));
  EXPECT_EQ(missing.status, 404) << missing;
  EXPECT_EQ(missing.code(), "ENOENT");

  TempDir hdir{"agentbox-usage-host"};
  Daemon host({"--backend", "host", "--data-dir", hdir.path()});
  Api h(host);
  h.create("h1");
  auto r = h.get(usage_of("h1"));
  EXPECT_EQ(r.status, 501) << r;
  EXPECT_EQ(r.code(), "ENOTSUP");
  EXPECT_NE(r.message().find("host backend"), std::string::npos) << r;
}

}  // namespace
}  // namespace agentbox::testing
