// Remote runners against the real daemon (API.md "Runners", shared/PROTOCOLS.md part 1,
// SECURITY.md T8): a fake xbot-style runner (fake_runner.h) dials GET /ws/{user}; sessions with
// backend "remote" run their commands and files on it through /v1.

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "integration/api_test_util.h"
#include "integration/fake_runner.h"
#include "integration/ws_test_util.h"

namespace agentbox::testing {
namespace {

using namespace std::chrono_literals;

std::vector<std::string> runner_args() {
  return {"--runner-token", "alice=alice-secret", "--runner-token", "bob=bob-secret"};
}

// A runner workspace dir on this host (what the fake runner serves).
struct Workspace {
  TempDir dir{"agentbox-runner-ws"};
  std::string path() const { return dir.path(); }
};

TEST(RunnerApiRegister, XbotRegisterWithoutVersionIsAcceptedAndListed) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  json answer = r.start();
  ASSERT_TRUE(answer.is_object()) << answer;
  // Byte for byte what xbot's server sends: no id.
  EXPECT_EQ(answer, json::parse(R"({"type":"register_ok","body":{"status":"ok"}})"));
  auto list = api.get("/v1/runners");
  ASSERT_EQ(list.status, 200) << list;
  ASSERT_EQ(list.body["runners"].size(), 2u) << list;
  const json& a = list.body["runners"][0];
  EXPECT_EQ(a["user"], "alice");
  EXPECT_EQ(a["connected"], true);
  EXPECT_EQ(a["workspace"], ws.path());
  EXPECT_EQ(a["shell"], "/bin/sh");
  EXPECT_TRUE(a["version"].is_null()) << a;
  EXPECT_TRUE(is_rfc3339_utc(a["connected_at"].get<std::string>())) << a;
  EXPECT_EQ(list.body["runners"][1]["user"], "bob");
  EXPECT_EQ(list.body["runners"][1]["connected"], false);
  auto metrics = api.get("/metrics");
  EXPECT_NE(metrics.raw.find("\nagentbox_runner_connections 1\n"), std::string::npos);
}

TEST(RunnerApiRegister, VersionIsReported) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path(), /*version=*/1);
  // docs/runner-protocol.md: a runner that asks for version 1 gets it back (chunked files).
  EXPECT_EQ(r.start(),
            json::parse(R"({"type":"register_ok","body":{"status":"ok","version":1}})"));
  auto list = api.get("/v1/runners");
  EXPECT_EQ(list.body["runners"][0]["version"], 1) << list;
}

TEST(RunnerApiRegister, WrongTokenOtherUsersTokenAndUserMismatchAreRefusedAndClosed) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  {
    FakeRunner r(d, "alice", "wrong", ws.path());
    json a = r.start();
    EXPECT_EQ(a, json::parse(R"({"type":"error","body":{"message":"authentication failed",
                                   "code":"AUTH_FAILED"}})"));
    EXPECT_TRUE(eventually([&] { return r.ended(); }, 5));
  }
  {
    FakeRunner r(d, "alice", "bob-secret", ws.path());  // bob's token for alice
    EXPECT_EQ(r.start()["body"]["code"], "AUTH_FAILED");
    EXPECT_TRUE(eventually([&] { return r.ended(); }, 5));
  }
  {
    FakeRunner r(d, "alice", "alice-secret", ws.path(), 0, "bob");  // body user != URL user
    EXPECT_EQ(r.start()["body"]["code"], "FORBIDDEN");
    EXPECT_TRUE(eventually([&] { return r.ended(); }, 5));
  }
  {
    FakeRunner r(d, "mallory", "x", ws.path());  // not configured
    EXPECT_EQ(r.start()["body"]["code"], "AUTH_FAILED");
  }
  auto list = api.get("/v1/runners");
  for (const json& x : list.body["runners"]) EXPECT_EQ(x["connected"], false) << list;
  // Audited.
  EXPECT_NE(read_host_file(d.data_dir() + "/audit.log").find("runner.refused"),
            std::string::npos);
}

TEST(RunnerApiSessions, ExecAndFilesOnARemoteSession) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");

  auto c = api.post("/v1/sessions", {{"id", "rs"}, {"backend", "remote"}, {"runner", "alice"}});
  ASSERT_EQ(c.status, 201) << c;
  EXPECT_EQ(c.body["backend"], "remote");
  EXPECT_EQ(c.body["workspace"], ws.path());
  EXPECT_EQ(c.body["runner"], "alice");

  auto e = api.exec("rs", {{"command", "echo out; echo err >&2; pwd; exit 3"}});
  ASSERT_EQ(e.status, 200) << e;
  EXPECT_EQ(e.body["stdout"], "out\n" + ws.path() + "\n");
  EXPECT_EQ(e.body["stderr"], "err\n");
  EXPECT_EQ(e.body["exit_code"], 3);
  // The request the runner saw: shell form, the workspace-relative timeout in seconds.
  json seen = r.last_request();
  EXPECT_EQ(seen["type"], "exec");
  EXPECT_EQ(seen["user_id"], "alice");
  EXPECT_TRUE(seen["id"].get<std::string>().starts_with("req_")) << seen;
  EXPECT_EQ(seen["body"]["shell"], true);

  // argv form: args[0] is the program.
  auto e2 = api.exec("rs", {{"argv", {"/bin/echo", "a b", "c"}}});
  ASSERT_EQ(e2.status, 200) << e2;
  EXPECT_EQ(e2.body["stdout"], "a b c\n");
  EXPECT_EQ(r.last_request()["body"]["args"], json({"/bin/echo", "a b", "c"}));

  // Files through /v1 land in the runner's workspace.
  auto put = api.put(files_target("rs", "dir/a.txt", "&mkdirs=true"), "hello remote");
  ASSERT_TRUE(put.status == 200 || put.status == 201) << put;
  EXPECT_EQ(read_host_file(ws.path() + "/dir/a.txt"), "hello remote");
  auto get = api.get(files_target("rs", "/workspace/dir/a.txt"));
  ASSERT_EQ(get.status, 200) << get;
  EXPECT_EQ(get.raw, "hello remote");
  auto st = api.get("/v1/sessions/rs/stat?path=dir/a.txt");
  ASSERT_EQ(st.status, 200) << st;
  EXPECT_EQ(st.body["size"], 12);
  auto sd = api.get("/v1/sessions/rs/stat?path=dir");
  ASSERT_EQ(sd.status, 200) << sd;
  EXPECT_EQ(sd.body["is_dir"], true) << sd;
  auto ls = api.get("/v1/sessions/rs/dir?path=dir");
  ASSERT_EQ(ls.status, 200) << ls;
  EXPECT_NE(ls.raw.find("a.txt"), std::string::npos) << ls;
  // A non-empty dir: xbot's runner says EEXIST; the API says what it is.
  auto rm = api.del(files_target("rs", "dir"));
  EXPECT_EQ(rm.status, 409) << rm;
  auto rmr = api.del(files_target("rs", "dir", "&recursive=true"));
  EXPECT_TRUE(rmr.status == 200 || rmr.status == 204) << rmr;
  EXPECT_FALSE(std::filesystem::exists(ws.path() + "/dir"));
  auto missing = api.get(files_target("rs", "nope.txt"));
  EXPECT_EQ(missing.status, 404) << missing;
  // A path out of the workspace never reaches the runner.
  int before = r.requests_seen();
  auto out = api.get(files_target("rs", "/etc/passwd"));
  EXPECT_EQ(out.status, 403) << out;
  EXPECT_EQ(r.requests_seen(), before);
  // What the protocol has no request for is 501 naming it.
  auto mv = api.post("/v1/sessions/rs/rename", {{"from", "a"}, {"to", "b"}});
  EXPECT_EQ(mv.status, 501) << mv;
  EXPECT_NE(mv.message().find("rename"), std::string::npos) << mv;
  // Processes need version 2's streams (xbot's stdio drops stderr, its pty takes no input).
  before = r.requests_seen();
  auto proc = api.post("/v1/sessions/rs/processes", {{"command", "sleep 1"}});
  EXPECT_EQ(proc.status, 501) << proc;
  EXPECT_NE(proc.message().find("version 2"), std::string::npos) << proc;
  EXPECT_EQ(r.requests_seen(), before);
  // A streaming exec on xbot's runner is its one `exec` frame, output at the end.
  auto se = api.call("POST", "/v1/sessions/rs/exec/stream", json{{"command", "echo s"}}.dump());
  EXPECT_EQ(se.status, 200) << se;
  EXPECT_NE(se.raw.find(R"({"data":"s\n","type":"stdout"})"), std::string::npos) << se;
  EXPECT_EQ(r.last_request()["type"], "exec");
  auto art = api.exec("rs", {{"command", "true"}, {"artifact_dir", "out"}});
  EXPECT_EQ(art.status, 501) << art;
  EXPECT_NE(art.message().find("artifact_dir"), std::string::npos) << art;
}

TEST(RunnerApiSessions, GoFileModeBitsBecomePosixModes) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "m"}, {"runner", "alice"}}).status, 201);
  ASSERT_TRUE(spit(ws.path() + "/x", "1"));
  ::chmod((ws.path() + "/x").c_str(), 0640);
  auto st = api.get("/v1/sessions/m/stat?path=x");
  ASSERT_EQ(st.status, 200) << st;
  EXPECT_EQ(st.body["mode"].get<std::uint32_t>(), static_cast<std::uint32_t>(S_IFREG | 0640))
      << st;
  auto sd = api.get("/v1/sessions/m/stat?path=.");
  ASSERT_EQ(sd.status, 200) << sd;
  EXPECT_TRUE(S_ISDIR(sd.body["mode"].get<std::uint32_t>())) << sd;
}

TEST(RunnerApiSessions, RunnerNotConnectedIs503AndOtherTenantsRunnerIsInvisible) {
  TempDir cfgdir("agentbox-runner-cfg");
  std::string cfg = cfgdir.path() + "/c.yaml";
  ASSERT_TRUE(spit(cfg, R"(tenants:
  - {name: a, tokens: [ta]}
  - {name: b, tokens: [tb]}
runners:
  - {user: alice, token: s1, tenant: a}
)"));
  Daemon d({"--config", cfg});
  Api a(d, "ta"), b(d, "tb");
  auto off = a.post("/v1/sessions", {{"id", "s"}, {"runner", "alice"}});
  EXPECT_EQ(off.status, 503) << off;
  EXPECT_EQ(off.code(), "EUNAVAILABLE");
  Workspace ws;
  FakeRunner r(d, "alice", "s1", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");
  auto other = b.post("/v1/sessions", {{"id", "s2"}, {"runner", "alice"}});
  EXPECT_EQ(other.status, 404) << other;
  EXPECT_EQ(b.get("/v1/runners").body["runners"].size(), 0u);
  EXPECT_EQ(a.get("/v1/runners").body["runners"].size(), 1u);
  auto ok = a.post("/v1/sessions", {{"id", "s"}, {"runner", "alice"}});
  EXPECT_EQ(ok.status, 201) << ok;
  // A runner field without backend remote, mounts on a remote session: refused, naming them.
  auto bad = a.post("/v1/sessions", {{"id", "s3"}, {"backend", "host"}, {"runner", "alice"}});
  EXPECT_EQ(bad.status, 400) << bad;
  auto nr = a.post("/v1/sessions", {{"id", "s4"}, {"backend", "remote"}});
  EXPECT_EQ(nr.status, 400) << nr;
  EXPECT_NE(nr.message().find("runner"), std::string::npos) << nr;
}

// The daemon's workspace folder is not the runner's files: archive and restore of a remote
// session are refused (501 naming it), never a 2xx that archives or restores the wrong folder.
TEST(RunnerApiSessions, ArchiveAndRestoreOfARemoteSessionAre501) {
  auto args = runner_args();
  args.insert(args.end(), {"--default-runner", "alice", "--allow-backend", "host"});
  Daemon d(args);
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "ar"}, {"runner", "alice"}}).status, 201);
  ASSERT_TRUE(spit(ws.path() + "/keep.txt", "runner file"));
  auto del = api.del("/v1/sessions/ar?archive=true");
  EXPECT_EQ(del.status, 501) << del;
  EXPECT_EQ(del.code(), "ENOTSUP") << del;
  EXPECT_NE(del.message().find("archive of a remote session (backend remote)"), std::string::npos)
      << del;
  // Nothing happened: the session and the runner's files are still there, no archive written.
  EXPECT_EQ(api.get("/v1/sessions/ar").status, 200);
  EXPECT_EQ(read_host_file(ws.path() + "/keep.txt"), "runner file");
  EXPECT_FALSE(std::filesystem::exists(d.data_dir() + "/archives") &&
               !std::filesystem::is_empty(d.data_dir() + "/archives"));
  // A real archive (of a host session on the same daemon): restoring it would make a remote one.
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "h"}, {"backend", "host"}}).status, 201);
  auto harch = api.del("/v1/sessions/h?archive=true");
  ASSERT_EQ(harch.status, 200) << harch;
  auto res = api.post("/v1/sessions/back/restore", {{"archive", harch.body["archive"]}});
  EXPECT_EQ(res.status, 501) << res;
  EXPECT_EQ(res.code(), "ENOTSUP") << res;
  EXPECT_NE(res.message().find("restore of a remote session (backend remote)"), std::string::npos)
      << res;
  EXPECT_EQ(api.get("/v1/sessions/back").status, 404);
  // An id in use is still 409 first (API.md).
  EXPECT_EQ(api.post("/v1/sessions/ar/restore", {{"archive", "any.tar.zst"}}).status, 409);
}

TEST(RunnerApiFaults, DropMidRequestFailsWith503WithinASecond) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "x"}, {"runner", "alice"}}).status, 201);
  std::atomic<bool> got{false};
  r.on("exec", [&](const json&) {
    got = true;
    return FakeRunner::Outcome{FakeRunner::Action::kSilent, {}};
  });
  std::chrono::steady_clock::time_point dropped;
  std::thread dropper([&] {
    eventually([&] { return got.load(); }, 10);
    std::this_thread::sleep_for(200ms);
    dropped = std::chrono::steady_clock::now();
    r.stop();  // the runner goes away with the exec in flight
  });
  auto e = api.exec("x", {{"command", "sleep 100"}});
  auto answered = std::chrono::steady_clock::now();
  dropper.join();
  EXPECT_EQ(e.status, 503) << e;
  EXPECT_EQ(e.code(), "EUNAVAILABLE") << e;
  EXPECT_LT(answered - dropped, 1s);
  // And the session answers 503 while the runner is away, then works again once it is back.
  auto away = api.exec("x", {{"command", "true"}});
  EXPECT_EQ(away.status, 503) << away;
  FakeRunner again(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(again.start()["type"], "register_ok");
  auto back = api.exec("x", {{"command", "echo back"}});
  EXPECT_EQ(back.status, 200) << back;
  EXPECT_EQ(back.body["stdout"], "back\n");
}

TEST(RunnerApiFaults, GarbageReplyFailsThatRequestAndClosesOnlyThatConnection) {
  Daemon d(runner_args());
  Api api(d);
  Workspace wa, wb;
  FakeRunner alice(d, "alice", "alice-secret", wa.path());
  FakeRunner bob(d, "bob", "bob-secret", wb.path());
  ASSERT_EQ(alice.start()["type"], "register_ok");
  ASSERT_EQ(bob.start()["type"], "register_ok");
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "a"}, {"runner", "alice"}}).status, 201);
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "b"}, {"runner", "bob"}}).status, 201);
  alice.on("exec", [](const json&) {
    return FakeRunner::Outcome{FakeRunner::Action::kGarbage, {}};
  });
  auto e = api.exec("a", {{"command", "true"}});
  EXPECT_EQ(e.status, 503) << e;
  EXPECT_TRUE(eventually([&] { return alice.ended(); }, 5));
  auto fine = api.exec("b", {{"command", "echo ok"}});
  EXPECT_EQ(fine.status, 200) << fine;
  EXPECT_EQ(fine.body["stdout"], "ok\n");
}

// SECURITY.md T8: a frame over the runner frame cap (64 MiB) closes that connection only; the
// request on it fails, the daemon stays small, another runner keeps working.
TEST(RunnerApiFaults, OversizedFrameClosesOnlyThatConnection) {
  Daemon d(runner_args());
  Api api(d);
  Workspace wa, wb;
  FakeRunner alice(d, "alice", "alice-secret", wa.path());
  FakeRunner bob(d, "bob", "bob-secret", wb.path());
  ASSERT_EQ(alice.start()["type"], "register_ok");
  ASSERT_EQ(bob.start()["type"], "register_ok");
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "a"}, {"runner", "alice"}}).status, 201);
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "b"}, {"runner", "bob"}}).status, 201);
  alice.on("exec", [](const json&) {
    json body = {{"stdout", std::string(70u << 20, 'x')}, {"stderr", ""}, {"exit_code", 0},
                 {"timed_out", false}};
    return FakeRunner::Outcome{FakeRunner::Action::kReply,
                               {{"type", "exec_result"}, {"body", std::move(body)}}};
  });
  auto e = api.exec("a", {{"command", "true"}});
  EXPECT_EQ(e.status, 503) << e;
  EXPECT_TRUE(eventually([&] { return alice.ended(); }, 10));
  auto fine = api.exec("b", {{"command", "echo ok"}});
  EXPECT_EQ(fine.status, 200) << fine;
  EXPECT_TRUE(d.running());
}

// SECURITY.md T8: many refused registrations leave the daemon up and its memory flat.
TEST(RunnerApiFaults, ManyBadRegistrationsDoNotGrowTheDaemon) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  auto rss = [&] {
    std::ifstream f("/proc/" + std::to_string(d.pid()) + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
    }
    return -1L;
  };
  for (int i = 0; i < 50; ++i) {
    FakeRunner r(d, "alice", "wrong", ws.path());
    (void)r.start();
  }
  long before = rss();
  for (int i = 0; i < 1000; ++i) {
    FakeRunner r(d, i % 2 ? "alice" : "nobody", "wrong", ws.path());
    json a = r.start();
    ASSERT_EQ(a["body"]["code"], "AUTH_FAILED") << i << " " << a;
  }
  long after = rss();
  EXPECT_LT(after - before, 8 * 1024) << before << " KiB -> " << after << " KiB";
  FakeRunner good(d, "alice", "alice-secret", ws.path());
  EXPECT_EQ(good.start()["type"], "register_ok");
}

TEST(RunnerApiFaults, RepliesInAnyOrderAndUnknownIdsAreDropped) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "o"}, {"runner", "alice"}}).status, 201);
  std::mutex mu;
  json held;
  r.on("exec", [&](const json& req) {
    std::lock_guard lk(mu);
    if (req["body"]["command"] == "first") {
      held = req;
      return FakeRunner::Outcome{FakeRunner::Action::kSilent, {}};
    }
    json late = {{"id", held["id"]},
                 {"type", "exec_result"},
                 {"body", {{"stdout", "1\n"}, {"stderr", ""}, {"exit_code", 0}, {"timed_out", false}}}};
    json unknown = {{"id", "req_ffffffffffffffff"}, {"type", "ok"}};
    return FakeRunner::Outcome{
        FakeRunner::Action::kReply,
        {{"type", "exec_result"},
         {"body", {{"stdout", "2\n"}, {"stderr", ""}, {"exit_code", 0}, {"timed_out", false}}}},
        {unknown, late}};
  });
  ApiReply first;
  std::thread t([&] { first = Api(d).exec("o", {{"command", "first"}}); });
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lk(mu);
    return held.is_object();
  }));
  auto second = api.exec("o", {{"command", "second"}});
  t.join();
  EXPECT_EQ(second.body["stdout"], "2\n") << second;
  EXPECT_EQ(first.body["stdout"], "1\n") << first;
  EXPECT_FALSE(r.ended());
}

// A request the runner never answers fails by itself at its deadline (an exec: its timeout plus
// 5 s, as xbot's server waits) with 504 ETIMEDOUT; the connection stays (other requests on it
// were answered meanwhile and after), and a late reply to the expired request is dropped.
TEST(RunnerApiFaults, ARequestNeverAnsweredIs504AtItsDeadlineAndTheRunnerStaysUsable) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "n"}, {"runner", "alice"}}).status, 201);
  std::mutex mu;
  json held;
  r.on("exec", [&](const json& req) {
    std::lock_guard lk(mu);
    if (req["body"]["command"] == "ignored") {
      held = req;
      return FakeRunner::Outcome{FakeRunner::Action::kSilent, {}};
    }
    std::vector<json> extra;
    if (held.is_object()) {  // the expired request's reply, late: dropped
      extra.push_back({{"id", held["id"]},
                       {"type", "exec_result"},
                       {"body",
                        {{"stdout", "late\n"}, {"stderr", ""}, {"exit_code", 0}, {"timed_out", false}}}});
    }
    return FakeRunner::Outcome{
        FakeRunner::Action::kReply,
        {{"type", "exec_result"},
         {"body", {{"stdout", "ok\n"}, {"stderr", ""}, {"exit_code", 0}, {"timed_out", false}}}},
        extra};
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto lost = api.exec("n", {{"command", "ignored"}, {"timeout_sec", 1}});
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(lost.status, 504) << lost;
  EXPECT_EQ(lost.code(), "ETIMEDOUT") << lost;
  EXPECT_GE(took, 5s);
  EXPECT_LT(took, 15s);
  for (int i = 0; i < 2; ++i) {
    auto fine = api.exec("n", {{"command", "fine"}});
    EXPECT_EQ(fine.status, 200) << fine;
    EXPECT_EQ(fine.body["stdout"], "ok\n") << fine;
  }
  EXPECT_FALSE(r.ended());
  auto l = api.get("/v1/runners");
  EXPECT_EQ(l.body["runners"][0]["connected"], true) << l;
}

TEST(RunnerApiFaults, ANewRegistrationReplacesTheOldAndTheOldClosingKeepsTheNew) {
  Daemon d(runner_args());
  Api api(d);
  Workspace ws;
  FakeRunner first(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(first.start()["type"], "register_ok");
  FakeRunner second(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(second.start()["type"], "register_ok");
  // The old connection is closed by the daemon; its end must not deregister the new one (the
  // xbot server bug of PROTOCOLS.md 1.6).
  EXPECT_TRUE(eventually([&] { return first.ended(); }, 5));
  std::this_thread::sleep_for(200ms);
  auto list = api.get("/v1/runners");
  EXPECT_EQ(list.body["runners"][0]["connected"], true) << list;
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "n"}, {"runner", "alice"}}).status, 201);
  auto e = api.exec("n", {{"command", "echo new"}});
  EXPECT_EQ(e.status, 200) << e;
}

TEST(RunnerApiSync, GlobalSkillsAndAgentsAreSyncedOnRegistration) {
  TempDir g("agentbox-runner-glob");
  std::filesystem::create_directories(g.path() + "/skills/web/scripts");
  std::filesystem::create_directories(g.path() + "/skills/noskill");
  std::filesystem::create_directories(g.path() + "/agents");
  ASSERT_TRUE(spit(g.path() + "/skills/web/SKILL.md", "# web"));
  ASSERT_TRUE(spit(g.path() + "/skills/web/scripts/run.sh", "echo hi"));
  ASSERT_TRUE(spit(g.path() + "/skills/noskill/x", "x"));
  ASSERT_TRUE(spit(g.path() + "/agents/coder.md", "# coder"));
  auto args = runner_args();
  args.insert(args.end(), {"--global-skills-dir", g.path() + "/skills", "--agents-dir",
                           g.path() + "/agents"});
  Daemon d(args);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");
  EXPECT_TRUE(eventually([&] {
    return read_host_file(ws.path() + "/.agents/coder.md") == "# coder" &&
           read_host_file(ws.path() + "/.skills/web/scripts/run.sh") == "echo hi";
  }));
  EXPECT_EQ(read_host_file(ws.path() + "/.skills/web/SKILL.md"), "# web");
  EXPECT_FALSE(std::filesystem::exists(ws.path() + "/.skills/noskill"));
}

// A daemon, the real runner of alice connected to it, and a remote session on it.
struct RealRemote {
  // `runner_args`: extra agentbox-runner flags (--protocol-version N: an older runner).
  explicit RealRemote(std::vector<std::string> runner_args = {})
      : runner{d.host_port(), "alice", "alice-secret", ws.path(), "", std::move(runner_args)} {}
  Daemon d{runner_args()};
  Api api{d};
  Workspace ws;
  RunnerProcess runner;
  ApiReply created;  // the POST /v1/sessions reply
  // Waits for the runner to register and creates session `id` on it; false if either failed.
  bool start(const std::string& id) {
    bool up = eventually([&] {
      auto l = api.get("/v1/runners");
      return l.status == 200 && l.body["runners"][0]["connected"] == true;
    });
    if (!up) return false;
    created = api.post("/v1/sessions", {{"id", id}, {"runner", "alice"}});
    return created.status == 201;
  }
};

// The real agentbox-runner (src/runner/) against the real daemon: registration, exec, files,
// its path guard, and a reconnect after the daemon dropped it.
TEST(RunnerApiReal, AgentboxRunnerServesARemoteSession) {
  RealRemote r;
  ASSERT_TRUE(r.start("real")) << r.created << r.d.log();
  Api& api = r.api;
  Workspace& ws = r.ws;
  std::string wsp = r.created.body["workspace"];
  auto e = api.exec("real", {{"command", "echo hi; pwd; exit 4"}});
  ASSERT_EQ(e.status, 200) << e;
  EXPECT_EQ(e.body["exit_code"], 4);
  EXPECT_EQ(e.body["stdout"], "hi\n" + wsp + "\n");
  auto to = api.exec("real", {{"command", "sleep 30"}, {"timeout_sec", 1}});
  ASSERT_EQ(to.status, 200) << to;
  EXPECT_EQ(to.body["timed_out"], true) << to;
  std::string big(3 << 20, 'x');
  for (std::size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>('a' + i % 26);
  auto put = api.put(files_target("real", "sub/big.bin", "&mkdirs=true"), big);
  ASSERT_TRUE(put.status == 200 || put.status == 201) << put;
  EXPECT_EQ(read_host_file(ws.path() + "/sub/big.bin"), big);
  auto get = api.get(files_target("real", "sub/big.bin"));
  ASSERT_EQ(get.status, 200) << get.status;
  EXPECT_TRUE(get.raw == big);
  auto st = api.get("/v1/sessions/real/stat?path=sub");
  EXPECT_TRUE(S_ISDIR(st.body["mode"].get<std::uint32_t>())) << st;
  auto ls = api.get("/v1/sessions/real/dir?path=sub");
  EXPECT_NE(ls.raw.find("big.bin"), std::string::npos) << ls;
  auto rm = api.del(files_target("real", "sub"));
  EXPECT_EQ(rm.status, 409) << rm;
  // A symlink out of the workspace: the runner's own guard refuses it (T8).
  std::filesystem::create_symlink("/etc", ws.path() + "/out");
  auto esc = api.get(files_target("real", "out/passwd"));
  EXPECT_EQ(esc.status, 403) << esc;
}

// The peak resident memory (VmHWM) of process `pid`, in bytes.
std::uint64_t peak_rss(pid_t pid) {
  std::string status = read_host_file("/proc/" + std::to_string(pid) + "/status");
  auto at = status.find("VmHWM:");
  if (at == std::string::npos) return 0;
  return std::stoull(status.substr(at + 6)) << 10;  // kB
}

// 100 MiB of bytes that are not all alike (a shifted chunk would show).
std::string big_payload(std::size_t n) {
  std::string big(n, '\0');
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  for (std::size_t i = 0; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(big.data() + i, &x, std::min<std::size_t>(8, n - i));
  }
  return big;
}

// docs/runner-protocol.md version 1 with the real runner: a 100 MiB file goes up through /v1
// and comes back byte for byte, in chunks, and neither the daemon nor the runner holds it in
// memory (the plain form would be 133 MiB of base64 in one frame, over the 64 MiB frame cap).
TEST(RunnerApiBigFiles, HundredMiBUpAndDownInChunksWithBoundedMemory) {
  RealRemote r;
  ASSERT_TRUE(r.start("big")) << r.created << r.d.log();
  Daemon& d = r.d;
  Api& api = r.api;
  Workspace& ws = r.ws;
  RunnerProcess& runner = r.runner;
  auto l = api.get("/v1/runners");
  EXPECT_EQ(l.body["runners"][0]["version"], 3) << l;  // binary chunks
  // Warm both up with a small file first, then measure the growth of their peaks.
  ASSERT_EQ(api.put(files_target("big", "small.txt"), "x").status, 200);
  const std::uint64_t daemon0 = peak_rss(d.pid()), runner0 = peak_rss(runner.pid());
  ASSERT_GT(daemon0, 0u);
  ASSERT_GT(runner0, 0u);

  const std::string big = big_payload(100u << 20);
  auto put = api.put(files_target("big", "dir/big.bin", "&mkdirs=true"), big);
  ASSERT_EQ(put.status, 200) << put << d.log();
  EXPECT_EQ(put.body["size"], big.size());
  EXPECT_TRUE(read_host_file(ws.path() + "/dir/big.bin") == big);
  std::printf("[ info ] after upload: daemon peak RSS +%llu MiB, runner +%llu MiB\n",
              static_cast<unsigned long long>((peak_rss(d.pid()) - daemon0) >> 20),
              static_cast<unsigned long long>((peak_rss(runner.pid()) - runner0) >> 20));
  auto get = api.get(files_target("big", "dir/big.bin"));
  ASSERT_EQ(get.status, 200) << get.status;
  EXPECT_EQ(get.raw.size(), big.size());
  EXPECT_TRUE(std::hash<std::string>{}(get.raw) == std::hash<std::string>{}(big) &&
              get.raw == big);
  // A file just over the 4 MiB threshold and one just under take the two forms; both arrive.
  for (std::size_t n : {std::size_t{4u << 20}, std::size_t{(4u << 20) + 1}}) {
    std::string f = big.substr(0, n);
    ASSERT_EQ(api.put(files_target("big", "edge.bin"), f).status, 200);
    auto back = api.get(files_target("big", "edge.bin"));
    EXPECT_TRUE(back.raw == f) << n;
  }
  const std::uint64_t daemon_growth = peak_rss(d.pid()) - daemon0;
  const std::uint64_t runner_growth = peak_rss(runner.pid()) - runner0;
  EXPECT_LT(daemon_growth, 64u << 20) << "daemon peak RSS grew by " << (daemon_growth >> 20)
                                      << " MiB";
  EXPECT_LT(runner_growth, 64u << 20) << "runner peak RSS grew by " << (runner_growth >> 20)
                                      << " MiB";
  std::printf("[ info ] 100 MiB up+down: daemon peak RSS +%llu MiB, runner +%llu MiB\n",
              static_cast<unsigned long long>(daemon_growth >> 20),
              static_cast<unsigned long long>(runner_growth >> 20));
}

// Interop: a runner of an older version against today's daemon (which speaks 3). Versions 1 and 2
// (agentbox-runners before binary chunks): big files still go both ways in base64 text chunks.
// Version 0 (xbot's plain form): files in one frame. Either way a directory read as a file and a
// file listed as a directory are 409 EISDIR/ENOTDIR as on the host backend, told apart by the Go
// text of the EIO those runners send.
TEST(RunnerApiBigFiles, OlderRunnersStillWork) {
  for (const std::string v : {"2", "1", "0"}) {
    SCOPED_TRACE("runner version " + v);
    RealRemote r({"--protocol-version", v});
    ASSERT_TRUE(r.start("old")) << r.created << r.d.log();
    Api& api = r.api;
    auto l = api.get("/v1/runners");
    if (v == "0") {
      EXPECT_TRUE(l.body["runners"][0]["version"].is_null()) << l;
    } else {
      EXPECT_EQ(l.body["runners"][0]["version"], std::stoi(v)) << l;
    }
    const std::string big = big_payload(v != "0" ? (20u << 20) + 3 : (5u << 20) + 1);
    auto put = api.put(files_target("old", "d/big.bin", "&mkdirs=true"), big);
    ASSERT_EQ(put.status, 200) << put << r.d.log();
    EXPECT_EQ(put.body["size"], big.size());
    EXPECT_TRUE(read_host_file(r.ws.path() + "/d/big.bin") == big);
    auto get = api.get(files_target("old", "d/big.bin"));
    ASSERT_EQ(get.status, 200) << get.status;
    EXPECT_TRUE(get.raw == big);
    auto notdir = api.get("/v1/sessions/old/dir?path=d/big.bin");
    EXPECT_EQ(notdir.status, 409) << notdir;
    EXPECT_EQ(notdir.code(), "ENOTDIR") << notdir;
    auto isdir = api.get(files_target("old", "d"));
    EXPECT_EQ(isdir.status, 409) << isdir;
    EXPECT_EQ(isdir.code(), "EISDIR") << isdir;
    auto notempty = api.del(files_target("old", "d"));
    EXPECT_EQ(notempty.status, 409) << notempty;
    EXPECT_EQ(notempty.code(), "ENOTEMPTY") << notempty;
  }
}

// The daemon stopped (SIGTERM) while a big download streams to a client that reads slowly: it
// exits 0 and at once (the transfer in flight fails; nothing outlives the daemon's hub).
TEST(RunnerApiBigFiles, ADaemonStoppedMidDownloadExitsCleanly) {
  RealRemote r;
  ASSERT_TRUE(r.start("dl")) << r.created << r.d.log();
  {
    std::ofstream f(r.ws.path() + "/big.bin", std::ios::binary);
    f << big_payload(96u << 20);
  }
  RawConnection raw(r.d.host_port());
  ASSERT_TRUE(raw.send("GET /v1/sessions/dl/files?path=big.bin HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string head = raw.read_until_close(500ms);  // a little, then no more reading
  ASSERT_EQ(http_status_of(head), 200) << head.substr(0, 200);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(r.d.stop(SIGTERM), 0) << r.d.log();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 12s);
  EXPECT_EQ(r.d.log().find("still running at exit"), std::string::npos) << r.d.log();
}

// A runner that dies in the middle of an upload: the request fails with 503 and the target is
// not there (the runner writes a temp file and renames only on file_end).
TEST(RunnerApiBigFiles, RunnerKilledMidUploadIs503AndNoFileAtTheTarget) {
  RealRemote r;
  ASSERT_TRUE(r.start("k")) << r.created << r.d.log();
  Daemon& d = r.d;
  Workspace& ws = r.ws;
  RunnerProcess& runner = r.runner;
  const std::string big = big_payload(200u << 20);
  ApiReply put;
  std::thread uploader([&] {
    Api api2(d);
    put = api2.put(files_target("k", "big.bin"), big);
  });
  // The runner's temp file beside the target shows the transfer is under way.
  bool started = false;
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!started && std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(ws.path(), ec)) {
      if (e.path().filename().string().starts_with(".big.bin.")) started = true;
    }
    if (!started) std::this_thread::sleep_for(1ms);
  }
  runner.stop(SIGKILL);
  uploader.join();
  ASSERT_TRUE(started) << put;
  EXPECT_EQ(put.status, 503) << put;
  EXPECT_EQ(put.code(), "EUNAVAILABLE") << put;
  EXPECT_FALSE(std::filesystem::exists(ws.path() + "/big.bin"));
}

// Processes on a remote session (remote_processes.h, runner protocol version 2) when the runner
// dies mid-pty: the attached client gets a clean close naming the end, the process reads as
// killed, the daemon's other sessions do not notice, and a runner that registers again serves
// the session's processes and execs again.
TEST(RunnerApiProcesses, RunnerKilledMidPtyClosesTheAttachAndAReconnectedRunnerServesAgain) {
  RealRemote r;
  ASSERT_TRUE(r.start("pk")) << r.created << r.d.log();
  Daemon& d = r.d;
  Api& api = r.api;
  const std::string procs = "/v1/sessions/pk/processes";
  // Another session of the daemon (its default backend), with a process of its own.
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "other"}}).status, 201);
  auto other = api.post("/v1/sessions/other/processes", {{"command", "sleep 600"}, {"tag", "s"}});
  ASSERT_EQ(other.status, 201) << other;

  // A managed process (cat ends with its stdin, which the runner's death closes).
  auto managed = api.post(procs, {{"command", "cat"}, {"tag", "m"}, {"stdin", true},
                                  {"restart", "always"}});
  ASSERT_EQ(managed.status, 201) << managed;
  const json shell_pty = {{"command", "sh"}, {"tag", "term"}, {"pty", {{"cols", 80}, {"rows", 24}}}};
  auto term = api.post(procs, shell_pty);
  ASSERT_EQ(term.status, 201) << term;
  const pid_t shell = term.body["pid"].get<int>();
  ASSERT_GT(shell, 0) << term;  // the runner's pid of the command (the runner is on this host)
  Ws ws;
  ASSERT_FALSE(ws.open(d.host_port(), procs + "/term/attach"));
  ws.write("echo hi-$((6*7))\n", true);
  std::string seen = ws.read_until("hi-42");
  ASSERT_NE(seen.find("hi-42"), std::string::npos) << seen;

  r.runner.stop(SIGKILL);
  // The attacher sees the end within seconds, as a normal close naming it.
  auto t0 = std::chrono::steady_clock::now();
  while (ws.read(10s)) {
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(ws.reason().code, boost::beast::websocket::close_code::normal);
  EXPECT_EQ(reason_of(ws), "signal 9");
  auto g = api.get(procs + "/term");
  EXPECT_EQ(g.body["state"], "killed") << g;
  // The runner's pty went with it: the shell is not left behind.
  EXPECT_TRUE(eventually([&] { return !process_alive(shell); }));
  // Starting a process while no runner is connected is 503, naming the runner.
  auto away = api.post(procs, {{"command", "true"}});
  EXPECT_EQ(away.status, 503) << away;
  // Nothing else noticed.
  EXPECT_EQ(api.get("/v1/sessions/other/processes/s").body["state"], "running");
  EXPECT_EQ(api.get("/healthz").status, 200);

  // The runner comes back (same user and workspace): the session is served again.
  RunnerProcess again(d.host_port(), "alice", "alice-secret", r.ws.path());
  ASSERT_TRUE(eventually([&] {
    auto l = api.get("/v1/runners");
    return l.status == 200 && l.body["runners"][0]["connected"] == true;
  }));
  auto term2 = api.post(procs, shell_pty);
  ASSERT_EQ(term2.status, 201) << term2;
  Ws ws2;
  ASSERT_FALSE(ws2.open(d.host_port(), procs + "/term/attach"));
  ws2.write("echo back-$((6*7)); exit 3\n", true);
  seen = ws2.read_until("\x01never");
  EXPECT_NE(seen.find("back-42"), std::string::npos) << seen;
  EXPECT_EQ(reason_of(ws2), "exit 3");
  auto e = api.post("/v1/sessions/pk/exec", {{"command", "echo served"}});
  EXPECT_EQ(e.body["stdout"], "served\n") << e;
  // The managed process was restarted by its supervision once the runner was back.
  EXPECT_TRUE(eventually(
      [&] {
        auto m = api.get(procs + "/m");
        return m.body.value("state", "") == "running" && m.body.value("restarts", 0) >= 1;
      },
      20))
      << api.get(procs + "/m");
  EXPECT_EQ(api.del(procs + "/m").status, 200);
  EXPECT_EQ(api.del("/v1/sessions/other/processes/s").status, 200);
}

// A streaming exec whose runner dies: the stream ends within seconds with an error event (the
// command is gone with the runner), and a one-shot exec meanwhile is a 503.
TEST(RunnerApiProcesses, RunnerKilledMidStreamingExecEndsTheStreamWithAnError) {
  RealRemote r;
  ASSERT_TRUE(r.start("sx")) << r.created << r.d.log();
  RawConnection raw(r.d.host_port());
  std::string b =
      json{{"command", "echo $$ > sx.pid; echo start; exec sleep 600"}, {"timeout_sec", 900}}
          .dump();
  ASSERT_TRUE(raw.send("POST /v1/sessions/sx/exec/stream HTTP/1.1\r\nHost: x\r\n"
                       "Content-Type: application/json\r\nContent-Length: " +
                       std::to_string(b.size()) + "\r\n\r\n" + b));
  std::string got;
  auto start = std::chrono::steady_clock::now();
  while (got.find("start") == std::string::npos &&
         std::chrono::steady_clock::now() - start < 10s) {
    got += raw.read_until_close(200ms);
  }
  ASSERT_NE(got.find("start"), std::string::npos) << got;
  r.runner.stop(SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  while (got.find("EUNAVAILABLE") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < 10s) {
    got += raw.read_until_close(200ms);
  }
  EXPECT_NE(got.find(R"("type":"error")"), std::string::npos) << got;
  EXPECT_NE(got.find("EUNAVAILABLE"), std::string::npos) << got;
  EXPECT_EQ(got.find(R"("type":"exit")"), std::string::npos) << got;
  auto e = r.api.post("/v1/sessions/sx/exec", {{"command", "echo x"}});
  EXPECT_EQ(e.status, 503) << e;
  // A runner killed by SIGKILL cannot end its children: this one is the test's to end.
  const std::string pid = read_host_file(r.ws.path() + "/sx.pid");
  ASSERT_FALSE(pid.empty());
  ::kill(std::stoi(pid), SIGKILL);
}

// A streaming exec whose client does not read: the daemon holds the command (SIGSTOP, as a
// local one blocks in write) instead of buffering its output, so its memory stays bounded; read
// later, every byte arrives in order and the exit comes last.
TEST(RunnerApiProcesses, AStreamingExecToAClientThatDoesNotReadIsHeldNotBuffered) {
  RealRemote r;
  ASSERT_TRUE(r.start("slow")) << r.created << r.d.log();
  constexpr std::size_t kBytes = 60u << 20;  // under the 64 MiB max_output_bytes
  RawConnection raw(r.d.host_port());
  std::string b = json{{"command", "head -c " + std::to_string(kBytes) +
                                       " /dev/zero | tr '\\0' a; echo end"},
                       {"timeout_sec", 300},
                       {"max_output_bytes", 64u << 20}}
                      .dump();
  // HTTP/1.0: the stream is the body until the close (no chunked framing to undo here).
  ASSERT_TRUE(raw.send("POST /v1/sessions/slow/exec/stream HTTP/1.0\r\nHost: x\r\n"
                       "Content-Type: application/json\r\nContent-Length: " +
                       std::to_string(b.size()) + "\r\n\r\n" + b));
  std::this_thread::sleep_for(4s);  // not reading: the command must be held meanwhile
  const std::uint64_t held_peak = peak_rss(r.d.pid());
  std::string got = raw.read_until_close(120s);
  const std::uint64_t peak = peak_rss(r.d.pid());
  std::size_t bytes = 0;
  std::string tail;
  json last;
  std::size_t body = got.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos) << got.substr(0, 300);
  std::istringstream lines(got.substr(body + 4));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    json ev = json::parse(line, nullptr, false);
    ASSERT_FALSE(ev.is_discarded()) << line.substr(0, 200);
    if (ev.value("type", "") == "stdout") {
      const std::string d = ev.value("data", "");
      bytes += d.size();
      tail = (tail + d).substr(tail.size() + d.size() > 16 ? tail.size() + d.size() - 16 : 0);
    }
    last = ev;
  }
  EXPECT_EQ(bytes, kBytes + 4) << "every byte, once";
  EXPECT_TRUE(tail.ends_with("aaaaend\n")) << tail;
  EXPECT_EQ(last.value("type", ""), "exit") << last;
  EXPECT_EQ(last.value("stdout_truncated", true), false) << last;
  EXPECT_EQ(last.value("exit_code", -1), 0) << last;
  // Bounded: not the 60 MiB the command printed (the daemon idles at about 20 MiB).
  std::printf("daemon peak RSS: %.1f MiB while held, %.1f MiB after\n",
              static_cast<double>(held_peak) / (1 << 20), static_cast<double>(peak) / (1 << 20));
  EXPECT_LT(held_peak, 48u << 20) << "while the client did not read";
  EXPECT_LT(peak, 48u << 20);
}

// Over the 500 MB cap of a chunked file: refused cleanly with 413, naming the limit (a sparse
// file, so nothing of that size is written).
TEST(RunnerApiBigFiles, FilesOver500MBAreRefused) {
  RealRemote r;
  ASSERT_TRUE(r.start("cap")) << r.created << r.d.log();
  Api& api = r.api;
  Workspace& ws = r.ws;
  {
    std::ofstream f(ws.path() + "/huge.bin");
  }
  std::filesystem::resize_file(ws.path() + "/huge.bin", 500'000'001);
  auto get = api.get(files_target("cap", "huge.bin"));
  EXPECT_EQ(get.status, 413) << get;
  EXPECT_EQ(get.code(), "ETOOBIG") << get;
  EXPECT_NE(get.message().find("500000000"), std::string::npos) << get;
  // The connection is still good for the next request.
  auto e = api.exec("cap", {{"command", "echo ok"}});
  EXPECT_EQ(e.body["stdout"], "ok\n") << e;
}

// --default-runner: a session created without a backend is a remote session of that runner; one
// that names a backend gets it; mounts on such a session are 501, not silently dropped.
// The daemon killed (-9) and started again on the same address and data dir while a runner is
// connected: the runner dials again by itself and the session bound to it works as before, with
// the files it had.
TEST(RunnerApiRestart, ARunnerReconnectsToARestartedDaemonAndItsSessionWorksAgain) {
  TempDir dir("agentbox-runner-restart");
  const std::string data = dir.path() + "/data";
  Workspace ws;
  auto args = [&](const std::string& listen) {
    std::vector<std::string> a = runner_args();
    for (const std::string& x : {std::string("--data-dir"), data, std::string("--listen"), listen}) {
      a.push_back(x);
    }
    return a;
  };
  auto connected = [](Api& api) {
    return eventually([&] {
      auto l = api.get("/v1/runners");
      return l.status == 200 && !l.body["runners"].empty() &&
             l.body["runners"][0]["connected"] == true;
    });
  };
  std::optional<Daemon> d(std::in_place, args("127.0.0.1:0"));
  const std::string addr = d->host_port();
  RunnerProcess runner(addr, "alice", "alice-secret", ws.path());
  {
    Api api(*d);
    ASSERT_TRUE(connected(api)) << d->log();
    ASSERT_EQ(api.post("/v1/sessions", {{"id", "kept"}, {"runner", "alice"}}).status, 201);
    ASSERT_EQ(api.put(files_target("kept", "note.txt"), "before\n").status, 200);
    EXPECT_EQ(d->stop(SIGKILL), 128 + SIGKILL);
  }
  d.reset();
  d.emplace(args(addr));
  Api api(*d);
  ASSERT_TRUE(connected(api)) << "the runner did not come back: " << d->log();
  auto e = api.exec("kept", {{"command", "cat note.txt; echo after >> note.txt"}});
  ASSERT_EQ(e.status, 200) << e;
  EXPECT_EQ(e.body["stdout"], "before\n");
  EXPECT_EQ(read_host_file(ws.path() + "/note.txt"), "before\nafter\n");
  EXPECT_EQ(api.get("/v1/sessions/kept").body["backend"], "remote");
}

// A runner that stops answering without closing its connection (stopped: the kernel still
// acknowledges, nothing answers the daemon's pings) is dropped after 2 x --ws-ping-sec: its
// in-flight exec fails with 503, it is listed as disconnected, and once it runs again it dials
// back and serves its session.
TEST(RunnerApiFaults, ARunnerThatStopsAnsweringIsDroppedByPingsAndComesBack) {
  std::vector<std::string> a = runner_args();
  a.insert(a.end(), {"--ws-ping-sec", "1"});
  Daemon d(a);
  Api api(d);
  Workspace ws;
  RunnerProcess runner(d.host_port(), "alice", "alice-secret", ws.path());
  auto state = [&] {
    auto l = api.get("/v1/runners");
    return l.status == 200 && !l.body["runners"].empty() ? l.body["runners"][0] : json();
  };
  ASSERT_TRUE(eventually([&] { return state().value("connected", false); })) << d.log();
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "h"}, {"runner", "alice"}}).status, 201);
  ASSERT_EQ(::kill(runner.pid(), SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto e = api.exec("h", {{"command", "echo never"}});
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(e.status, 503) << e;
  EXPECT_LT(took, 10s) << "the silent runner was not dropped by the pings";
  EXPECT_EQ(state().value("connected", true), false) << state();
  ASSERT_EQ(::kill(runner.pid(), SIGCONT), 0);
  ASSERT_TRUE(eventually([&] { return state().value("connected", false); }, 20)) << d.log();
  auto again = api.exec("h", {{"command", "echo back"}});
  ASSERT_EQ(again.status, 200) << again;
  EXPECT_EQ(again.body["stdout"], "back\n");
}

TEST(RunnerApiDefault, SessionsWithoutABackendGoToTheDefaultRunner) {
  TempDir roots("agentbox-runner-roots");
  std::filesystem::create_directories(roots.path() + "/data");
  auto args = runner_args();
  args.insert(args.end(), {"--default-runner", "alice", "--allow-backend", "host",
                           "--allow-mount-root", roots.path()});
  Daemon d(args);
  Api api(d);
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");
  auto c = api.post("/v1/sessions", {{"id", "dflt"}});
  ASSERT_EQ(c.status, 201) << c;
  EXPECT_EQ(c.body["backend"], "remote") << c;
  EXPECT_EQ(c.body["runner"], "alice") << c;
  EXPECT_EQ(c.body["workspace"], ws.path()) << c;
  auto e = api.exec("dflt", {{"command", "echo hi > f.txt"}});
  ASSERT_EQ(e.status, 200) << e;
  EXPECT_EQ(read_host_file(ws.path() + "/f.txt"), "hi\n");
  auto h = api.post("/v1/sessions", {{"id", "onhost"}, {"backend", "host"}});
  ASSERT_EQ(h.status, 201) << h;
  EXPECT_EQ(h.body["backend"], "host") << h;
  auto m = api.post("/v1/sessions",
                    {{"id", "mnt"},
                     {"mounts", {{{"host_path", roots.path() + "/data"}, {"mount_path", "/data"}}}}});
  EXPECT_EQ(m.status, 501) << m;
  EXPECT_NE(m.message().find("mounts"), std::string::npos) << m;
  EXPECT_EQ(api.get("/v1/sessions/mnt").status, 404);
  // A default runner that is not a runner user: the daemon does not start.
  std::string out;
  EXPECT_EQ(Daemon::run_to_exit({"--listen", "127.0.0.1:0", "--data-dir", d.temp_dir() + "/x",
                                 "--backend", "host", "--default-runner", "carol"},
                                &out),
            2)
      << out;
  EXPECT_NE(out.find("default_runner 'carol' is not a runner user"), std::string::npos) << out;
}

// The CLI: `agentbox runners` and `agentbox session create --runner`.
TEST(RunnerApiCli, RunnersTableAndSessionCreateWithRunner) {
  Daemon d(runner_args());
  Workspace ws;
  FakeRunner r(d, "alice", "alice-secret", ws.path());
  ASSERT_EQ(r.start()["type"], "register_ok");
  std::string cli = std::filesystem::path(Daemon::binary()).parent_path() / "agentbox";
  auto run = [&](const std::string& args) {
    std::string out;
    FILE* p = ::popen((cli + " --server " + d.url() + " " + args + " 2>&1").c_str(), "r");
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    int rc = ::pclose(p);
    return std::make_pair(WEXITSTATUS(rc), out);
  };
  auto [rc, out] = run("runners");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("USER"), std::string::npos) << out;
  EXPECT_NE(out.find("alice"), std::string::npos) << out;
  EXPECT_NE(out.find(ws.path()), std::string::npos) << out;
  EXPECT_NE(out.find("bob"), std::string::npos) << out;
  auto [rc2, out2] = run("session create rc --runner alice");
  EXPECT_EQ(rc2, 0) << out2;
  json s = json::parse(out2, nullptr, false);
  EXPECT_EQ(s["backend"], "remote") << out2;
  EXPECT_EQ(s["workspace"], ws.path()) << out2;
  auto [rc3, out3] = run("exec rc -- sh -c 'echo via-cli > f.txt; cat f.txt'");
  EXPECT_EQ(rc3, 0) << out3;
  EXPECT_NE(out3.find("via-cli"), std::string::npos) << out3;
  EXPECT_EQ(read_host_file(ws.path() + "/f.txt"), "via-cli\n");
}

}  // namespace
}  // namespace agentbox::testing
