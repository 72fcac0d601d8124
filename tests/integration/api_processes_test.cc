// Processes and terminals (API.md) against the real daemon over loopback: start (argv, command,
// tag, stdin, pty), list, get by tag and pid, output as NDJSON with offsets (resume with since,
// follow to the exit record), stdin in and out, signals, resize, kill of the whole tree, and the
// errors: unknown ref 404, a taken tag 409, resize on a non-pty 400, stdin to an ended process
// 409, an unknown signal 400. Managed processes (restart on-failure|always): the policies, the
// backoff and a crash loop that leaves the daemon idle, kill ending the supervision, the idle
// reaper leaving their session alone, and an echo JSON-RPC server answering through the attach
// socket across a suspend/resume and a kill -9 of the daemon.

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

#include "integration/api_test_util.h"
#include "integration/ws_test_util.h"

namespace agentbox::testing {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

class ProcessesApi : public ::testing::Test {
 protected:
  ProcessesApi() : daemon_(backend_args()), api_(daemon_) {}

  static std::vector<std::string> backend_args() {
    if (test_backend() == "ns") return {"--backend", "ns"};
    return {};
  }

  std::string base(const std::string& id) { return "/v1/sessions/" + id + "/processes"; }

  ApiReply start(const std::string& id, const json& body) { return api_.post(base(id), body); }

  // The NDJSON lines of an output reply.
  static std::vector<json> lines(const std::string& raw) {
    std::vector<json> out;
    std::size_t pos = 0;
    while (pos < raw.size()) {
      auto nl = raw.find('\n', pos);
      if (nl == std::string::npos) nl = raw.size();
      if (nl > pos) out.push_back(json::parse(raw.substr(pos, nl - pos), nullptr, false));
      pos = nl + 1;
    }
    return out;
  }

  // All stdout data of an output reply, concatenated.
  static std::string stdout_of(const std::vector<json>& recs, const char* type = "stdout") {
    std::string s;
    for (const auto& r : recs) {
      if (r.value("type", "") == type) s += r.value("data", "");
    }
    return s;
  }

  bool ended(const std::string& id, const std::string& ref) {
    auto r = api_.get(base(id) + "/" + ref);
    return r.status == 200 && r.body.value("state", "") != "running";
  }

  Daemon daemon_;
  Api api_;
};

TEST_F(ProcessesApi, StartListGetAndFollowToTheExitCode) {
  auto r = start("p1", {{"command", "echo hello; echo oops >&2; exit 3"}, {"tag", "job"}});
  ASSERT_EQ(r.status, 201) << r;  // the session was created for it
  EXPECT_EQ(r.body["tag"], "job");
  EXPECT_EQ(r.body["command"], "echo hello; echo oops >&2; exit 3");
  EXPECT_GT(r.body["pid"].get<int>(), 0);
  EXPECT_TRUE(is_rfc3339_utc(r.body["started_at"].get<std::string>())) << r;
  EXPECT_EQ(r.body["managed"], false);
  const std::string pid = std::to_string(r.body["pid"].get<int>());

  // follow=true ends at the exit record.
  auto out = api_.get(base("p1") + "/job/output?follow=true");
  ASSERT_EQ(out.status, 200) << out;
  EXPECT_EQ(out.headers["content-type"], "application/x-ndjson");
  auto recs = lines(out.raw);
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(stdout_of(recs), "hello\n");
  EXPECT_EQ(stdout_of(recs, "stderr"), "oops\n");
  EXPECT_EQ(recs.back()["type"], "exit") << out.raw;
  EXPECT_EQ(recs.back()["exit_code"], 3);
  EXPECT_TRUE(recs.back()["signal"].is_null());

  // The ended process stays listed with its exit code, by tag and by pid.
  auto g = api_.get(base("p1") + "/job");
  ASSERT_EQ(g.status, 200) << g;
  EXPECT_EQ(g.body["state"], "exited");
  EXPECT_EQ(g.body["exit_code"], 3);
  EXPECT_TRUE(is_rfc3339_utc(g.body["ended_at"].get<std::string>())) << g;
  EXPECT_EQ(api_.get(base("p1") + "/" + pid).body["tag"], "job");
  auto l = api_.get(base("p1"));
  ASSERT_EQ(l.status, 200) << l;
  ASSERT_EQ(l.body["processes"].size(), 1u) << l;
  EXPECT_EQ(l.body["processes"][0]["exit_code"], 3);
}

TEST_F(ProcessesApi, OutputOffsetsResumeWithoutLossOrRepeat) {
  auto r = start("p2", {{"argv", {"sh", "-c", "printf abc; printf def; exec sleep 30"}},
                        {"tag", "w"}});
  ASSERT_EQ(r.status, 201) << r;
  EXPECT_EQ(r.body["argv"][0], "sh");
  std::string all;
  ASSERT_TRUE(eventually([&] {
    all = stdout_of(lines(api_.get(base("p2") + "/w/output").raw));
    return all == "abcdef";
  })) << all;
  // Without follow the reply ends after what is kept; since=N starts at byte N.
  auto part = lines(api_.get(base("p2") + "/w/output?since=2").raw);
  ASSERT_FALSE(part.empty());
  EXPECT_EQ(part.front()["offset"], 2);
  EXPECT_EQ(stdout_of(part), "cdef");
  EXPECT_TRUE(lines(api_.get(base("p2") + "/w/output?since=6").raw).empty());
  EXPECT_EQ(api_.get(base("p2") + "/w/output?since=x").status, 400);
  EXPECT_EQ(api_.get(base("p2") + "/w").body["state"], "running");
}

TEST_F(ProcessesApi, StdinLinesComeBackAndCloseEndsTheReader) {
  auto r = start("p3", {{"command", "while read l; do echo \"got $l\"; done; echo bye"},
                        {"tag", "echo"},
                        {"stdin", true}});
  ASSERT_EQ(r.status, 201) << r;
  auto w = api_.call("POST", base("p3") + "/echo/stdin", "one\ntwo\n",
                     "application/octet-stream");
  ASSERT_EQ(w.status, 200) << w;
  std::string got;
  ASSERT_TRUE(eventually([&] {
    got = stdout_of(lines(api_.get(base("p3") + "/echo/output").raw));
    return got == "got one\ngot two\n";
  })) << got;
  auto c = api_.call("POST", base("p3") + "/echo/stdin?close=true", "three\n",
                     "application/octet-stream");
  ASSERT_EQ(c.status, 200) << c;
  auto out = api_.get(base("p3") + "/echo/output?follow=true");
  EXPECT_EQ(stdout_of(lines(out.raw)), "got one\ngot two\ngot three\nbye\n");
  EXPECT_EQ(lines(out.raw).back()["exit_code"], 0);
  // Ended: stdin is 409.
  auto late = api_.call("POST", base("p3") + "/echo/stdin", "x\n", "application/octet-stream");
  EXPECT_EQ(late.status, 409) << late;
  EXPECT_EQ(late.code(), "EEXIST");
}

TEST_F(ProcessesApi, SignalsAndKillEndTheProcess) {
  ASSERT_EQ(start("p4", {{"command", "exec sleep 60"}, {"tag", "s"}}).status, 201);
  auto bad = api_.post(base("p4") + "/s/signal", {{"signal", "SIGSTOP"}});
  EXPECT_EQ(bad.status, 400) << bad;
  EXPECT_NE(bad.message().find("signal"), std::string::npos) << bad;
  auto s = api_.post(base("p4") + "/s/signal", {{"signal", "TERM"}});
  ASSERT_EQ(s.status, 200) << s;
  ASSERT_TRUE(eventually([&] { return ended("p4", "s"); }));
  auto g = api_.get(base("p4") + "/s");
  EXPECT_EQ(g.body["state"], "killed") << g;
  EXPECT_EQ(g.body["signal"], 15);
  EXPECT_EQ(g.body["exit_code"], 143);

  // DELETE kills the whole tree: a grandchild that outlives its parent goes too.
  // The duration is unique to this test process: on the host backend `ps` sees every process of
  // the machine, including those of tests running in parallel.
  const std::string nap = "sleep 6" + std::to_string(::getpid());
  ASSERT_EQ(start("p4", {{"command", nap + " & " + nap + " & wait"}, {"tag", "tree"}}).status, 201);
  auto d = api_.del(base("p4") + "/tree");
  ASSERT_EQ(d.status, 200) << d;
  EXPECT_EQ(d.body["state"], "killed") << d;
  EXPECT_EQ(d.body["signal"], 9);
  // Nothing of the tree is left in the box.
  auto ps = api_.sh("p4", "ps -eo args | grep -c '^" + nap + "$' || true");
  ASSERT_EQ(ps.status, 200) << ps;
  EXPECT_EQ(ps.body["stdout"], "0\n") << ps;
  // The tag is free again.
  EXPECT_EQ(start("p4", {{"command", "true"}, {"tag", "tree"}}).status, 201);
}

TEST_F(ProcessesApi, PtyProcessesResizeAndOthersDoNot) {
  auto r = start("p5", {{"command", "sleep 0.5; stty size; sleep 30"},
                        {"tag", "term"},
                        {"pty", {{"cols", 80}, {"rows", 24}}}});
  ASSERT_EQ(r.status, 201) << r;
  EXPECT_EQ(r.body["pty"]["cols"], 80);
  auto z = api_.post(base("p5") + "/term/resize", {{"cols", 100}, {"rows", 40}});
  ASSERT_EQ(z.status, 200) << z;
  EXPECT_EQ(z.body["pty"]["cols"], 100);
  std::string got;
  EXPECT_TRUE(eventually([&] {
    got = stdout_of(lines(api_.get(base("p5") + "/term/output").raw), "pty");
    return got.find("40 100") != std::string::npos;
  })) << got;
  ASSERT_EQ(start("p5", {{"command", "sleep 30"}, {"tag", "plain"}}).status, 201);
  auto nz = api_.post(base("p5") + "/plain/resize", {{"cols", 100}, {"rows", 40}});
  EXPECT_EQ(nz.status, 400) << nz;
  EXPECT_EQ(nz.code(), "EINVAL");
  EXPECT_EQ(api_.post(base("p5") + "/term/resize", {{"cols", 0}, {"rows", 40}}).status, 400);
}

TEST_F(ProcessesApi, BadInputIsRefusedNamingWhatWasWrong) {
  api_.create("p6");
  auto unknown = api_.get(base("p6") + "/nosuch");
  EXPECT_EQ(unknown.status, 404) << unknown;
  EXPECT_EQ(unknown.code(), "ENOENT");
  EXPECT_EQ(api_.del(base("p6") + "/nosuch").status, 404);
  EXPECT_EQ(api_.get(base("p6") + "/nosuch/output").status, 404);
  EXPECT_EQ(api_.call("POST", base("p6") + "/nosuch/stdin", "x", "application/octet-stream").status,
            404);
  EXPECT_EQ(api_.get(base("nosession")).status, 404);

  ASSERT_EQ(start("p6", {{"command", "sleep 30"}, {"tag", "web"}}).status, 201);
  auto dup = start("p6", {{"command", "sleep 30"}, {"tag", "web"}});
  EXPECT_EQ(dup.status, 409) << dup;
  EXPECT_EQ(dup.code(), "EEXIST");

  struct Case {
    json body;
    int status;
    std::string names;
  };
  for (const Case& c : std::vector<Case>{
           {json::object(), 400, "command"},
           {{{"command", "x"}, {"argv", {"x"}}}, 400, "argv"},
           {{{"command", "x"}, {"tag", "123"}}, 400, "tag"},
           {{{"command", "x"}, {"tag", "a/b"}}, 400, "tag"},
           {{{"command", "x"}, {"stdin", "yes"}}, 400, "stdin"},
           {{{"command", "x"}, {"pty", {{"cols", 80}}}}, 400, "pty.rows"},
           {{{"command", "x"}, {"pty", {{"cols", 80}, {"rows", 5000}}}}, 400, "pty.rows"},
           {{{"command", "x"}, {"restart", "sometimes"}}, 400, "restart"},
           {{{"command", "x"}, {"restart", 1}}, 400, "restart"},
       }) {
    auto r = start("p6", c.body);
    EXPECT_EQ(r.status, c.status) << c.body.dump() << ": " << r;
    EXPECT_NE(r.message().find(c.names), std::string::npos) << c.body.dump() << ": " << r;
  }
  // Nothing was started by the refused ones.
  EXPECT_EQ(api_.get(base("p6")).body["processes"].size(), 1u);
  EXPECT_EQ(start("p6", {{"command", "true"}, {"restart", "never"}}).status, 201);
}

TEST_F(ProcessesApi, AttachInLineModeSpeaksJsonRpcWithOneAttacher) {
  auto r = start("w1", {{"command", "while read l; do echo \"$l\"; done; exit 4"},
                        {"tag", "mcp"},
                        {"stdin", true}});
  ASSERT_EQ(r.status, 201) << r;
  Ws ws;
  ASSERT_FALSE(ws.open(daemon_.host_port(), base("w1") + "/mcp/attach"));
  const std::string call = R"({"jsonrpc":"2.0","id":1,"method":"ping"})";
  ws.write(call, false);
  auto reply = ws.read();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(*reply, call);  // one line, one text frame, without its newline
  EXPECT_FALSE(ws.last_binary());

  // A second attacher is refused before the upgrade.
  Ws second;
  EXPECT_EQ(second.open(daemon_.host_port(), base("w1") + "/mcp/attach"),
            websocket::error::upgrade_declined);
  EXPECT_EQ(second.status(), 409);
  Ws unknown;
  EXPECT_EQ(unknown.open(daemon_.host_port(), base("w1") + "/nosuch/attach"),
            websocket::error::upgrade_declined);
  EXPECT_EQ(unknown.status(), 404);

  // The process ends: the socket closes with 1000 "exit 4".
  ASSERT_EQ(api_.call("POST", base("w1") + "/mcp/stdin?close=true", "", "application/octet-stream")
                .status,
            200);
  EXPECT_FALSE(ws.read().has_value());
  EXPECT_EQ(ws.reason().code, websocket::close_code::normal);
  EXPECT_EQ(reason_of(ws), "exit 4");
}

TEST_F(ProcessesApi, AttachToAPtyCarriesTerminalBytesAndResizes) {
  auto r = start("w2", {{"command", "sh"}, {"tag", "term"}, {"pty", {{"cols", 80}, {"rows", 24}}}});
  ASSERT_EQ(r.status, 201) << r;
  Ws ws;
  ASSERT_FALSE(ws.open(daemon_.host_port(), base("w2") + "/term/attach"));
  ws.write(R"({"type":"resize","cols":101,"rows":41})", false);
  ws.write("stty size\n", true);
  std::string seen = ws.read_until("41 101");
  EXPECT_NE(seen.find("41 101"), std::string::npos) << seen;
  EXPECT_TRUE(ws.last_binary());
  // Detaching leaves the process running; it is killed by DELETE, which closes a new attacher.
  ws.close();
  EXPECT_EQ(api_.get(base("w2") + "/term").body["state"], "running");
  Ws again;
  ASSERT_FALSE(again.open(daemon_.host_port(), base("w2") + "/term/attach"));
  ASSERT_EQ(api_.del(base("w2") + "/term").status, 200);
  while (again.read()) {
  }
  EXPECT_EQ(again.reason().code, websocket::close_code::normal);
  EXPECT_EQ(reason_of(again), "signal 9");
}

TEST_F(ProcessesApi, PtyRouteStartsAShellThatEndsWithItsSocket) {
  Ws ws;
  ASSERT_FALSE(ws.open(daemon_.host_port(), "/v1/sessions/w3/pty?cols=90&rows=30&command=sh"));
  ws.write("stty size; exit 7\n", true);
  std::string seen = ws.read_until("\x01never");
  EXPECT_NE(seen.find("30 90"), std::string::npos) << seen;
  EXPECT_EQ(ws.reason().code, websocket::close_code::normal);
  EXPECT_EQ(reason_of(ws), "exit 7");

  // Closing the socket ends the process.
  Ws other;
  ASSERT_FALSE(other.open(daemon_.host_port(), "/v1/sessions/w3/pty?command=sleep%2060"));
  auto l = api_.get(base("w3"));
  ASSERT_EQ(l.body["processes"].size(), 2u) << l;
  EXPECT_EQ(l.body["processes"][1]["state"], "running");
  other.close();
  EXPECT_TRUE(eventually([&] {
    return api_.get(base("w3")).body["processes"][1]["state"] == "killed";
  }));
  Ws bad;
  EXPECT_EQ(bad.open(daemon_.host_port(), "/v1/sessions/w3/pty?cols=0"),
            websocket::error::upgrade_declined);
  EXPECT_EQ(bad.status(), 400);
}

// ---- Managed processes ---------------------------------------------------------------------

// Host processes whose command line contains `marker` (the box's processes are host processes
// too, in their own pid namespace).
int host_processes_with(const std::string& marker) {
  int n = 0;
  for (const auto& d : std::filesystem::directory_iterator("/proc")) {
    const std::string name = d.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(d.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (cmd.find(marker) != std::string::npos && !name.empty() &&
        std::stoi(name) != static_cast<int>(::getpid())) {
      ++n;
    }
  }
  return n;
}

// utime + stime of `pid`, in clock ticks.
long cpu_ticks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  long utime = 0, stime = 0;
  // Fields after the command: state(3) ... utime(14) stime(15).
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

TEST_F(ProcessesApi, ManagedPoliciesRestartWhatTheySayAndKillEndsSupervision) {
  auto a = start("m1", {{"command", "exit 1"}, {"tag", "fail"}, {"restart", "on-failure"}});
  ASSERT_EQ(a.status, 201) << a;
  EXPECT_EQ(a.body["managed"], true);
  EXPECT_EQ(a.body["restarts"], 0);
  ASSERT_EQ(start("m1", {{"command", "exit 0"}, {"tag", "ok"}, {"restart", "on-failure"}}).status,
            201);
  ASSERT_EQ(start("m1", {{"command", "exit 0"}, {"tag", "again"}, {"restart", "always"}}).status,
            201);
  // A supervised process keeps its tag between its runs.
  EXPECT_EQ(start("m1", {{"command", "true"}, {"tag", "fail"}}).status, 409);

  auto restarts = [&](const std::string& tag) {
    return api_.get(base("m1") + "/" + tag).body.value("restarts", -1);
  };
  EXPECT_TRUE(eventually([&] { return restarts("fail") >= 1; }, 15)) << restarts("fail");
  EXPECT_TRUE(eventually([&] { return restarts("again") >= 1; }, 15)) << restarts("again");
  // on-failure after exit 0: it ended for good.
  auto ok = api_.get(base("m1") + "/ok");
  EXPECT_EQ(ok.body["state"], "exited") << ok;
  EXPECT_EQ(ok.body["exit_code"], 0);
  EXPECT_EQ(ok.body["restarts"], 0) << ok;
  EXPECT_EQ(ok.body["managed"], true);

  // DELETE ends the supervision: no run after it, and the tag is free again.
  auto k = api_.del(base("m1") + "/fail");
  ASSERT_EQ(k.status, 200) << k;
  const int at_kill = restarts("fail");
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past the next backoff (2 s)
  auto after = api_.get(base("m1") + "/fail");
  EXPECT_NE(after.body["state"], "running") << after;
  EXPECT_EQ(after.body.value("restarts", -1), at_kill) << after;
  EXPECT_EQ(start("m1", {{"command", "true"}, {"tag", "fail"}}).status, 201);
  EXPECT_EQ(api_.del(base("m1") + "/again").status, 200);
}

TEST_F(ProcessesApi, ManagedCrashLoopBacksOffAndLeavesTheDaemonIdle) {
  auto r = start("m2", {{"argv", {"sh", "-c", "exit 1"}}, {"tag", "loop"}, {"restart", "always"}});
  ASSERT_EQ(r.status, 201) << r;
  const long ticks0 = cpu_ticks(daemon_.pid());
  const auto t0 = std::chrono::steady_clock::now();
  // When each restart was first seen (polled every 50 ms).
  std::vector<std::chrono::steady_clock::time_point> seen{t0};
  int last = 0;
  while (last < 3 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    int n = api_.get(base("m2") + "/loop").body.value("restarts", -1);
    for (; last < n; ++last) seen.push_back(std::chrono::steady_clock::now());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long ticks = cpu_ticks(daemon_.pid()) - ticks0;
  ASSERT_GE(last, 3) << "restarts seen: " << last;
  auto gap = [&](int i) { return std::chrono::duration<double>(seen[i] - seen[i - 1]).count(); };
  // 1 s, 2 s, 4 s (each plus a start; the first gap also holds the first run).
  EXPECT_GE(gap(1), 0.9);
  EXPECT_GE(gap(2), 1.8);
  EXPECT_GE(gap(3), 3.6);
  EXPECT_GT(gap(3), gap(2));
  EXPECT_GT(gap(2), gap(1));
  // A crash loop (and this polling) keeps the daemon far from busy: under a fifth of one core.
  const double cpu = static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  EXPECT_LT(cpu, 0.2 * wall) << cpu << " s of CPU in " << wall << " s";

  // Killed during a backoff: the supervision ends (the tag is free at once).
  ASSERT_EQ(api_.del(base("m2") + "/loop").status, 200);
  EXPECT_EQ(start("m2", {{"command", "true"}, {"tag", "loop"}}).status, 201);
}

TEST_F(ProcessesApi, ManagedSessionIsNeverReapedForIdleness) {
  Daemon d(test_backend() == "ns" ? std::vector<std::string>{"--backend", "ns", "--ttl-sec", "1"}
                                  : std::vector<std::string>{"--ttl-sec", "1"});
  Api api(d);
  api.create("idle");
  ASSERT_EQ(api.post("/v1/sessions/kept/processes",
                     {{"command", "exec sleep 600"}, {"tag", "srv"}, {"restart", "always"}})
                .status,
            201);
  // The reaper suspends the idle one within a few seconds, and leaves the managed one running.
  EXPECT_TRUE(eventually(
      [&] { return api.get("/v1/sessions/idle").body.value("state", "") == "suspended"; }, 15));
  EXPECT_EQ(api.get("/v1/sessions/kept").body["state"], "running");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(api.get("/v1/sessions/kept").body["state"], "running");
  auto p = api.get("/v1/sessions/kept/processes/srv");
  EXPECT_EQ(p.body["state"], "running") << p;
  EXPECT_EQ(p.body["restarts"], 0) << p;
  // Once it is killed, the session is an idle one like any other.
  ASSERT_EQ(api.del("/v1/sessions/kept/processes/srv").status, 200);
  EXPECT_TRUE(eventually(
      [&] { return api.get("/v1/sessions/kept").body.value("state", "") == "suspended"; }, 15));
}

// A line-delimited JSON-RPC echo server: answers every request with its id.
std::string echo_server(const std::string& marker) {
  return ": " + marker + "; " +
         R"SH(while read -r l; do id=$(echo "$l" | sed -n 's/.*"id":\([0-9]*\).*/\1/p'); )SH"
         R"SH(echo "{\"jsonrpc\":\"2.0\",\"id\":$id,\"result\":\"pong\"}"; done)SH";
}

// Asks the echo server once through the attach socket; returns its answer ("" if none).
std::string ask(const std::string& host_port, const std::string& target, int id) {
  Ws ws;
  if (ws.open(host_port, target)) return "";
  ws.write(R"({"jsonrpc":"2.0","id":)" + std::to_string(id) + R"(,"method":"ping"})", false);
  auto reply = ws.read();
  ws.close();
  return reply.value_or("");
}

std::string pong(int id) {
  return R"({"jsonrpc":"2.0","id":)" + std::to_string(id) + R"(,"result":"pong"})";
}

TEST_F(ProcessesApi, ManagedEchoServerSurvivesSuspendResumeAndADaemonKill) {
  const std::string marker = "agentbox-it-echo-" + std::to_string(::getpid());
  auto r = start("mcp1", {{"command", echo_server(marker)},
                          {"tag", "echo"},
                          {"stdin", true},
                          {"restart", "on-failure"}});
  ASSERT_EQ(r.status, 201) << r;
  const std::string attach = base("mcp1") + "/echo/attach";
  EXPECT_EQ(ask(daemon_.host_port(), attach, 1), pong(1));

  // Suspend and resume: the box goes down and comes back, and the server with it.
  ASSERT_EQ(api_.post("/v1/sessions/mcp1/suspend", json::object()).status, 200);
  EXPECT_EQ(api_.get("/v1/sessions/mcp1").body["state"], "suspended");
  ASSERT_EQ(api_.post("/v1/sessions/mcp1/resume", json::object()).status, 200);
  ASSERT_TRUE(eventually(
      [&] {
        auto p = api_.get(base("mcp1") + "/echo");
        return p.status == 200 && p.body.value("state", "") == "running";
      },
      15));
  EXPECT_EQ(ask(daemon_.host_port(), attach, 2), pong(2));

  if (test_backend() != "ns") {
    // The host backend's processes are plain children of the daemon: a kill -9 leaves them to
    // themselves. The ns variant of this test (ns/...) covers the daemon kill.
    std::printf("daemon kill -9 part runs on the ns backend only\n");
    return;
  }
  // kill -9 of the daemon: the box and everything in it go with it (nothing left on the host),
  // and a new daemon on the same data dir brings the session and its server back by itself.
  ASSERT_GE(host_processes_with(marker), 1);
  EXPECT_EQ(daemon_.stop(SIGKILL), 128 + SIGKILL);
  EXPECT_TRUE(eventually([&] { return host_processes_with(marker) == 0; }, 10))
      << host_processes_with(marker) << " processes of the old box are left";
  Daemon again({"--backend", "ns", "--data-dir", daemon_.data_dir()});
  Api api(again);
  // Not touched by any client (GET /v1/sessions/{id} does not resume): up again by itself.
  EXPECT_TRUE(eventually(
      [&] {
        return api.get("/v1/sessions/mcp1").body.value("state", "") == "running" &&
               host_processes_with(marker) == 1;
      },
      30))
      << api.get("/v1/sessions/mcp1");
  auto p = api.get(base("mcp1") + "/echo");
  EXPECT_EQ(p.body["state"], "running") << p;
  EXPECT_EQ(p.body["managed"], true) << p;
  EXPECT_EQ(ask(again.host_port(), attach, 3), pong(3));
  // Killed, it stays gone, across a restart too.
  ASSERT_EQ(api.del(base("mcp1") + "/echo").status, 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // its row goes on the pool
  EXPECT_EQ(again.stop(SIGTERM), 0);
  Daemon third({"--backend", "ns", "--data-dir", daemon_.data_dir()});
  Api api3(third);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(api3.get("/v1/sessions/mcp1").body["state"], "suspended");
  EXPECT_EQ(host_processes_with(marker), 0);
}

}  // namespace
}  // namespace agentbox::testing
