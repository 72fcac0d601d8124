// Exec routes of API.md against the real daemon (host backend): one-shot JSON and NDJSON
// streaming, argv/command/cwd/env/stdin/timeout/caps/non-UTF-8/127/artifacts, a client that goes
// away mid-command, and the bad-input answers.

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <thread>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

class ExecApi : public ::testing::Test {
 protected:
  void SetUp() override { api_.create("box"); }

  // Reads a pid the command wrote to a workspace file; 0 when not (yet) there.
  pid_t pid_from(const std::string& file) {
    auto r = api_.get(files_target("box", file));
    if (r.status != 200) return 0;
    try {
      return static_cast<pid_t>(std::stol(r.raw));
    } catch (...) {
      return 0;
    }
  }

  // The NDJSON lines of a streaming exec.
  std::vector<json> stream(const std::string& target, const json& body, int* status) {
    std::string all;
    auto r = api_.client().request_stream("POST", target, body.dump(), [&](std::string_view c) {
      all.append(c);
      return true;
    });
    EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
    *status = r ? r->status : 0;
    if (r && r->status != 200) all = r->body;
    std::vector<json> lines;
    std::size_t start = 0;
    for (std::size_t nl; (nl = all.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines.push_back(json::parse(all.substr(start, nl - start), nullptr, false));
      EXPECT_FALSE(lines.back().is_discarded()) << all.substr(start, nl - start);
    }
    EXPECT_EQ(start, all.size()) << "trailing bytes without newline: " << all.substr(start);
    return lines;
  }

  Daemon daemon_;
  Api api_{daemon_};
};

TEST_F(ExecApi, ArgvRunsDirectlyAndTheReplyHasEveryField) {
  auto r = api_.exec("box", {{"argv", {"echo", "hello", "$HOME"}}});
  ASSERT_EQ(r.status, 200) << r;
  const json& b = r.body;
  EXPECT_EQ(b["stdout"], "hello $HOME\n");  // no shell: no expansion
  EXPECT_EQ(b["stderr"], "");
  EXPECT_EQ(b["exit_code"], 0);
  EXPECT_TRUE(b["signal"].is_null());
  EXPECT_EQ(b["timed_out"], false);
  EXPECT_EQ(b["stdout_truncated"], false);
  EXPECT_EQ(b["stderr_truncated"], false);
  EXPECT_TRUE(b["duration_ms"].is_number_integer());
  EXPECT_TRUE(b["artifacts"].is_array());
}

TEST_F(ExecApi, CommandRunsInAShellWithExitCodeAndStderr) {
  auto r = api_.sh("box", "echo $((40+2)); echo oops >&2; exit 3");
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["stdout"], "42\n");
  EXPECT_EQ(r.body["stderr"], "oops\n");
  EXPECT_EQ(r.body["exit_code"], 3);
}

TEST_F(ExecApi, CwdDefaultsToTheWorkspaceAndCanBeSet) {
  auto ws = api_.get("/v1/sessions/box").body["workspace"].get<std::string>();
  auto r = api_.sh("box", "pwd");
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["stdout"], ws + "\n");

  ASSERT_EQ(api_.post("/v1/sessions/box/mkdir", {{"path", "sub/dir"}}).status, 200);
  auto sub = api_.exec("box", {{"command", "pwd"}, {"cwd", "/workspace/sub/dir"}});
  ASSERT_EQ(sub.status, 200) << sub;
  EXPECT_EQ(sub.body["stdout"], ws + "/sub/dir\n");

  auto rel = api_.exec("box", {{"command", "pwd"}, {"cwd", "sub"}});
  ASSERT_EQ(rel.status, 200) << rel;
  EXPECT_EQ(rel.body["stdout"], ws + "/sub\n");

  // A cwd that does not exist or leaves the workspace is an error, never a silent fallback.
  auto missing = api_.exec("box", {{"command", "pwd"}, {"cwd", "/workspace/nope"}});
  EXPECT_EQ(missing.status, 404) << missing;
  auto outside = api_.exec("box", {{"command", "pwd"}, {"cwd", "/workspace/../.."}});
  EXPECT_EQ(outside.status, 403) << outside;
  EXPECT_EQ(outside.code(), "EACCES");
}

TEST_F(ExecApi, EnvAndStdinReachTheCommand) {
  auto env = api_.exec("box", {{"command", "echo \"$FOO-$BAR\""},
                               {"env", {{"FOO", "bar"}, {"BAR", "with space"}}}});
  ASSERT_EQ(env.status, 200) << env;
  EXPECT_EQ(env.body["stdout"], "bar-with space\n");

  auto in = api_.exec("box", {{"argv", {"cat"}}, {"stdin", "line one\nline two"}});
  ASSERT_EQ(in.status, 200) << in;
  EXPECT_EQ(in.body["stdout"], "line one\nline two");

  // No stdin: the command sees EOF at once rather than hanging.
  auto none = api_.exec("box", {{"argv", {"cat"}}, {"timeout_sec", 10}});
  ASSERT_EQ(none.status, 200) << none;
  EXPECT_EQ(none.body["timed_out"], false);
}

TEST_F(ExecApi, TimeoutKillsTheWholeProcessTree) {
  auto r = api_.exec("box", {{"command", "sleep 30 & echo $! > child.pid; echo $$ > sh.pid; wait"},
                             {"timeout_sec", 1}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["timed_out"], true);
  EXPECT_EQ(r.body["exit_code"], -1);
  EXPECT_LT(r.body["duration_ms"].get<int>(), 20000);
  pid_t child = pid_from("child.pid");
  pid_t shell = pid_from("sh.pid");
  ASSERT_GT(child, 0);
  ASSERT_GT(shell, 0);
  EXPECT_TRUE(eventually([&] { return !process_alive(child) && !process_alive(shell); }))
      << "the background sleep survived the timeout";
}

TEST_F(ExecApi, OutputCapTruncatesAndSaysSo) {
  auto r = api_.exec("box", {{"command", "head -c 100000 /dev/zero | tr '\\0' a; "
                                         "head -c 10 /dev/zero | tr '\\0' b >&2"},
                             {"max_output_bytes", 1000}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["stdout"].get<std::string>(), std::string(1000, 'a'));
  EXPECT_EQ(r.body["stdout_truncated"], true);
  EXPECT_EQ(r.body["stderr"].get<std::string>(), std::string(10, 'b'));
  EXPECT_EQ(r.body["stderr_truncated"], false);
  EXPECT_EQ(r.body["exit_code"], 0);
}

TEST_F(ExecApi, NonUtf8OutputIsReplacedNotDropped) {
  auto r = api_.sh("box", "printf 'a\\377b\\303\\251c'");
  ASSERT_EQ(r.status, 200) << r;
  // The invalid byte becomes U+FFFD; the valid two-byte é survives.
  EXPECT_EQ(r.body["stdout"], "a\xEF\xBF\xBD" "b\xC3\xA9" "c");
}

TEST_F(ExecApi, MissingBinaryIsExit127) {
  auto direct = api_.exec("box", {{"argv", {"/no/such/binary"}}});
  ASSERT_EQ(direct.status, 200) << direct;
  EXPECT_EQ(direct.body["exit_code"], 127);
  auto shell = api_.sh("box", "no-such-command-agentbox");
  ASSERT_EQ(shell.status, 200) << shell;
  EXPECT_EQ(shell.body["exit_code"], 127);
}

TEST_F(ExecApi, ArtifactsListNewFilesUnderArtifactDir) {
  ASSERT_EQ(api_.post("/v1/sessions/box/mkdir", {{"path", "out"}}).status, 200);
  ASSERT_EQ(api_.put(files_target("box", "out/old.txt"), "old").status, 200);
  auto r = api_.exec("box", {{"command", "echo hello > out/new.txt; echo x > elsewhere.txt"},
                             {"artifact_dir", "/workspace/out"}});
  ASSERT_EQ(r.status, 200) << r;
  ASSERT_EQ(r.body["artifacts"].size(), 1u) << r;
  const json& a = r.body["artifacts"][0];
  EXPECT_TRUE(a["path"].get<std::string>().ends_with("/out/new.txt")) << a;
  EXPECT_EQ(a["size"], 6);
  EXPECT_EQ(a["mime_type"], "text/plain") << a;
}

TEST_F(ExecApi, ExecCreatesTheSessionWhenMissing) {
  auto r = api_.exec("brand-new", {{"command", "echo hi"}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["stdout"], "hi\n");
  EXPECT_EQ(api_.get("/v1/sessions/brand-new").status, 200);
}

TEST_F(ExecApi, BadRequestsNameTheField) {
  struct Case {
    std::string body;
    std::string needle;
  };
  std::vector<Case> cases = {
      {"{not json", "JSON"},
      {"{}", "'command'"},
      {R"({"command": 5})", "field 'command' must be a string"},
      {R"({"command": ""})", "'command'"},
      {R"({"argv": "ls"})", "'argv'"},
      {R"({"argv": []})", "'argv'"},
      {R"({"argv": ["ls", 1]})", "'argv[1]'"},
      {R"({"command": "ls", "argv": ["ls"]})", "not both"},
      {R"({"command": "ls", "timeout_sec": "abc"})", "field 'timeout_sec' must be a number"},
      {R"({"command": "ls", "timeout_sec": -1})", "'timeout_sec'"},
      {R"({"command": "ls", "max_output_bytes": 1.5})", "'max_output_bytes'"},
      {R"({"command": "ls", "env": {"A": 1}})", "'env.A'"},
      {R"({"command": "ls", "env": ["A"]})", "'env'"},
      {R"({"command": "ls", "cwd": false})", "'cwd'"},
      {R"({"command": "ls", "stdin": {}})", "'stdin'"},
      {R"({"command": "ls", "artifact_dir": 3})", "'artifact_dir'"},
  };
  for (const auto& c : cases) {
    for (const std::string route : {"/exec", "/exec/stream"}) {
      auto r = api_.call("POST", "/v1/sessions/box" + route, c.body);
      EXPECT_EQ(r.status, 400) << route << " " << c.body << ": " << r;
      EXPECT_EQ(r.code(), "EINVAL") << c.body;
      EXPECT_NE(r.message().find(c.needle), std::string::npos)
          << c.body << " -> " << r.message() << " (wanted " << c.needle << ")";
    }
  }
  // An unknown field is refused naming it (API.md "General"), not ignored.
  auto unknown = api_.exec("box", {{"command", "echo ok"}, {"shell", "zsh"}});
  EXPECT_EQ(unknown.status, 400) << unknown;
  EXPECT_NE(unknown.message().find("'shell'"), std::string::npos) << unknown;
}

TEST_F(ExecApi, StreamSendsOutputAsItComesThenExitLast) {
  int status = 0;
  auto lines = stream("/v1/sessions/box/exec/stream",
                      {{"command", "echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three; "
                                   "exit 4"}},
                      &status);
  ASSERT_EQ(status, 200);
  ASSERT_GE(lines.size(), 4u);
  std::string out, err;
  for (std::size_t i = 0; i + 1 < lines.size(); ++i) {
    const json& l = lines[i];
    ASSERT_TRUE(l["type"] == "stdout" || l["type"] == "stderr") << l;
    (l["type"] == "stdout" ? out : err) += l["data"].get<std::string>();
  }
  EXPECT_EQ(out, "one\nthree\n");
  EXPECT_EQ(err, "two\n");
  // Order of events follows the command: "two" (stderr) comes between "one" and "three".
  std::string order;
  for (const auto& l : lines) {
    if (l["type"] == "stdout" || l["type"] == "stderr") order += l["data"].get<std::string>();
  }
  EXPECT_EQ(order, "one\ntwo\nthree\n");
  const json& last = lines.back();
  EXPECT_EQ(last["type"], "exit");
  EXPECT_EQ(last["exit_code"], 4);
  EXPECT_TRUE(last["signal"].is_null());
  EXPECT_EQ(last["timed_out"], false);
  EXPECT_TRUE(last["duration_ms"].is_number_integer());
}

TEST_F(ExecApi, StreamReportsTimeoutAndSurvivesNonUtf8) {
  int status = 0;
  auto lines = stream("/v1/sessions/box/exec/stream",
                      {{"command", "printf 'x\\377y'; sleep 30"}, {"timeout_sec", 1}}, &status);
  ASSERT_EQ(status, 200);
  ASSERT_FALSE(lines.empty());
  std::string out;
  for (const auto& l : lines) {
    if (l["type"] == "stdout") out += l["data"].get<std::string>();
  }
  EXPECT_EQ(out, "x\xEF\xBF\xBDy");
  EXPECT_EQ(lines.back()["type"], "exit");
  EXPECT_EQ(lines.back()["timed_out"], true);
  EXPECT_EQ(lines.back()["exit_code"], -1);
}

// Sends a request for a streaming exec on a bare connection.
void send_stream_request(RawConnection& raw, const json& body) {
  std::string b = body.dump();
  ASSERT_TRUE(raw.send("POST /v1/sessions/box/exec/stream HTTP/1.1\r\nHost: x\r\n"
                       "Content-Type: application/json\r\nContent-Length: " +
                       std::to_string(b.size()) + "\r\n\r\n" + b));
}

TEST_F(ExecApi, StreamDeliversEachEventWhileTheCommandRuns) {
  RawConnection raw(daemon_.host_port());
  send_stream_request(raw, {{"command", "echo first; sleep 20; echo second"}, {"timeout_sec", 60}});
  // "first" arrives long before the command ends: events are flushed as they come.
  std::string got;
  auto start = std::chrono::steady_clock::now();
  while (got.find("first") == std::string::npos &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    got += raw.read_until_close(std::chrono::milliseconds(200));
  }
  EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
  EXPECT_NE(got.find("application/x-ndjson"), std::string::npos) << got;
  EXPECT_NE(got.find("chunked"), std::string::npos) << got;
  EXPECT_NE(got.find(R"({"data":"first\n","type":"stdout"})"), std::string::npos) << got;
  EXPECT_EQ(got.find("second"), std::string::npos) << got;
}

TEST_F(ExecApi, ClientLeavingTheStreamKillsTheCommand) {
  {
    RawConnection raw(daemon_.host_port());
    send_stream_request(raw, {{"command", "echo $$ > loop.pid; while true; do echo tick; "
                                          "sleep 0.1; done"},
                              {"timeout_sec", 600}});
    std::string got;
    auto start = std::chrono::steady_clock::now();
    while (got.find("tick") == std::string::npos &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
      got += raw.read_until_close(std::chrono::milliseconds(200));
    }
    ASSERT_NE(got.find("tick"), std::string::npos) << got;
  }  // hang up mid-stream
  pid_t pid = pid_from("loop.pid");
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(eventually([&] { return !process_alive(pid); }, 15))
      << "the command outlived its client";
  // The daemon keeps serving.
  EXPECT_EQ(api_.sh("box", "echo still here").body["stdout"], "still here\n");
}

TEST_F(ExecApi, ClientLeavingAOneShotExecKillsTheCommand) {
  std::string body =
      json{{"command", "echo $$ > once.pid; while true; do echo tick; sleep 0.1; done"},
           {"timeout_sec", 600}}
          .dump();
  {
    RawConnection raw(daemon_.host_port());
    ASSERT_TRUE(raw.send("POST /v1/sessions/box/exec HTTP/1.1\r\nHost: x\r\n"
                         "Content-Type: application/json\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\n\r\n" + body));
    ASSERT_TRUE(eventually([&] { return pid_from("once.pid") > 0; }));
  }  // hang up
  pid_t pid = pid_from("once.pid");
  EXPECT_TRUE(eventually([&] { return !process_alive(pid); }, 15))
      << "the command outlived its client";
}

// ---- A client that leaves while its command prints nothing ------------------------------------
// The output sink cannot notice a silent command's client is gone; the disconnect itself must
// kill the command and everything it started, within seconds, not at timeout_sec. On both
// backends (ns: as root, which this suite runs as).

// Live processes (zombies excluded) whose command line contains `marker`.
std::vector<pid_t> processes_with(const std::string& marker) {
  std::vector<pid_t> found;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_host_file(e.path().string() + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(marker) == std::string::npos) continue;
    pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid != ::getpid() && process_alive(pid)) found.push_back(pid);
  }
  return found;
}

class ExecDisconnect : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ASSERT_EQ(api_.post("/v1/sessions", {{"id", "box"}}).status, 201); }

  // A silent command tree: a shell, a background sleep and a foreground sleep, each with
  // `marker_` in its command line (GNU sleep takes fractional seconds: 600.0<n>).
  json silent_tree() {
    static int n = 0;
    marker_ = "600.0" + std::to_string(::getpid()) + std::to_string(++n);
    return {{"command", "sleep " + marker_ + "1 & sleep " + marker_ + "2; wait"},
            {"timeout_sec", 600}};
  }

  void send_request(RawConnection& raw, const std::string& route, const json& body) {
    std::string b = body.dump();
    ASSERT_TRUE(raw.send("POST /v1/sessions/box/" + route + " HTTP/1.1\r\nHost: x\r\n" +
                         "Content-Type: application/json\r\nContent-Length: " +
                         std::to_string(b.size()) + "\r\n\r\n" + b));
  }

  // Starts the silent tree through `route`, hangs up once it runs, and checks that it is gone
  // within a few seconds and that the daemon keeps serving.
  void hang_up_on_silent_command(const std::string& route) {
    json body = silent_tree();
    {
      RawConnection raw(daemon_.host_port());
      send_request(raw, route, body);
      ASSERT_TRUE(eventually([&] { return processes_with(marker_).size() >= 3; }, 30))
          << "the command did not start: " << daemon_.log();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      EXPECT_GE(processes_with(marker_).size(), 3u) << "the command ended by itself";
    }  // hang up
    const auto left = std::chrono::steady_clock::now();
    EXPECT_TRUE(eventually([&] { return processes_with(marker_).empty(); }, 5))
        << processes_with(marker_).size() << " process(es) of the command outlived its client";
    EXPECT_LT(std::chrono::steady_clock::now() - left, std::chrono::seconds(5));
    auto r = api_.sh("box", "echo still here");
    EXPECT_EQ(r.body["stdout"], "still here\n") << r;
  }

  void TearDown() override {
    // Never leave a 600 s sleeper behind, whatever the daemon did.
    for (pid_t pid : processes_with(marker_)) ::kill(pid, SIGKILL);
  }

  Daemon daemon_{{"--backend", GetParam()}};
  Api api_{daemon_};
  std::string marker_ = "unset-marker-never-matches";
};

TEST_P(ExecDisconnect, OneShotExecOfASilentCommandIsKilledWhenTheClientLeaves) {
  hang_up_on_silent_command("exec");
}

TEST_P(ExecDisconnect, StreamOfASilentCommandIsKilledWhenTheClientLeaves) {
  hang_up_on_silent_command("exec/stream");
}

INSTANTIATE_TEST_SUITE_P(Backends, ExecDisconnect, ::testing::Values("host", "ns"),
                         [](const auto& info) { return info.param; });

TEST_F(ExecApi, ManyConcurrentExecsDoNotTakeAThreadEach) {
  constexpr int kExecs = 100;  // issue 2: "100 concurrent long-running execs"
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kExecs; ++i) {
    clients.emplace_back([&, i] {
      Api api(daemon_);
      auto r = api.exec("box", {{"command", "sleep 2; echo " + std::to_string(i)}});
      if (r.status == 200 && r.body["stdout"] == std::to_string(i) + "\n") ++ok;
    });
  }
  // While they all sleep, the daemon's thread count stays small.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  std::string status = read_host_file("/proc/" + std::to_string(daemon_.pid()) + "/status");
  auto pos = status.find("Threads:");
  ASSERT_NE(pos, std::string::npos);
  int threads = std::stoi(status.substr(pos + 8));
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), kExecs);
  // The daemon's threads: its io thread, the worker pool (max(4, 2 x cores), at most 32) and a
  // few of the backends'; none per command.
  const int pool =
      static_cast<int>(std::clamp(2 * std::max(1u, std::thread::hardware_concurrency()), 4u, 32u));
  EXPECT_LE(threads, pool + 6) << "threads while " << kExecs << " commands ran";
}

}  // namespace
}  // namespace agentbox::testing
