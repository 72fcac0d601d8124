// Sessions that last (issue "Sessions that last"): suspend/resume through the API, sessions that
// come back after a restart and after kill -9, no acknowledged write lost to a kill -9 at any
// moment, the TTL reaper (idle means no API use AND no command running), idle eviction,
// mounts and skills read-only inside the box, default scope templates, and the backend a
// client may pick.

#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;


std::string process_count(Api& api, const std::string& id, const std::string& comm) {
  auto r = api.sh(id, "n=0; for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = " + comm +
                          " ] && n=$((n+1)); done; echo $n");
  return r.body.value("stdout", "?");
}

TEST(LifecycleNs, SuspendEndsTheBoxKeepsFilesAndUidAndAnyUseResumes) {
  Daemon d({"--backend", "ns"});
  Api api(d);
  auto created = api.post("/v1/sessions", {{"id", "life"}});
  ASSERT_EQ(created.status, 201) << created;
  const int uid = created.body["uid"];
  auto bg = api.sh("life", "echo kept > /workspace/f; (sleep 300 &) ; echo started");
  ASSERT_EQ(bg.body["stdout"], "started\n") << bg;
  ASSERT_EQ(process_count(api, "life", "sleep"), "1\n") << "the background job should run";

  auto s = api.call("POST", "/v1/sessions/life/suspend");
  ASSERT_EQ(s.status, 200) << s;
  EXPECT_EQ(s.body["state"], "suspended");
  EXPECT_EQ(s.body["uid"], uid);
  EXPECT_EQ(api.get("/v1/sessions/life").body["state"], "suspended");

  // A file read resumes it too; then an exec sees the same workspace, uid, and no old process.
  auto f = api.get(files_target("life", "f"));
  EXPECT_EQ(f.status, 200) << f;
  EXPECT_EQ(f.raw, "kept\n");
  EXPECT_EQ(api.get("/v1/sessions/life").body["state"], "running");
  auto who = api.sh("life", "id -u; cat /workspace/f");
  EXPECT_EQ(who.body["stdout"], std::to_string(uid) + "\nkept\n") << who;
  EXPECT_EQ(process_count(api, "life", "sleep"), "0\n") << "suspend must end every process";

  // Metrics count the states.
  ASSERT_EQ(api.call("POST", "/v1/sessions/life/suspend").status, 200);
  auto m = api.get("/metrics");
  EXPECT_NE(m.raw.find("agentbox_sessions{state=\"suspended\"} 1"), std::string::npos) << m.raw;
}

// kill -9 of the daemon (its boxes die with it): the next daemon on the same data dir has every
// session, suspended, with its uid, tenant-visible fields and files; first use resumes it.
TEST(LifecycleNs, SessionsComeBackAfterKillNineAndResumeOnFirstUse) {
  TempDir tmp("agentbox-life");
  const std::string data = tmp.path() + "/data";
  int uid = 0;
  {
    Daemon d({"--backend", "ns", "--data-dir", data});
    Api api(d);
    auto c = api.post("/v1/sessions", {{"id", "keep"},
                                       {"labels", {{"team", "a"}}},
                                       {"limits", {{"memory_mb", 300}}},
                                       {"ttl_sec", 600}});
    ASSERT_EQ(c.status, 201) << c;
    uid = c.body["uid"];
    ASSERT_EQ(api.put(files_target("keep", "notes.txt"), "acknowledged").status, 200);
    ASSERT_EQ(api.sh("keep", "mkdir -p src && echo 'print(1)' > src/a.py").body["exit_code"], 0);
    ASSERT_EQ(api.post("/v1/sessions", {{"id", "other"}}).status, 201);
    ASSERT_EQ(api.call("POST", "/v1/sessions/other/suspend").status, 200);
    EXPECT_EQ(d.stop(SIGKILL), 128 + SIGKILL);
  }
  Daemon d({"--backend", "ns", "--data-dir", data});
  Api api(d);
  auto list = api.get("/v1/sessions");
  ASSERT_EQ(list.body["sessions"].size(), 2u) << list;
  auto s = api.get("/v1/sessions/keep");
  ASSERT_EQ(s.status, 200) << s;
  EXPECT_EQ(s.body["state"], "suspended");
  EXPECT_EQ(s.body["uid"], uid);
  EXPECT_EQ(s.body["labels"]["team"], "a");
  EXPECT_EQ(s.body["limits"]["memory_mb"], 300);
  EXPECT_EQ(s.body["ttl_sec"], 600);
  EXPECT_EQ(s.body["backend"], "ns");
  auto r = api.sh("keep", "id -u; cat notes.txt; cat src/a.py");
  EXPECT_EQ(r.body["stdout"], std::to_string(uid) + "\nacknowledgedprint(1)\n") << r;
  EXPECT_EQ(api.get("/v1/sessions/keep").body["state"], "running");
  // Re-creating it is the same session (200), not a new one.
  EXPECT_EQ(api.post("/v1/sessions", {{"id", "keep"}}).status, 200);
  // A clean stop and start: same again.
  EXPECT_EQ(d.stop(SIGTERM), 0);
  Daemon d2({"--backend", "ns", "--data-dir", data});
  Api api2(d2);
  EXPECT_EQ(api2.get("/v1/sessions/keep").body["uid"], uid);
  EXPECT_EQ(api2.get(files_target("keep", "notes.txt")).raw, "acknowledged");
}

// The kill -9 loop: writers PUT files (new ones, and overwrites of one hot file) while the daemon
// is killed at a random moment; after each restart every write that was answered 200 reads back
// byte for byte, a write that was in flight is either absent or whole (for the hot file: the
// last acknowledged version or a later one), sessions whose create was answered exist, and no
// temp file of an interrupted write is left behind.
TEST(LifecycleKill, NoAcknowledgedWriteIsLostToKillNine) {
  TempDir tmp("agentbox-life");
  const std::string data = tmp.path() + "/data";
  constexpr int kRounds = 6;
  std::mt19937 rng(20261122);
  std::map<std::string, std::string> acked;  // path -> content answered 200
  std::map<std::string, std::string> maybe;  // in flight at the kill: absent or exactly this
  std::vector<std::string> acked_sessions;
  std::map<int, std::string> hot_versions;  // seq -> content
  int hot_acked = -1;
  int hot_sent = -1;
  std::size_t total_acked = 0, total_inflight = 0;

  auto content_for = [&](const std::string& key, std::size_t size) {
    std::string s;
    s.reserve(size);
    std::uint32_t x = std::hash<std::string>{}(key) | 1;
    while (s.size() < size) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      s.push_back(static_cast<char>(x));
    }
    return s;
  };

  for (int round = 0; round < kRounds; ++round) {
    Daemon d({"--data-dir", data});  // host backend: the write path is the same RootedFs
    Api api(d);
    // Everything acknowledged before the last kill is here, intact.
    for (const std::string& id : acked_sessions) {
      EXPECT_EQ(api.get("/v1/sessions/" + id).status, 200) << "round " << round << ": " << id;
    }
    for (const auto& [path, want] : acked) {
      auto got = api.get(files_target("kill", path));
      ASSERT_EQ(got.status, 200) << "round " << round << ": acknowledged " << path << " lost";
      ASSERT_EQ(got.raw.size(), want.size()) << path;
      ASSERT_TRUE(got.raw == want) << "round " << round << ": " << path << " corrupted";
    }
    for (const auto& [path, whole] : maybe) {
      auto got = api.get(files_target("kill", path));
      if (got.status == 404) continue;
      ASSERT_EQ(got.status, 200) << path;
      ASSERT_TRUE(got.raw == whole) << "round " << round << ": in-flight " << path << " is torn";
      acked[path] = whole;
    }
    maybe.clear();
    if (hot_acked >= 0) {
      auto got = api.get(files_target("kill", "hot.bin"));
      ASSERT_EQ(got.status, 200);
      int found = -1;
      for (int v = hot_acked; v <= hot_sent; ++v) {
        if (hot_versions[v] == got.raw) found = v;
      }
      ASSERT_GE(found, hot_acked)
          << "round " << round << ": hot.bin is neither the acknowledged version nor a later one";
      hot_acked = found;
    }
    // The sweep of temp files left by the killed daemon runs in the background at startup.
    const std::string ws = data + "/workspaces/kill";
    EXPECT_TRUE(eventually([&] {
      if (!fs::exists(ws)) return true;
      for (const auto& e : fs::recursive_directory_iterator(ws)) {
        if (e.path().filename().string().rfind(".agentbox-tmp-", 0) == 0) return false;
      }
      return true;
    })) << "round "
        << round << ": temp files of interrupted writes were left";

    std::string sid = "k" + std::to_string(round);
    ASSERT_EQ(api.post("/v1/sessions", {{"id", sid}}).status, 201);
    acked_sessions.push_back(sid);
    api.create("kill");

    // Writers go until the kill; the kill comes at a random moment.
    std::mutex mu;
    std::atomic<bool> stop{false};
    auto writer = [&](int w) {
      client::Client c(d.options());
      for (int i = 0; !stop.load(); ++i) {
        std::string path;
        std::string body;
        int seq = -1;
        {
          std::lock_guard lk(mu);
          if (w == 0 && i % 2 == 1) {
            seq = ++hot_sent;
            path = "hot.bin";
            hot_versions[seq] = content_for("hot" + std::to_string(seq), 64 * 1024 + seq);
            body = hot_versions[seq];
          } else {
            path = "r" + std::to_string(round) + "/w" + std::to_string(w) + "_" +
                   std::to_string(i) + ".bin";
            body = content_for(path, 1024 + (rng() % (512 * 1024)));
            maybe[path] = body;
          }
        }
        auto r = c.request("PUT", files_target("kill", path, "&mkdirs=true"), body,
                           "application/octet-stream");
        std::lock_guard lk(mu);
        if (r && r->status == 200) {
          ++total_acked;
          if (seq >= 0) {
            hot_acked = std::max(hot_acked, seq);
          } else {
            acked[path] = body;
            maybe.erase(path);
          }
        } else {
          if (seq < 0 && r && r->status != 200) maybe.erase(path);  // refused, not in flight
          if (!r) break;                                            // the daemon is gone
        }
      }
    };
    std::thread w0(writer, 0), w1(writer, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + rng() % 600));
    EXPECT_EQ(d.stop(SIGKILL), 128 + SIGKILL);
    stop = true;
    w0.join();
    w1.join();
    total_inflight += maybe.size();
  }
  // Once more on the data dir, stopped cleanly: it removes what the last SIGKILLed daemon left
  // outside it (its cgroups, on the ns backend) before the data dir goes.
  { Daemon last({"--data-dir", data}); }
  std::cout << "kill -9 loop: " << kRounds << " kills, " << total_acked << " acknowledged writes, "
            << acked.size() << " distinct files checked after every "
            << "restart, " << total_inflight << " writes in flight at a kill; none lost or torn\n";
  RecordProperty("acknowledged_writes", static_cast<int>(total_acked));
  EXPECT_GT(total_acked, static_cast<std::size_t>(kRounds * 4)) << "the loop wrote too little";
}

// Idle means no API use and no command running: a long command keeps its session up past the
// TTL; the session is suspended once the command ends and the TTL passes again.
TEST(LifecycleTtl, ReaperSuspendsIdleSessionsButNotOneRunningACommand) {
  Daemon d({"--ttl-sec", "2"});
  Api api(d);
  api.create("idle");
  api.create("busy");
  std::thread long_cmd([&] {
    Api a2(d);
    auto r = a2.sh("busy", "sleep 4; echo done");
    EXPECT_EQ(r.body["stdout"], "done\n") << r;
  });
  EXPECT_TRUE(
      eventually([&] { return api.get("/v1/sessions/idle").body["state"] == "suspended"; }, 6));
  EXPECT_EQ(api.get("/v1/sessions/busy").body["state"], "running") << "reaped mid-command";
  long_cmd.join();
  EXPECT_EQ(api.get("/v1/sessions/busy").body["state"], "running");
  EXPECT_TRUE(
      eventually([&] { return api.get("/v1/sessions/busy").body["state"] == "suspended"; }, 6));
  // keepalive keeps a session up.
  api.create("kept");
  for (int i = 0; i < 6; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ASSERT_EQ(api.call("POST", "/v1/sessions/kept/keepalive").status, 200);
  }
  EXPECT_EQ(api.get("/v1/sessions/kept").body["state"], "running");
  // The reaper's doings are in the audit log, said to be the daemon's.
  std::string audit = read_host_file(d.data_dir() + "/audit.log");
  EXPECT_NE(audit.find("\"event\":\"session.suspend\""), std::string::npos) << audit;
  EXPECT_NE(audit.find("\"by\":\"agentboxd\""), std::string::npos) << audit;
}

TEST(LifecycleTtl, TtlActionDestroyRemovesTheSession) {
  Daemon d({"--ttl-sec", "1", "--ttl-action", "destroy"});
  Api api(d);
  api.create("brief");
  EXPECT_TRUE(eventually([&] { return api.get("/v1/sessions/brief").status == 404; }, 6));
  EXPECT_FALSE(fs::exists(d.data_dir() + "/workspaces/brief"));
  std::string out;
  EXPECT_EQ(Daemon::run_to_exit({"--ttl-action", "archive"}, &out), 2);
  EXPECT_NE(out.find("ttl_action"), std::string::npos) << out;
}

TEST(LifecycleQuota, EvictIdleSuspendsTheLeastRecentlyUsedBox) {
  Daemon d({"--max-running-boxes", "1", "--evict-idle"});
  Api api(d);
  api.create("first");
  auto second = api.post("/v1/sessions", {{"id", "second"}});
  ASSERT_EQ(second.status, 201) << second;
  EXPECT_EQ(api.get("/v1/sessions/first").body["state"], "suspended");
  EXPECT_EQ(api.get("/v1/sessions/second").body["state"], "running");
  // Using the first brings it back and evicts the second.
  EXPECT_EQ(api.sh("first", "echo back").body["stdout"], "back\n");
  EXPECT_EQ(api.get("/v1/sessions/second").body["state"], "suspended");
}

TEST(LifecycleMounts, MountsAndSkillsAreThereFromTheStartAndReadOnlyIsReadOnly) {
  TempDir roots("agentbox-life");
  fs::create_directories(roots.path() + "/allowed/data");
  fs::create_directories(roots.path() + "/allowed/skills/web");
  fs::create_directories(roots.path() + "/allowed/rw");
  fs::create_directories(roots.path() + "/forbidden");
  std::ofstream(roots.path() + "/allowed/data/x.csv") << "a,b\n";
  std::ofstream(roots.path() + "/allowed/skills/web/SKILL.md") << "# web\n";
  ::chmod((roots.path() + "/allowed/rw").c_str(), 0777);
  Daemon d({"--backend", "ns", "--allow-mount-root", roots.path() + "/allowed"});
  Api api(d);
  auto c = api.post(
      "/v1/sessions",
      {{"id", "m"},
       {"mounts",
        {{{"host_path", roots.path() + "/allowed/data"}, {"mount_path", "/data"}, {"mode", "ro"}},
         {{"host_path", roots.path() + "/allowed/rw"}, {"mount_path", "/scratch"}, {"mode", "rw"}}}},
       {"skills", {{"web", roots.path() + "/allowed/skills/web"}}},
       {"skill_mode", "ro"}});  // skills are rw by default (seed 002)
  ASSERT_EQ(c.status, 201) << c;
  auto r = api.sh("m", "cat /data/x.csv /workspace/.skills/web/SKILL.md");
  EXPECT_EQ(r.body["stdout"], "a,b\n# web\n") << r;
  auto ro = api.sh("m",
                   "touch /data/new 2>&1; echo rc=$?; touch /workspace/.skills/web/n 2>&1;"
                   " echo rc=$?");
  EXPECT_NE(ro.body["stdout"].get<std::string>().find("Read-only file system"), std::string::npos)
      << ro;
  EXPECT_EQ(ro.body["stdout"].get<std::string>().find("rc=0"), std::string::npos) << ro;
  EXPECT_FALSE(fs::exists(roots.path() + "/allowed/data/new"));
  auto put = api.put(files_target("m", "/data/y.csv"), "z");
  EXPECT_EQ(put.status, 403) << put;
  EXPECT_EQ(put.code(), "EACCES");
  auto rw = api.sh("m", "echo w > /scratch/out && cat /scratch/out");
  EXPECT_EQ(rw.body["stdout"], "w\n") << rw;
  EXPECT_TRUE(fs::exists(roots.path() + "/allowed/rw/out"));
  // Mounts stay after suspend/resume.
  ASSERT_EQ(api.call("POST", "/v1/sessions/m/suspend").status, 200);
  EXPECT_EQ(api.sh("m", "cat /data/x.csv").body["stdout"], "a,b\n");

  auto outside = api.post(
      "/v1/sessions",
      {{"id", "bad"},
       {"mounts",
        {{{"host_path", roots.path() + "/forbidden"}, {"mount_path", "/f"}, {"mode", "ro"}}}}});
  EXPECT_EQ(outside.status, 403) << outside;
  EXPECT_EQ(outside.code(), "EACCES");
  auto etc = api.post("/v1/sessions", {{"id", "bad"}, {"skills", {{"x", "/etc"}}}});
  EXPECT_EQ(etc.status, 403) << etc;
  auto missing =
      api.post("/v1/sessions", {{"id", "bad"}, {"skills", {{"x", roots.path() + "/allowed/nope"}}}});
  EXPECT_EQ(missing.status, 404) << missing;  // API.md "Sessions": a missing host dir
  EXPECT_EQ(missing.code(), "ENOENT") << missing;
  EXPECT_NE(missing.message().find("skills.x"), std::string::npos) << missing;
  // Nothing half-created.
  EXPECT_EQ(api.get("/v1/sessions/bad").status, 404);
  EXPECT_FALSE(fs::exists(d.data_dir() + "/workspaces/bad"));
}

TEST(LifecycleScope, DefaultScopeTemplateNamesTheSessionFromVariables) {
  Daemon d({"--default-scope", "{launcher_type}_{launcher_id}"});
  Api api(d);
  auto r =
      api.post("/v1/sessions", {{"variables", {{"launcher_type", "group"}, {"launcher_id", 42}}}});
  ASSERT_EQ(r.status, 201) << r;
  EXPECT_EQ(r.body["id"], "group_42");
  auto none = api.post("/v1/sessions", json::object());
  EXPECT_EQ(none.status, 400) << none;
  EXPECT_EQ(none.code(), "EINVAL");
}

// SECURITY: on an ns daemon a client cannot choose the unisolated host backend unless the
// operator allowed it.
TEST(LifecycleBackend, HostBackendOnlyWhenTheOperatorAllowsIt) {
  {
    Daemon d({"--backend", "ns"});
    Api api(d);
    auto r = api.post("/v1/sessions", {{"id", "esc"}, {"backend", "host"}});
    EXPECT_EQ(r.status, 400) << r;
    EXPECT_EQ(r.code(), "EINVAL");
    EXPECT_NE(r.message().find("host"), std::string::npos) << r;
    EXPECT_EQ(api.get("/v1/sessions/esc").status, 404);
  }
  Daemon d({"--backend", "ns", "--allow-backend", "host"});
  Api api(d);
  auto r = api.post("/v1/sessions", {{"id", "dev"}, {"backend", "host"}});
  EXPECT_EQ(r.status, 201) << r;
  EXPECT_EQ(r.body["backend"], "host");
}

}  // namespace
}  // namespace agentbox::testing
