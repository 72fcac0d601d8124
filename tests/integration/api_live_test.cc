// Live changes to a session (API.md "Live changes to a session"), as an agent notices them:
// PATCH /v1/sessions/{id} {"limits"} and a seed-001 /exec with a different `cgroup` write new
// memory / pids limits into the running box, and the next command runs under them; values out of
// range are 400 naming the field, limits fixed while the box runs are 501 naming it; the change
// is stored (suspend/resume and a daemon restart keep it). The host backend, which enforces no
// limits, refuses the live part with 501 and takes the rest.
//
// The LiveLimits daemons run the ns backend themselves (limits are what isolation enforces), so
// the suite is left out of the "ns/" re-run (tests/integration/CMakeLists.txt).

#include <cstdlib>
#include <string>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

// Forks up to 40 children that sleep a second; prints how many forks succeeded.
constexpr char kForks[] =
    "import os,time\n"
    "n=0\n"
    "for i in range(40):\n"
    "  try: p=os.fork()\n"
    "  except OSError: break\n"
    "  if p==0:\n"
    "    time.sleep(1); os._exit(0)\n"
    "  n+=1\n"
    "print(n, flush=True)\n"
    "for i in range(n): os.wait()\n";  // gone before the next command counts its pids

// The number a command printed; 999 when it printed none (never passes a "fewer than" check).
int number_in(const std::string& out) {
  char* end = nullptr;
  long v = std::strtol(out.c_str(), &end, 10);
  return end == out.c_str() ? 999 : static_cast<int>(v);
}

// Touches `mb` MiB of memory, then prints "ok".
std::string alloc(int mb) {
  return "python3 -c 'b=bytearray(" + std::to_string(mb) + "<<20); print(\"ok\")'";
}

class LiveLimits : public ::testing::Test {
 protected:
  ApiReply patch(const std::string& id, const json& body) {
    return api_.call("PATCH", "/v1/sessions/" + id, body.dump());
  }
  // How many of 40 forks the box allowed.
  int forks(const std::string& id) {
    auto r = api_.exec(id, {{"argv", {"python3", "-c", kForks}}});
    EXPECT_EQ(r.status, 200) << r;
    return number_in(r.body.value("stdout", ""));
  }

  TempDir dir_{"agentbox-live"};
  Daemon daemon_{{"--backend", "ns", "--data-dir", dir_.path()}};
  Api api_{daemon_};
};

TEST_F(LiveLimits, PatchRaisesAndLowersMemoryAndPidsOfTheRunningBox) {
  auto c =
      api_.post("/v1/sessions", {{"id", "lm"}, {"limits", {{"memory_mb", 64}, {"max_pids", 16}}}});
  ASSERT_EQ(c.status, 201) << c;
  ASSERT_EQ(api_.sh("lm", "echo up > /tmp/alive").body["exit_code"], 0);
  EXPECT_LT(forks("lm"), 16);
  auto big = api_.sh("lm", alloc(100));
  EXPECT_EQ(big.body["killed_by"], "memory") << big;

  // Raised: the same commands now fit.
  auto up = patch("lm", {{"limits", {{"memory_mb", 256}, {"max_pids", 128}}}});
  ASSERT_EQ(up.status, 200) << up;
  EXPECT_EQ(up.body["state"], "running") << up;
  EXPECT_EQ(up.body["limits"]["memory_mb"], 256) << up;
  EXPECT_EQ(up.body["limits"]["max_pids"], 128) << up;
  EXPECT_EQ(forks("lm"), 40);
  auto fits = api_.sh("lm", alloc(100));
  EXPECT_EQ(fits.body["stdout"], "ok\n") << fits;
  EXPECT_TRUE(fits.body["killed_by"].is_null()) << fits;

  // Lowered again: bounded again, in the same box (its /tmp file is still there).
  auto down = patch("lm", {{"limits", {{"memory_mb", 48}, {"max_pids", 12}}}});
  ASSERT_EQ(down.status, 200) << down;
  EXPECT_EQ(down.body["limits"]["memory_mb"], 48) << down;
  EXPECT_LT(forks("lm"), 12);
  EXPECT_EQ(api_.sh("lm", alloc(100)).body["killed_by"], "memory");
  EXPECT_EQ(api_.sh("lm", "cat /tmp/alive").body["stdout"], "up\n");
  EXPECT_EQ(api_.get("/v1/sessions/lm").body["limits"], down.body["limits"]);
}

TEST_F(LiveLimits, BadValuesAre400AndFixedLimitsAre501NamingTheField) {
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "bv"}, {"limits", {{"memory_mb", 128}}}}).status,
            201);
  const json before = api_.get("/v1/sessions/bv").body["limits"];
  for (const auto& [body, field] : std::vector<std::pair<json, std::string>>{
           {{{"limits", {{"memory_mb", 1}}}}, "limits.memory_mb"},
           {{{"limits", {{"max_pids", 0}}}}, "limits.max_pids"},
           {{{"limits", {{"cpu_percent", "x"}}}}, "limits.cpu_percent"},
           {{{"limits", {{"memory_mb", 16}}}}, "limits.tmp_mb"},  // /tmp would be over half
           {{{"ttl_sec", -1}}, "ttl_sec"},
           {{{"network", {{"mode", "open"}}}}, "network"},
       }) {
    auto r = patch("bv", body);
    EXPECT_EQ(r.status, 400) << body << " " << r;
    EXPECT_NE(r.message().find(field), std::string::npos) << body << " " << r;
  }
  for (const auto& [body, field] : std::vector<std::pair<json, std::string>>{
           {{{"limits", {{"tmp_mb", 8}}}}, "'limits.tmp_mb'"},
           {{{"limits", {{"max_open_files", 64}}}}, "'limits.max_open_files'"},
           {{{"limits", {{"disk_mb", 64}}}}, "'limits.disk_mb'"},
       }) {
    auto r = patch("bv", body);
    EXPECT_EQ(r.status, 501) << body << " " << r;
    EXPECT_NE(r.message().find(field), std::string::npos) << body << " " << r;
  }
  EXPECT_EQ(api_.get("/v1/sessions/bv").body["limits"], before);
  EXPECT_EQ(patch("nope", {{"limits", {{"memory_mb", 64}}}}).status, 404);
  // A suspended session takes tmp_mb (and max_open_files) for its next start.
  ASSERT_EQ(api_.post("/v1/sessions/bv/suspend", json::object()).status, 200);
  auto tmp = patch("bv", {{"limits", {{"tmp_mb", 8}}}, {"labels", {{"team", "a"}}}});
  ASSERT_EQ(tmp.status, 200) << tmp;
  EXPECT_EQ(tmp.body["state"], "suspended") << tmp;
  EXPECT_EQ(tmp.body["labels"]["team"], "a") << tmp;
  auto df = api_.sh("bv", "df -m /tmp | awk 'NR==2{print $2}'");
  EXPECT_EQ(df.body["stdout"], "8\n") << df;
}

TEST_F(LiveLimits, SeedExecWithADifferentCgroupRunsUnderTheNewLimits) {
  auto first = api_.post(
      "/exec",
      {{"command", "true"}, {"agent_id", "sd"}, {"cgroup", {{"memory_mb", 64}, {"max_pids", 16}}}});
  ASSERT_EQ(first.status, 200) << first;
  auto small = api_.post("/exec", {{"command", alloc(100)}, {"agent_id", "sd"}});
  EXPECT_NE(small.body["exit_code"], 0) << small;
  auto big = api_.post("/exec", {{"command", alloc(100)},
                                 {"agent_id", "sd"},
                                 {"cgroup", {{"memory_mb", 256}, {"max_pids", 64}}}});
  ASSERT_EQ(big.status, 200) << big;
  EXPECT_EQ(big.body["stdout"], "ok\n") << big;
  auto s = api_.get("/v1/sessions/sd");
  EXPECT_EQ(s.body["limits"]["memory_mb"], 256) << s;
  EXPECT_EQ(s.body["limits"]["max_pids"], 64) << s;
  auto bad = api_.post(
      "/exec", {{"command", "echo ran"}, {"agent_id", "sd"}, {"cgroup", {{"max_pids", 1}}}});
  EXPECT_EQ(bad.status, 400) << bad;
  EXPECT_NE(bad.message().find("'cgroup.max_pids'"), std::string::npos) << bad;
}

TEST(LiveLimitsRestart, TheChangedLimitsSurviveADaemonRestart) {
  TempDir dir("agentbox-live");
  {
    Daemon d({"--backend", "ns", "--data-dir", dir.path()});
    Api api(d);
    ASSERT_EQ(api.post("/v1/sessions", {{"id", "rs"}, {"limits", {{"max_pids", 64}}}}).status, 201);
    auto p = api.call("PATCH", "/v1/sessions/rs", json{{"limits", {{"max_pids", 12}}}}.dump());
    ASSERT_EQ(p.status, 200) << p;
    EXPECT_EQ(d.stop(), 0);
  }
  Daemon d({"--backend", "ns", "--data-dir", dir.path()});
  Api api(d);
  auto s = api.get("/v1/sessions/rs");
  EXPECT_EQ(s.body["limits"]["max_pids"], 12) << s;
  auto r = api.exec("rs", {{"argv", {"python3", "-c", kForks}}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_LT(number_in(r.body.value("stdout", "")), 12) << r;
}

// The host backend enforces no limits: a running host session refuses a live change with 501
// naming the field; ttl_sec and labels change on any backend.
TEST(LiveLimitsHost, HostBoxRefusesLiveLimitsButTakesTtlAndLabels) {
  Daemon d({"--backend", "host"});
  Api api(d);
  api.create("hs");
  auto lim = api.call("PATCH", "/v1/sessions/hs", json{{"limits", {{"max_pids", 64}}}}.dump());
  EXPECT_EQ(lim.status, 501) << lim;
  EXPECT_NE(lim.message().find("'limits.max_pids'"), std::string::npos) << lim;
  auto ttl =
      api.call("PATCH", "/v1/sessions/hs", json{{"ttl_sec", 600}, {"labels", {{"k", "v"}}}}.dump());
  ASSERT_EQ(ttl.status, 200) << ttl;
  EXPECT_EQ(ttl.body["ttl_sec"], 600) << ttl;
  EXPECT_EQ(ttl.body["labels"], json({{"k", "v"}})) << ttl;
  EXPECT_EQ(api.get("/v1/sessions/hs").body["ttl_sec"], 600);
}

}  // namespace
}  // namespace agentbox::testing
