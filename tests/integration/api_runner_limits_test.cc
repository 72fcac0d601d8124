// Remote sessions tell the truth (issue 27 item 7) against the real daemon: a network other than
// "none" or a limit the session's runner does not enforce is 501 naming it, at create and on
// every later change (POST /network, running or suspended); a runner's register says what it
// enforces (docs/runner-protocol.md "Limits"), and the limits it enforces travel with every
// command; agentbox-runner, as root with the memory and pids cgroup controllers, enforces
// memory_mb and max_pids; a runner answering in seed 003's flat form is understood.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "integration/api_test_util.h"
#include "integration/fake_runner.h"

namespace agentbox::testing {
namespace {

std::vector<std::string> runner_args() {
  return {"--runner-token", "alice=alice-secret"};
}

struct Workspace {
  TempDir dir{"agentbox-runner-ws"};
  std::string path() const { return dir.path(); }
};

TEST(RunnerLimits, ANetworkOtherThanNoneIs501NamingNetworkAndNoSessionIsMade) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");
  for (const char* mode : {"allowlist", "open"}) {
    json net = {{"mode", mode}};
    if (std::string(mode) == "allowlist") net["allow"] = {"example.org"};
    auto c = api.post("/v1/sessions", {{"id", "n"}, {"runner", "alice"}, {"network", net}});
    EXPECT_EQ(c.status, 501) << c;
    EXPECT_EQ(c.code(), "ENOTSUP") << c;
    EXPECT_NE(c.message().find("network"), std::string::npos) << c;
    EXPECT_NE(c.message().find(mode), std::string::npos) << c;
    EXPECT_EQ(api.get("/v1/sessions/n").status, 404);
  }
  EXPECT_EQ(r.requests_seen(), 0);
}

TEST(RunnerLimits, ALimitTheRunnerDoesNotEnforceIs501NamingTheField) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  // xbot's runner: no `enforces` in its register, so none of a session's limits.
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");
  auto list = api.get("/v1/runners");
  EXPECT_EQ(list.body["runners"][0]["enforces"], json::array()) << list;
  for (const char* field : {"memory_mb", "max_pids", "cpu_percent", "cpu_time_sec",
                            "max_open_files", "disk_mb", "tmp_mb"}) {
    auto c =
        api.post("/v1/sessions", {{"id", "l"}, {"runner", "alice"}, {"limits", {{field, 64}}}});
    EXPECT_EQ(c.status, 501) << field << " " << c;
    EXPECT_NE(c.message().find(std::string("limits.") + field), std::string::npos) << c;
    EXPECT_EQ(api.get("/v1/sessions/l").status, 404);
  }
  // Without limits it is made, and shows none: the daemon's defaults are for its own boxes, and
  // a remote session's object does not claim limits nobody enforces.
  auto c = api.post("/v1/sessions", {{"id", "l"}, {"runner", "alice"}});
  ASSERT_EQ(c.status, 201) << c;
  EXPECT_FALSE(c.body["limits"].contains("memory_mb")) << c;
  EXPECT_FALSE(c.body["limits"].contains("max_pids")) << c;
  auto e = api.exec("l", {{"command", "echo ok"}});
  ASSERT_EQ(e.status, 200) << e;
  EXPECT_EQ(e.body["stdout"], "ok\n");
  // xbot's runner never sees agentbox's fields.
  EXPECT_FALSE(r.last_request()["body"].contains("limits")) << r.last_request();
  EXPECT_FALSE(r.last_request()["body"].contains("box")) << r.last_request();
}

TEST(RunnerLimits, PostNetworkOnARemoteSessionIs501RunningOrSuspendedAndExecsKeepWorking) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "s"}, {"runner", "alice"}}).status, 201);
  auto running = api.post("/v1/sessions/s/network", {{"mode", "allowlist"}, {"allow", {"a.test"}}});
  EXPECT_EQ(running.status, 501) << running;
  EXPECT_NE(running.message().find("network"), std::string::npos) << running;
  ASSERT_EQ(api.post("/v1/sessions/s/suspend", json::object()).status, 200);
  // Suspended: a mode change would be taken for the next resume, and then every command would
  // fail. It is refused now instead.
  for (const char* mode : {"allowlist", "open"}) {
    auto p = api.post("/v1/sessions/s/network", {{"mode", mode}});
    EXPECT_EQ(p.status, 501) << p;
    EXPECT_EQ(p.code(), "ENOTSUP") << p;
    EXPECT_NE(p.message().find("network"), std::string::npos) << p;
  }
  auto s = api.get("/v1/sessions/s");
  EXPECT_EQ(s.body["network"]["mode"], "none") << s;
  EXPECT_EQ(s.body["state"], "suspended") << s;
  // "none" is what it has: accepted.
  EXPECT_EQ(api.post("/v1/sessions/s/network", {{"mode", "none"}}).status, 200);
  auto e = api.exec("s", {{"command", "echo still"}});
  ASSERT_EQ(e.status, 200) << e;
  EXPECT_EQ(e.body["stdout"], "still\n");
}

TEST(RunnerLimits, ARunnerThatEnforcesMemoryAcceptsMemoryMbAndGetsItWithEveryCommand) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path(), /*version=*/1);
  r.register_extra({{"enforces", {"timeout", "output_cap", "memory_mb"}}});
  ASSERT_EQ(r.start()["type"], "register_ok");
  auto list = api.get("/v1/runners");
  EXPECT_EQ(list.body["runners"][0]["enforces"], json({"timeout", "output_cap", "memory_mb"}))
      << list;
  // What it does not say it enforces is still refused, naming it.
  auto pids = api.post(
      "/v1/sessions",
      {{"id", "m"}, {"runner", "alice"}, {"limits", {{"memory_mb", 64}, {"max_pids", 16}}}});
  EXPECT_EQ(pids.status, 501) << pids;
  EXPECT_NE(pids.message().find("limits.max_pids"), std::string::npos) << pids;
  auto c =
      api.post("/v1/sessions", {{"id", "m"}, {"runner", "alice"}, {"limits", {{"memory_mb", 64}}}});
  ASSERT_EQ(c.status, 201) << c;
  EXPECT_EQ(c.body["limits"]["memory_mb"], 64) << c;
  EXPECT_FALSE(c.body["limits"].contains("max_pids")) << c;
  auto e = api.exec("m", {{"command", "echo limited"}});
  ASSERT_EQ(e.status, 200) << e;
  EXPECT_EQ(e.body["stdout"], "limited\n");
  json seen = r.last_request();
  EXPECT_EQ(seen["type"], "exec");
  EXPECT_EQ(seen["body"]["box"], "m") << seen;
  EXPECT_EQ(seen["body"]["limits"], json({{"memory_mb", 64}})) << seen;
}

TEST(RunnerLimits, ASessionWhoseRunnerComesBackEnforcingLessIsRefusedNotRunUnlimited) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  {
    FakeRunner r(d, "alice", "alice-secret", ws.path());
    r.register_extra({{"enforces", {"memory_mb"}}});
    ASSERT_EQ(r.start()["type"], "register_ok");
    ASSERT_EQ(api.post("/v1/sessions",
                       {{"id", "b"}, {"runner", "alice"}, {"limits", {{"memory_mb", 64}}}})
                  .status,
              201);
  }
  FakeRunner plain(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(plain.start()["type"], "register_ok");
  ASSERT_TRUE(eventually([&] {
    auto l = api.get("/v1/runners");
    return l.body["runners"][0]["connected"] == true &&
           l.body["runners"][0]["enforces"] == json::array();
  }));
  auto e = api.exec("b", {{"command", "echo unlimited"}});
  EXPECT_EQ(e.status, 501) << e;
  EXPECT_NE(e.message().find("limits.memory_mb"), std::string::npos) << e;
  EXPECT_EQ(plain.requests_seen(), 0);
}

// Seed 003's text shows the replies with their fields at the top level; such a runner works.
TEST(RunnerFlatForm, ARunnerAnsweringInSeed003sFlatFormIsUnderstood) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  r.answer_flat(true);
  ASSERT_EQ(r.start()["type"], "register_ok");
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "f"}, {"runner", "alice"}}).status, 201);
  auto e = api.exec("f", {{"command", "echo flat; echo err >&2; exit 2"}});
  ASSERT_EQ(e.status, 200) << e;
  EXPECT_EQ(e.body["stdout"], "flat\n");
  EXPECT_EQ(e.body["stderr"], "err\n");
  EXPECT_EQ(e.body["exit_code"], 2);
  ASSERT_TRUE(spit(ws.path() + "/seed.txt", "seed 003"));
  auto get = api.get(files_target("f", "seed.txt"));
  ASSERT_EQ(get.status, 200) << get;
  EXPECT_EQ(get.raw, "seed 003");
  auto st = api.get("/v1/sessions/f/stat?path=seed.txt");
  ASSERT_EQ(st.status, 200) << st;
  EXPECT_EQ(st.body["size"], 8) << st;
  auto ls = api.get("/v1/sessions/f/dir?path=.");
  ASSERT_EQ(ls.status, 200) << ls;
  EXPECT_NE(ls.raw.find("seed.txt"), std::string::npos) << ls;
  auto put = api.put(files_target("f", "up.txt"), "written");
  EXPECT_TRUE(put.status == 200 || put.status == 201) << put;
  EXPECT_EQ(read_host_file(ws.path() + "/up.txt"), "written");
  // An error in the flat form ({"id","type":"error","message","code"}) keeps its code.
  auto missing = api.get(files_target("f", "nope.txt"));
  EXPECT_EQ(missing.status, 404) << missing;
}

// The pids of the real agentbox-runner's cgroup dirs left on this host (none after it stopped).
std::vector<std::string> runner_cgroups(pid_t runner) {
  std::vector<std::string> out;
  const std::string name = "agentbox-runner-" + std::to_string(runner);
  for (const char* root : {"/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup"}) {
    std::error_code ec;
    if (std::filesystem::exists(std::string(root) + "/" + name, ec)) {
      out.push_back(std::string(root) + "/" + name);
    }
  }
  return out;
}

// agentbox-runner as root on Linux (these tests run as root): memory_mb and max_pids through a
// cgroup of its own per session; what is left goes when it stops.
TEST(RunnerLimitsReal, AgentboxRunnerAsRootEnforcesMemoryAndPids) {
  ASSERT_EQ(::geteuid(), 0u) << "the runner enforces memory and pids as root only";
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  RunnerProcess runner(d.host_port(), "alice", "alice-secret", ws.path());
  ASSERT_TRUE(eventually([&] {
    auto l = api.get("/v1/runners");
    return l.status == 200 && l.body["runners"][0]["connected"] == true;
  })) << d.log();
  auto list = api.get("/v1/runners");
  EXPECT_EQ(list.body["runners"][0]["enforces"],
            json({"timeout", "output_cap", "memory_mb", "max_pids"}))
      << list;
  auto c = api.post(
      "/v1/sessions",
      {{"id", "lim"}, {"runner", "alice"}, {"limits", {{"memory_mb", 48}, {"max_pids", 12}}}});
  ASSERT_EQ(c.status, 201) << c;
  EXPECT_EQ(c.body["limits"]["memory_mb"], 48);
  EXPECT_EQ(c.body["limits"]["max_pids"], 12);
  // tail -n 1 keeps a line until its end: 200 MB without a newline is held whole, past 48 MB.
  auto oom = api.exec("lim", {{"command", "head -c 200000000 /dev/zero | tail -n 1 | wc -c"}});
  ASSERT_EQ(oom.status, 200) << oom;
  EXPECT_NE(oom.body["stdout"], "200000000\n") << oom;
  // The same on a session without limits succeeds: it was the limit.
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "free"}, {"runner", "alice"}}).status, 201);
  auto fine = api.exec("free", {{"command", "head -c 200000000 /dev/zero | tail -n 1 | wc -c"}});
  ASSERT_EQ(fine.status, 200) << fine;
  EXPECT_EQ(fine.body["stdout"], "200000000\n") << fine;
  // 12 tasks at most in the session: 30 sleeps cannot all start.
  auto forks = api.exec(
      "lim",
      {{"command", "n=0; for i in $(seq 30); do sleep 3 & n=$((n+1)); done; wait; echo $n"}});
  ASSERT_EQ(forks.status, 200) << forks;
  EXPECT_NE(forks.body["stderr"].get<std::string>(), "") << forks;
  auto fine_forks =
      api.exec("free", {{"command", "for i in $(seq 30); do sleep 0.2 & done; wait; echo done"}});
  ASSERT_EQ(fine_forks.status, 200) << fine_forks;
  EXPECT_EQ(fine_forks.body["stderr"], "") << fine_forks;
  const pid_t rp = runner.pid();
  EXPECT_FALSE(runner_cgroups(rp).empty());  // its parent dirs, made on first use
  runner.stop();
  EXPECT_EQ(runner_cgroups(rp), std::vector<std::string>{});
}

}  // namespace
}  // namespace agentbox::testing
