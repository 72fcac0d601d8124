// Session limits on the ns backend, as an agent notices them (API.md "Sessions" limits, "Exec"
// killed_by; seed 004's limits): a CPU-time budget per command, why a command was stopped, a
// /tmp of its own size whose filling never locks the session up, the config's default limits,
// and seed 001's uids for workspaces the toolbox-server made.
//
// Every daemon here runs the ns backend itself (limits are what isolation enforces), so these
// suites are left out of the "ns/" re-run (tests/integration/CMakeLists.txt).

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;

class LimitsApi : public ::testing::Test {
 protected:
  // Creates session `id` with `limits`; expects 201 and returns the session object.
  json create(const std::string& id, const json& limits) {
    auto r = api_.post("/v1/sessions", {{"id", id}, {"limits", limits}});
    EXPECT_EQ(r.status, 201) << r;
    return r.body;
  }

  Daemon daemon_{{"--backend", "ns"}};
  Api api_{daemon_};
};

TEST_F(LimitsApi, CpuTimeKillsABusyLoopAndSaysSo) {
  json s = create("cpu", {{"cpu_time_sec", 1}});
  EXPECT_EQ(s["limits"]["cpu_time_sec"], 1) << s;

  auto r = api_.exec("cpu", {{"command", "while :; do :; done"}, {"timeout_sec", 60}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["killed_by"], "cpu_time") << r;
  EXPECT_EQ(r.body["timed_out"], false) << r;
  EXPECT_NE(r.body["exit_code"], 0) << r;
  EXPECT_LT(r.body["duration_ms"].get<long>(), 30000)
      << "killed by its CPU budget, not the timeout";

  // A program that runs the loop as a child of the shell (no exec of the last command): the
  // shell reports the child's SIGXCPU death, and the cause is still named.
  auto nested =
      api_.exec("cpu", {{"command", "sh -c 'while :; do :; done'; exit $?"}, {"timeout_sec", 60}});
  ASSERT_EQ(nested.status, 200) << nested;
  EXPECT_EQ(nested.body["killed_by"], "cpu_time") << nested;

  // The streaming form says it in its last line.
  std::string all;
  auto st = api_.client().request_stream(
      "POST", "/v1/sessions/cpu/exec/stream",
      json{{"command", "echo start; while :; do :; done"}, {"timeout_sec", 60}}.dump(),
      [&](std::string_view c) {
        all.append(c);
        return true;
      });
  ASSERT_TRUE(st.has_value()) << st.error().message;
  ASSERT_EQ(st->status, 200) << st->body;
  EXPECT_NE(all.find(R"("type":"exit")"), std::string::npos) << all;
  EXPECT_NE(all.find(R"("killed_by":"cpu_time")"), std::string::npos) << all;

  // The budget is per command: the session goes on, and a command that ends on its own has no
  // killed_by.
  auto ok = api_.sh("cpu", "echo ok");
  ASSERT_EQ(ok.status, 200) << ok;
  EXPECT_EQ(ok.body["stdout"], "ok\n");
  EXPECT_EQ(ok.body["exit_code"], 0);
  EXPECT_TRUE(ok.body["killed_by"].is_null()) << ok;
  auto failed = api_.sh("cpu", "exit 3");
  EXPECT_EQ(failed.body["exit_code"], 3) << failed;
  EXPECT_TRUE(failed.body["killed_by"].is_null()) << failed;
}

TEST_F(LimitsApi, CpuTimeOutOfRangeIs400NamingItAndMakesNothing) {
  for (const json& bad : {json(0), json(1000000000), json("1"), json(-1)}) {
    auto r = api_.post("/v1/sessions", {{"id", "badcpu"}, {"limits", {{"cpu_time_sec", bad}}}});
    EXPECT_EQ(r.status, 400) << bad << ": " << r;
    EXPECT_EQ(r.code(), "EINVAL") << r;
    EXPECT_NE(r.message().find("limits.cpu_time_sec"), std::string::npos) << r;
  }
  EXPECT_EQ(api_.get("/v1/sessions/badcpu").status, 404);
  // Within the range: made.
  create("week", {{"cpu_time_sec", 7 * 24 * 3600}});
}

TEST_F(LimitsApi, TimeoutSaysTimeout) {
  auto r = api_.exec("t", {{"command", "sleep 30"}, {"timeout_sec", 1}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["timed_out"], true) << r;
  EXPECT_EQ(r.body["killed_by"], "timeout") << r;
}

TEST_F(LimitsApi, OomKillSaysMemoryAndTheSessionGoesOn) {
  create("oom", {{"memory_mb", 64}});
  // tail keeps its whole input when there is no newline: it grows until the OOM killer ends it.
  auto r = api_.exec(
      "oom", {{"command", "head -c 1000m /dev/zero | tail > /dev/null"}, {"timeout_sec", 60}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["killed_by"], "memory") << r;
  EXPECT_NE(r.body["exit_code"], 0) << r;
  EXPECT_EQ(r.body["timed_out"], false) << r;

  auto ok = api_.sh("oom", "echo ok");
  ASSERT_EQ(ok.status, 200) << ok;
  EXPECT_EQ(ok.body["exit_code"], 0) << ok;
  EXPECT_TRUE(ok.body["killed_by"].is_null()) << ok;
}

TEST_F(LimitsApi, ForkRefusedAtMaxPidsSaysPids) {
  create("pids", {{"max_pids", 16}});
  // dash gives up at the first fork the pids limit refuses.
  auto r = api_.exec("pids", {{"command",
                               "i=0; while [ $i -lt 100 ]; do sleep 1000 & "
                               "i=$((i+1)); done; wait"},
                              {"timeout_sec", 60}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["killed_by"], "pids") << r;
  EXPECT_NE(r.body["exit_code"], 0) << r;
  EXPECT_NE(r.body["stderr"].get<std::string>().find("fork"), std::string::npos) << r;
  EXPECT_EQ(api_.del("/v1/sessions/pids").status, 200);  // takes the sleepers with it
}

TEST_F(LimitsApi, FullTmpGivesEnospcAndTheSessionStaysUsable) {
  json s = create("tmp", {{"memory_mb", 256}, {"tmp_mb", 32}});
  EXPECT_EQ(s["limits"]["tmp_mb"], 32) << s;
  // /tmp has the size asked for (df: 1K blocks).
  auto df = api_.sh("tmp", "df -k /tmp | tail -1 | awk '{print $2}'");
  ASSERT_EQ(df.status, 200) << df;
  EXPECT_EQ(df.body["stdout"], std::to_string(32 * 1024) + "\n") << df;

  auto fill = api_.exec(
      "tmp", {{"command", "dd if=/dev/zero of=/tmp/fill bs=1M count=100000"}, {"timeout_sec", 60}});
  ASSERT_EQ(fill.status, 200) << fill;
  EXPECT_NE(fill.body["exit_code"], 0) << fill;
  EXPECT_NE(fill.body["stderr"].get<std::string>().find("No space left"), std::string::npos)
      << fill;
  EXPECT_TRUE(fill.body["killed_by"].is_null()) << fill;  // the writer got ENOSPC, not killed

  // /tmp stays full, and commands (and the memory they need) still run.
  for (int i = 0; i < 3; ++i) {
    auto ok = api_.sh("tmp", "echo ok");
    ASSERT_EQ(ok.status, 200) << ok;
    EXPECT_EQ(ok.body["exit_code"], 0) << "not 137: " << ok;
    EXPECT_EQ(ok.body["stdout"], "ok\n") << ok;
  }
  // 64 MiB held in memory (tail keeps a line without newline whole) beside the full /tmp.
  auto mem = api_.sh("tmp", "head -c 64m /dev/zero | tail | wc -c; ls /tmp/fill | wc -l");
  EXPECT_EQ(mem.body["exit_code"], 0) << mem;
  EXPECT_EQ(mem.body["stdout"], std::to_string(64 << 20) + "\n1\n") << mem;
}

TEST_F(LimitsApi, TmpDefaultsToAQuarterOfMemoryAndMayNotTakeHalf) {
  // The built-in default: min(memory_mb / 4, 512).
  json s = create("tmpdef", json::object());
  EXPECT_EQ(s["limits"]["memory_mb"], 512) << s;
  EXPECT_EQ(s["limits"]["tmp_mb"], 128) << s;
  EXPECT_FALSE(s["limits"].contains("cpu_time_sec")) << "no CPU limit unless asked: " << s;
  auto df = api_.sh("tmpdef", "df -k /tmp | tail -1 | awk '{print $2}'");
  EXPECT_EQ(df.body["stdout"], std::to_string(128 * 1024) + "\n") << df;
  json big = create("tmpbig", {{"memory_mb", 4096}});
  EXPECT_EQ(big["limits"]["tmp_mb"], 512) << big;
  auto got = api_.get("/v1/sessions/tmpbig");
  EXPECT_EQ(got.body["limits"], big["limits"]) << got;

  auto r = api_.post("/v1/sessions",
                     {{"id", "tmphalf"}, {"limits", {{"memory_mb", 64}, {"tmp_mb", 33}}}});
  EXPECT_EQ(r.status, 400) << r;
  EXPECT_NE(r.message().find("limits.tmp_mb"), std::string::npos) << r;
  EXPECT_NE(r.message().find("memory_mb"), std::string::npos) << r;
  // Against the default memory limit too (512).
  auto r2 = api_.post("/v1/sessions", {{"id", "tmphalf"}, {"limits", {{"tmp_mb", 300}}}});
  EXPECT_EQ(r2.status, 400) << r2;
  EXPECT_EQ(api_.get("/v1/sessions/tmphalf").status, 404);
  auto r3 = api_.post("/v1/sessions", {{"id", "tmpzero"}, {"limits", {{"tmp_mb", 0}}}});
  EXPECT_EQ(r3.status, 400) << r3;
  EXPECT_NE(r3.message().find("limits.tmp_mb"), std::string::npos) << r3;
}

// The config's default_limits: what a session that asks for nothing gets, and shows.
class LimitsConfig : public ::testing::Test {
 protected:
  static std::string write_config(const TempDir& dir, const std::string& body) {
    std::string cfg = dir / "agentboxd.yaml";
    std::ofstream(cfg) << body;
    return cfg;
  }
  TempDir dir_{"agentbox-limits"};
};

TEST_F(LimitsConfig, DefaultsApplyAndTheSessionShowsThem) {
  Daemon d({"--backend", "ns", "--config",
            write_config(dir_,
                         "default_limits:\n  memory_mb: 256\n  cpu_time_sec: 1\n"
                         "  tmp_mb: 24\n  disk_mb: 0\n")});
  Api api(d);
  auto s = api.post("/v1/sessions", {{"id", "d"}});
  ASSERT_EQ(s.status, 201) << s;
  const json& l = s.body["limits"];
  EXPECT_EQ(l["memory_mb"], 256) << s;
  EXPECT_EQ(l["cpu_time_sec"], 1) << s;
  EXPECT_EQ(l["tmp_mb"], 24) << s;
  EXPECT_FALSE(l.contains("disk_mb")) << "disk_mb 0 = no cap: " << s;
  EXPECT_EQ(l["cpu_percent"], 100) << s;
  EXPECT_EQ(l["max_pids"], 256) << s;
  EXPECT_EQ(l["max_open_files"], 1024) << s;
  // Applied, not only shown.
  auto busy = api.exec("d", {{"command", "while :; do :; done"}, {"timeout_sec", 60}});
  EXPECT_EQ(busy.body["killed_by"], "cpu_time") << busy;
  auto df = api.sh("d", "df -k /tmp | tail -1 | awk '{print $2}'");
  EXPECT_EQ(df.body["stdout"], std::to_string(24 * 1024) + "\n") << df;
  // A request's own limit wins over the default.
  auto mine = api.post("/v1/sessions", {{"id", "m"}, {"limits", {{"cpu_time_sec", 60}}}});
  ASSERT_EQ(mine.status, 201) << mine;
  EXPECT_EQ(mine.body["limits"]["cpu_time_sec"], 60) << mine;
}

TEST_F(LimitsConfig, DefaultDiskCapsNewWorkspaces) {
  Daemon d({"--backend", "ns", "--config", write_config(dir_, "default_limits:\n  disk_mb: 64\n")});
  Api api(d);
  auto s = api.post("/v1/sessions", {{"id", "capped"}});
  ASSERT_EQ(s.status, 201) << s;
  EXPECT_EQ(s.body["limits"]["disk_mb"], 64) << s;
  auto w = api.exec("capped", {{"command", "dd if=/dev/zero of=/workspace/big bs=1M count=200"},
                               {"timeout_sec", 60}});
  ASSERT_EQ(w.status, 200) << w;
  EXPECT_NE(w.body["exit_code"], 0) << w;
  EXPECT_NE(w.body["stderr"].get<std::string>().find("No space left"), std::string::npos) << w;
  EXPECT_EQ(api.del("/v1/sessions/capped").status, 200);
}

TEST_F(LimitsConfig, BadDefaultsStopTheDaemonNamingThem) {
  for (const std::string& bad : {std::string("default_limits:\n  cpu_time_sec: 1000000000\n"),
                                 std::string("default_limits:\n  memory_mb: 64\n  tmp_mb: 40\n"),
                                 std::string("default_limits:\n  tmp_mb: 0\n")}) {
    std::string out;
    int rc = Daemon::run_to_exit({"--listen", "127.0.0.1:0", "--data-dir", dir_ / "data",
                                  "--config", write_config(dir_, bad)},
                                 &out);
    EXPECT_NE(rc, 0) << bad;
    EXPECT_NE(out.find("default_limits."), std::string::npos) << bad << out;
  }
}

// Seed 001: a workspace the toolbox-server made under --workdir is owned by the uid it gave the
// agent; the session adopts that uid, so the agent can still write its old files.
TEST(SeedUid, AnExistingWorkspaceKeepsItsOwnersUid) {
  TempDir root("agentbox-seeduid");
  const std::string workdir = root / "workspace";
  const std::string agent = "engineer-acme_12345";
  const uid_t old_uid = 23456;  // in [10000, 70000), and not this agent's first probe
  fs::create_directories(workdir + "/" + agent + "/notes");
  ASSERT_TRUE(spit(workdir + "/" + agent + "/notes/todo.txt", "old\n"));
  for (const std::string& p :
       {std::string(""), std::string("/notes"), std::string("/notes/todo.txt")}) {
    ASSERT_EQ(::chown((workdir + "/" + agent + p).c_str(), old_uid, old_uid), 0) << p;
  }
  ::chmod((workdir + "/" + agent + "/notes/todo.txt").c_str(), 0644);

  Daemon d({"--workdir", workdir, "--multi-agent"});
  Api api(d);
  auto r =
      api.post("/exec", {{"command", "echo new >> notes/todo.txt && id -u && cat notes/todo.txt"},
                         {"env", {{"AGENT_ID", agent}}}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["exit_code"], 0) << r;
  EXPECT_EQ(r.body["stdout"], std::to_string(old_uid) + "\nold\nnew\n") << r;
  auto s = api.get("/v1/sessions/" + agent);
  EXPECT_EQ(s.body["uid"], old_uid) << s;
  struct stat st;
  ASSERT_EQ(::stat((workdir + "/" + agent + "/notes/todo.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, old_uid);

  // A new agent (no workspace yet) gets seed 001's first probe: FNV-1 32 % 60000 + 10000.
  auto n = api.post("/exec", {{"command", "id -u"}, {"env", {{"AGENT_ID", "a"}}}});
  ASSERT_EQ(n.status, 200) << n;
  EXPECT_EQ(n.body["stdout"], std::to_string(0x050c5d7eu % 60000 + 10000) + "\n") << n;
}

}  // namespace
}  // namespace agentbox::testing
