// The real agentbox-runner binary driven by a fake xbot server (fake_xbot_server.h) on loopback:
// every request type of PROTOCOLS.md 1.3, the path guard of SECURITY.md T8, timeouts that kill
// the process group, children killed on disconnect, reconnect with back-off.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/ssl.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "runner/fake_xbot_server.h"
#include "support/support.h"

extern char** environ;

namespace agentbox::testing {
namespace {

namespace p = runner::proto;
using namespace std::chrono_literals;
using Json = p::Json;

std::string runner_bin() {
  const char* d = std::getenv("AGENTBOX_BIN_DIR");  // ctest sets it
  return std::string(d ? d : "bin") + "/agentbox-runner";
}

// The runner as a child process; killed (SIGTERM, then SIGKILL) and reaped at the end.
class RunnerProcess {
 public:
  RunnerProcess(const std::string& url, const std::string& token, const std::string& ws,
                std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {runner_bin(),  "--server", url,           "--token", token,
                                     "--workspace", ws,         "--log-level", "warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
  }
  ~RunnerProcess() { stop(); }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      usleep(20000);
    }
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

std::string data_of(const p::Envelope& e, const char* key) {
  if (!e.body || !e.body->is_object() || !e.body->contains(key)) return "<none>";
  const auto& v = (*e.body)[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}
std::string code_of(const p::Envelope& e) {
  return e.type == "error" ? data_of(e, "code") : "<" + e.type + ">";
}

// A workspace inside a temp dir, with a sibling "ws2" (the prefix trick) and "outside".
class RunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ws_ = tmp_ / "ws";
    std::filesystem::create_directories(ws_);
    std::filesystem::create_directories(tmp_ / "ws2");
    std::filesystem::create_directories(tmp_ / "outside");
    spit(tmp_ / "ws2/secret", "s2");
    spit(tmp_ / "outside/canary", "canary");
    runner_ = std::make_unique<RunnerProcess>(server_.url(), "T", ws_);
    ASSERT_TRUE(server_.wait_accepted(1)) << "the runner did not register";
  }
  void TearDown() override { runner_.reset(); }

  p::Envelope exec(const std::string& cmd, std::int64_t timeout = 30, std::string dir = {}) {
    p::ExecRequest r{.command = cmd, .shell = true, .dir = std::move(dir), .timeout = timeout};
    return server_.request(p::type::kExec, p::to_json(r));
  }
  p::Envelope path_req(std::string_view type, const std::string& path) {
    return server_.request(type, p::to_json(p::PathRequest{path}));
  }

  TempDir tmp_{"agentbox-runner-test"};
  std::string ws_;
  FakeXbotServer server_;
  std::unique_ptr<RunnerProcess> runner_;
};

TEST_F(RunnerTest, RegistersAsXbotsRunnerDoes) {
  auto regs = server_.registrations();
  ASSERT_EQ(regs.size(), 1u);
  EXPECT_TRUE(regs[0].id.empty());
  EXPECT_EQ(regs[0].user_id, "alice");
  auto b = p::body_as<p::RegisterBody>(regs[0]);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->user_id, "alice");
  EXPECT_EQ(b->auth_token, "T");
  EXPECT_EQ(b->workspace, std::filesystem::canonical(ws_).string());
  EXPECT_EQ(b->shell, access("/bin/bash", X_OK) == 0 ? "/bin/bash" : "/bin/sh");
  EXPECT_EQ(b->version, 3);  // agentbox's version 3; xbot's server ignores it
}

TEST_F(RunnerTest, ExecShellAndArgvForms) {
  auto r = exec("echo hi; echo err >&2; exit 3");
  ASSERT_EQ(r.type, "exec_result") << p::encode(r);
  auto res = p::body_as<p::ExecResult>(r);
  EXPECT_EQ(res->stdout_data, "hi\n");
  EXPECT_EQ(res->stderr_data, "err\n");
  EXPECT_EQ(res->exit_code, 3);
  EXPECT_FALSE(res->timed_out);

  // argv form: args[0] is the program, command is ignored (xbot's callers send both)
  p::ExecRequest a{.command = "ignored",
                   .args = {"/bin/sh", "-c", "echo \"$0|$X|$(pwd)\"", "zero"},
                   .env = {"X=1"},
                   .timeout = 10};
  auto ra = server_.request(p::type::kExec, p::to_json(a));
  ASSERT_EQ(ra.type, "exec_result") << p::encode(ra);
  EXPECT_EQ(p::body_as<p::ExecResult>(ra)->stdout_data,
            "zero|1|" + std::filesystem::canonical(ws_).string() + "\n");

  p::ExecRequest none{.command = "ls", .timeout = 10};
  auto rn = server_.request(p::type::kExec, p::to_json(none));
  EXPECT_EQ(code_of(rn), "EIO");
  EXPECT_EQ(data_of(rn, "message"), "exec error: non-shell exec requires args to be set");

  p::ExecRequest in{.command = "tr a-z A-Z", .shell = true, .stdin_data = "hello", .timeout = 10};
  EXPECT_EQ(p::body_as<p::ExecResult>(server_.request(p::type::kExec, p::to_json(in)))->stdout_data,
            "HELLO");

  std::filesystem::create_directories(ws_ + "/sub");
  EXPECT_EQ(p::body_as<p::ExecResult>(exec("pwd", 10, "sub"))->stdout_data,
            std::filesystem::canonical(ws_).string() + "/sub\n");
  auto killed = exec("kill -9 $$", 10);
  EXPECT_EQ(p::body_as<p::ExecResult>(killed)->exit_code, -1);
}

TEST_F(RunnerTest, ExecWithABadDirIsAnErrorAndRunsNothing) {
  auto missing = exec("touch ran", 10, "nope");
  EXPECT_EQ(code_of(missing), "ENOENT");  // 404 through the API, as on the other backends
  EXPECT_NE(data_of(missing, "message").find("nope"), std::string::npos)
      << data_of(missing, "message");
  auto out = exec("touch ran", 10, tmp_ / "outside");
  EXPECT_EQ(code_of(out), "EPERM");
  auto prefix = exec("touch ran", 10, tmp_ / "ws2");
  EXPECT_EQ(code_of(prefix), "EPERM");
  EXPECT_FALSE(std::filesystem::exists(ws_ + "/ran"));
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "outside/ran"));
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "ws2/ran"));
  p::BgExecRequest bg{
      .task_id = "t", .command = "touch ran", .shell = true, .dir = tmp_ / "outside"};
  EXPECT_EQ(code_of(server_.request(p::type::kBgExec, p::to_json(bg))), "EPERM");
  p::StdioStart st{.stream_id = "s", .command = "touch", .args = {"ran"}, .dir = tmp_ / "outside"};
  EXPECT_EQ(code_of(server_.request(p::type::kStdioStart, p::to_json(st))), "EPERM");
  p::PtyCreate pt{.stream_id = "p", .command = "touch", .args = {"ran"}, .dir = "/etc"};
  EXPECT_EQ(code_of(server_.request(p::type::kPtyCreate, p::to_json(pt))), "EPERM");
  usleep(200000);
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "outside/ran"));
}

TEST_F(RunnerTest, ExecTimeoutKillsTheWholeGroupAndSaysTimedOut) {
  auto start = std::chrono::steady_clock::now();
  auto r = exec("sleep 30 & echo $! > bgpid; sleep 30; echo after", 1);
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(r.type, "exec_result") << p::encode(r);
  auto res = p::body_as<p::ExecResult>(r);
  EXPECT_TRUE(res->timed_out);
  EXPECT_EQ(res->exit_code, -1);
  EXPECT_EQ(res->stdout_data.find("after"), std::string::npos);
  EXPECT_LT(took, 10s);  // not the 30 s of the sleeps (xbot waits for every pipe holder)
  pid_t bg = std::atoi(slurp(ws_ + "/bgpid").c_str());
  ASSERT_GT(bg, 0);
  EXPECT_TRUE(wait_dead(bg, 5000ms)) << "the background sleep of the timed-out group survived";
}

TEST_F(RunnerTest, RepliesComeInAnyOrder) {
  p::ExecRequest slow{.command = "sleep 2; echo slow", .shell = true, .timeout = 10};
  std::string slow_id = server_.send_request(p::type::kExec, p::to_json(slow));
  auto fast = exec("echo fast");
  EXPECT_EQ(p::body_as<p::ExecResult>(fast)->stdout_data, "fast\n");
  EXPECT_FALSE(server_.wait_reply(slow_id, 200ms)) << "the slow exec answered before the fast one";
  auto s = server_.wait_reply(slow_id, 10s);
  ASSERT_TRUE(s);
  EXPECT_EQ(p::body_as<p::ExecResult>(*s)->stdout_data, "slow\n");
}

TEST_F(RunnerTest, FileRequests) {
  p::WriteFileRequest w{.path = "a.txt", .data = std::string("hi\0there", 8), .perm = 0640};
  auto rw = server_.request(p::type::kWriteFile, p::to_json(w));
  EXPECT_EQ(p::encode(rw), R"({"id":")" + rw.id + R"(","type":"ok"})");  // ok with no body
  EXPECT_EQ(slurp(ws_ + "/a.txt"), std::string("hi\0there", 8));
  struct stat st {};
  ASSERT_EQ(::stat((ws_ + "/a.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u & ~0022u & 0777);

  auto rr = path_req(p::type::kReadFile, ws_ + "/a.txt");
  ASSERT_EQ(rr.type, "file_content");
  EXPECT_EQ(p::body_as<p::FileContent>(rr)->data, std::string("hi\0there", 8));

  auto rs = path_req(p::type::kStat, "a.txt");
  ASSERT_EQ(rs.type, "file_info") << p::encode(rs);
  auto fi = p::body_as<p::FileInfo>(rs);
  EXPECT_EQ(fi->name, "a.txt");
  EXPECT_EQ(fi->size, 8);
  EXPECT_EQ(fi->mode, 0640u);
  EXPECT_FALSE(fi->is_dir);
  EXPECT_TRUE(p::parse_mod_time(fi->mod_time));

  auto rm = server_.request(p::type::kMkdirAll, p::to_json(p::MkdirAllRequest{"d/e/f", 0755}));
  EXPECT_EQ(rm.type, "ok");
  EXPECT_TRUE(std::filesystem::is_directory(ws_ + "/d/e/f"));
  auto sd = p::body_as<p::FileInfo>(path_req(p::type::kStat, "d"));
  EXPECT_EQ(sd->mode, 2147484141u);  // Go's FileMode of a 0755 dir
  EXPECT_TRUE(sd->is_dir);

  std::filesystem::create_symlink("d", ws_ + "/link");
  auto rd = path_req(p::type::kReadDir, ws_);
  ASSERT_EQ(rd.type, "dir_entries");
  auto de = p::body_as<p::DirEntries>(rd);
  ASSERT_EQ(de->entries.size(), 3u);
  EXPECT_EQ(de->entries[0].name, "a.txt");
  EXPECT_EQ(de->entries[1].name, "d");
  EXPECT_TRUE(de->entries[1].is_dir);
  EXPECT_EQ(de->entries[2].name, "link");
  EXPECT_FALSE(de->entries[2].is_dir);  // lstat, as xbot
  EXPECT_EQ(p::encode(path_req(p::type::kReadDir, "d/e/f")).find(R"("body":{"entries":[]})") !=
                std::string::npos,
            true);

  EXPECT_EQ(code_of(path_req(p::type::kRemove, "d")), "EEXIST");  // ENOTEMPTY, as xbot maps it
  EXPECT_EQ(path_req(p::type::kRemove, "a.txt").type, "ok");
  EXPECT_FALSE(std::filesystem::exists(ws_ + "/a.txt"));
  EXPECT_EQ(path_req(p::type::kRemoveAll, "d").type, "ok");
  EXPECT_FALSE(std::filesystem::exists(ws_ + "/d"));
  EXPECT_EQ(path_req(p::type::kRemoveAll, "d").type, "ok");  // missing is ok
  EXPECT_EQ(code_of(path_req(p::type::kReadFile, "nope")), "ENOENT");
  EXPECT_EQ(code_of(path_req(p::type::kStat, "nope")), "ENOENT");
  EXPECT_EQ(code_of(server_.request(p::type::kWriteFile, Json{{"path", "x"}, {"data", "!!"}})),
            "EIO");
  EXPECT_EQ(code_of(server_.request(p::type::kWriteFile,
                                    p::to_json(p::WriteFileRequest{"no/such/x", "1", 0644}))),
            "ENOENT");  // write_file does not create parents (xbot)
}

TEST_F(RunnerTest, PathGuardRefusesEveryEscape) {  // SECURITY.md T8
  std::string out = tmp_ / "outside";
  std::filesystem::create_symlink(out, ws_ + "/link");
  auto expect_eperm = [&](const p::Envelope& e, const std::string& what) {
    EXPECT_EQ(code_of(e), "EPERM") << what << ": " << p::encode(e);
  };
  expect_eperm(path_req(p::type::kReadFile, tmp_ / "ws2/secret"), "prefix trick");
  expect_eperm(path_req(p::type::kReadFile, ws_ + "/../ws2/secret"), "prefix trick via ..");
  expect_eperm(path_req(p::type::kReadFile, "../../etc/passwd"), "../../etc/passwd");
  expect_eperm(path_req(p::type::kReadFile, "/etc/passwd"), "/etc/passwd");
  expect_eperm(path_req(p::type::kReadFile, "link/canary"), "read through a symlink out");
  expect_eperm(path_req(p::type::kStat, "link/canary"), "stat through a symlink out");
  expect_eperm(path_req(p::type::kReadDir, "link"), "read_dir through a symlink out");
  expect_eperm(server_.request(p::type::kWriteFile,
                               p::to_json(p::WriteFileRequest{"link/new.txt", "x", 0644})),
               "write a new file through a symlink out");
  expect_eperm(server_.request(p::type::kWriteFile,
                               p::to_json(p::WriteFileRequest{"link/canary", "x", 0644})),
               "overwrite through a symlink out");
  expect_eperm(
      server_.request(p::type::kMkdirAll, p::to_json(p::MkdirAllRequest{"link/newdir", 0755})),
      "mkdir_all through a symlink out");
  expect_eperm(path_req(p::type::kRemoveAll, "link/canary"), "remove_all through a symlink out");
  expect_eperm(path_req(p::type::kRemove, tmp_ / "ws2/secret"), "remove by the prefix trick");
  auto msg = data_of(path_req(p::type::kReadFile, "/etc/passwd"), "message");
  EXPECT_NE(msg.find("escapes workspace"), std::string::npos) << msg;
  EXPECT_EQ(slurp(out + "/canary"), "canary");
  EXPECT_EQ(slurp(tmp_ / "ws2/secret"), "s2");
  EXPECT_FALSE(std::filesystem::exists(out + "/new.txt"));
  EXPECT_FALSE(std::filesystem::exists(out + "/newdir"));
  // a ".." that stays inside, and a symlink that stays inside, are fine
  std::filesystem::create_directories(ws_ + "/in");
  std::filesystem::create_symlink("in", ws_ + "/inlink");
  EXPECT_EQ(server_
                .request(p::type::kWriteFile,
                         p::to_json(p::WriteFileRequest{"in/../inlink/f", "ok", 0644}))
                .type,
            "ok");
  EXPECT_EQ(slurp(ws_ + "/in/f"), "ok");
  // remove_all of the link removes the link, not the target
  EXPECT_EQ(path_req(p::type::kRemoveAll, "link").type, "ok");
  EXPECT_EQ(slurp(out + "/canary"), "canary");
}

TEST_F(RunnerTest, BackgroundTasks) {
  p::BgExecRequest b{.task_id = "t1",
                     .command = "echo out; echo err >&2; echo $$ > bgpid; sleep 30",
                     .shell = true};
  auto r = server_.request(p::type::kBgExec, p::to_json(b));
  EXPECT_EQ(p::encode(r),
            R"({"id":")" + r.id + R"(","type":"bg_started","body":{"task_id":"t1"}})");
  p::BgOutput o;
  for (int i = 0; i < 100; ++i) {
    o = *p::body_as<p::BgOutput>(
        server_.request(p::type::kBgStatus, p::to_json(p::TaskRequest{"t1"})));
    if (!o.stdout_data.empty() && !o.stderr_data.empty()) break;
    usleep(50000);
  }
  EXPECT_EQ(o.status, "running");
  EXPECT_EQ(o.stdout_data, "out\n");
  EXPECT_EQ(o.stderr_data, "err\n");
  pid_t pid = std::atoi(slurp(ws_ + "/bgpid").c_str());
  EXPECT_EQ(server_.request(p::type::kBgKill, p::to_json(p::TaskRequest{"t1"})).type, "ok");
  EXPECT_TRUE(wait_dead(pid, 5000ms));
  o = *p::body_as<p::BgOutput>(
      server_.request(p::type::kBgStatus, p::to_json(p::TaskRequest{"t1"})));
  EXPECT_EQ(o.status, "killed");
  auto again = server_.request(p::type::kBgKill, p::to_json(p::TaskRequest{"t1"}));
  EXPECT_EQ(code_of(again), "EIO");
  EXPECT_EQ(data_of(again, "message"), "bg_kill failed: task t1 is not running (status=killed)");

  p::BgExecRequest done{.task_id = "t2", .command = "exit 4", .shell = true};
  server_.request(p::type::kBgExec, p::to_json(done));
  for (int i = 0; i < 100 && o.status != "failed"; ++i) {
    o = *p::body_as<p::BgOutput>(
        server_.request(p::type::kBgStatus, p::to_json(p::TaskRequest{"t2"})));
    usleep(20000);
  }
  EXPECT_EQ(o.status, "failed");
  EXPECT_EQ(o.exit_code, 4);
  auto unknown = server_.request(p::type::kBgStatus, p::to_json(p::TaskRequest{"zz"}));
  EXPECT_EQ(data_of(unknown, "message"), "bg_status failed: task zz not found");
}

TEST_F(RunnerTest, StdioStreams) {
  p::StdioStart s{.stream_id = "s1", .command = "cat"};
  auto r = server_.request(p::type::kStdioStart, p::to_json(s));
  EXPECT_EQ(p::encode(r), R"({"id":")" + r.id + R"(","type":"ok","body":{"stream_id":"s1"}})");
  EXPECT_EQ(code_of(server_.request(p::type::kStdioStart, p::to_json(s))), "EEXIST");
  // stdio_write comes without an id, as xbot's MCP transport sends it
  server_.send(p::frame("", p::type::kStdioWrite, p::to_json(p::StreamData{"s1", "hello\n"})));
  server_.send(p::frame("", p::type::kStdioWrite, p::to_json(p::StreamData{"s1", "world\n"})));
  EXPECT_TRUE(server_.wait_push([&](const auto& v) {
    return FakeXbotServer::data_in(v, "stdio_data", "s1") == "hello\nworld\n";
  })) << server_.pushed_data("stdio_data", "s1");
  EXPECT_EQ(server_.request(p::type::kStdioClose, p::to_json(p::StreamRequest{"s1"})).type, "ok");
  EXPECT_TRUE(server_.wait_push([](const auto& v) {
    for (const auto& e : v) {
      if (e.type == "stdio_exit") return true;
    }
    return false;
  }));
  EXPECT_EQ(code_of(server_.request(p::type::kStdioClose, p::to_json(p::StreamRequest{"s1"}))),
            "ENOENT");
  EXPECT_EQ(
      code_of(server_.request(p::type::kStdioStart, p::to_json(p::StdioStart{.command = "cat"}))),
      "EINVAL");
  // Version 2's fields mean nothing to a peer that did not negotiate it (xbot's server): stderr
  // is dropped, no pid, no stdio_signal.
  p::StdioStart s2{.stream_id = "s2", .command = "sh", .args = {"-c", "echo out; echo err >&2"}};
  s2.stderr_pipe = true;
  auto r2 = server_.request(p::type::kStdioStart, p::to_json(s2));
  EXPECT_EQ(p::encode(r2), R"({"id":")" + r2.id + R"(","type":"ok","body":{"stream_id":"s2"}})");
  EXPECT_TRUE(server_.wait_push([](const auto& v) {
    for (const auto& e : v) {
      if (e.type == "stdio_exit" && e.body && (*e.body)["stream_id"] == "s2") return true;
    }
    return false;
  }));
  EXPECT_EQ(server_.pushed_data("stdio_data", "s2"), "out\n");
  EXPECT_EQ(code_of(server_.request(p::type::kStdioSignal, p::to_json(p::StreamSignal{"s2", 15}))),
            "EINVAL");
}

TEST_F(RunnerTest, PtyInputAndResizeWork) {
  p::PtyCreate c{.stream_id = "p1", .command = "/bin/sh", .cols = 100, .rows = 30};
  auto r = server_.request(p::type::kPtyCreate, p::to_json(c));
  ASSERT_EQ(p::encode(r), R"({"id":")" + r.id + R"(","type":"ok","body":{"stream_id":"p1"}})");
  // xbot's server sends pty_stdin WITH an id and never waits (1.7): the input must arrive.
  server_.send_request(p::type::kPtyStdin,
                       p::to_json(p::StreamData{"p1", "echo $((6*7))x; stty size\n"}));
  EXPECT_TRUE(server_.wait_push([&](const auto& v) {
    auto d = FakeXbotServer::data_in(v, "pty_data", "p1");
    return d.find("42x") != std::string::npos && d.find("30 100") != std::string::npos;
  })) << server_.pushed_data("pty_data", "p1");
  server_.send_request(p::type::kPtyResize, p::to_json(p::PtyResize{"p1", 90, 20}));
  server_.send_request(p::type::kPtyStdin, p::to_json(p::StreamData{"p1", "stty size\n"}));
  EXPECT_TRUE(server_.wait_push([&](const auto& v) {
    return FakeXbotServer::data_in(v, "pty_data", "p1").find("20 90") != std::string::npos;
  })) << server_.pushed_data("pty_data", "p1");
  EXPECT_EQ(server_.request(p::type::kPtyClose, p::to_json(p::StreamRequest{"p1"})).type, "ok");
  EXPECT_TRUE(server_.wait_push([](const auto& v) {
    for (const auto& e : v) {
      if (e.type == "pty_exit") return true;
    }
    return false;
  }));
  EXPECT_EQ(server_.unexpected_replies(), 0) << "pty_stdin/pty_resize got a reply";
}

TEST_F(RunnerTest, LlmUnknownAndMalformedRequests) {
  auto llm = server_.request(p::type::kLlmModels, Json::object());
  EXPECT_EQ(
      p::encode(llm),
      R"({"id":")" + llm.id +
          R"(","type":"error","body":{"message":"local LLM not configured on this runner","code":"ENOTSUP"}})");
  EXPECT_EQ(code_of(server_.request(p::type::kLlmGenerate, Json::object())), "ENOTSUP");
  auto unk = server_.request("frobnicate", Json::object());
  EXPECT_EQ(data_of(unk, "message"), "unknown request type: frobnicate");
  EXPECT_EQ(code_of(unk), "EINVAL");
  std::string id = p::generate_id();
  server_.send(R"({"id":")" + id + R"(","type":"stat"})");  // no body
  auto nb = server_.wait_reply(id);
  ASSERT_TRUE(nb);
  EXPECT_EQ(code_of(*nb), "EINVAL");
  EXPECT_EQ(code_of(server_.request(p::type::kExec, Json{{"command", 5}})), "EINVAL");
}

// A loopback HTTP server for download_file: /f (a body), /r (302 to /f), /404, /huge (a
// Content-Length over the 100 MiB cap).
class TinyHttp {
 public:
  TinyHttp() : acceptor_(io_, {fx::asio::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this] { serve(); });
  }
  ~TinyHttp() {
    stop_ = true;
    boost::system::error_code ec;
    fx::tcp::socket s(io_);
    s.connect(acceptor_.local_endpoint(), ec);  // wakes accept()
    thread_.join();
  }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }

 private:
  void serve() {
    while (!stop_) {
      boost::system::error_code ec;
      fx::tcp::socket s(io_);
      acceptor_.accept(s, ec);
      if (ec || stop_) return;
      fx::beast::flat_buffer buf;
      fx::http::request<fx::http::string_body> req;
      fx::http::read(s, buf, req, ec);
      if (ec) continue;
      fx::http::response<fx::http::string_body> res{fx::http::status::ok, 11};
      std::string t(req.target());
      if (t == "/f") {
        res.body() = "payload\n";
      } else if (t == "/r") {
        res.result(fx::http::status::found);
        res.set(fx::http::field::location, "/f");
      } else if (t == "/huge") {
        std::string head = "HTTP/1.1 200 OK\r\nContent-Length: 209715200\r\n\r\nxx";
        fx::asio::write(s, fx::asio::buffer(head), ec);
        continue;
      } else {
        res.result(fx::http::status::not_found);
      }
      res.prepare_payload();
      fx::http::write(s, res, ec);
    }
  }
  fx::asio::io_context io_;
  fx::tcp::acceptor acceptor_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_F(RunnerTest, DownloadFile) {
  TinyHttp web;
  auto r = server_.request(p::type::kDownloadFile,
                           p::to_json(p::DownloadRequest{web.url("/r"), "dl/sub/out.txt"}));
  EXPECT_EQ(p::encode(r), R"({"id":")" + r.id + R"(","type":"ok","body":{"size":8}})");
  EXPECT_EQ(slurp(ws_ + "/dl/sub/out.txt"), "payload\n");  // parents created, redirect followed
  auto nf = server_.request(p::type::kDownloadFile,
                            p::to_json(p::DownloadRequest{web.url("/404"), "nf"}));
  EXPECT_EQ(code_of(nf), "EIO");
  EXPECT_NE(data_of(nf, "message").find("HTTP 404"), std::string::npos);
  auto huge = server_.request(p::type::kDownloadFile,
                              p::to_json(p::DownloadRequest{web.url("/huge"), "huge"}));
  EXPECT_EQ(code_of(huge), "ETOOBIG");
  auto out = server_.request(p::type::kDownloadFile,
                             p::to_json(p::DownloadRequest{web.url("/f"), tmp_ / "outside/dl"}));
  EXPECT_EQ(code_of(out), "EPERM");
  EXPECT_FALSE(std::filesystem::exists(ws_ + "/nf"));
  EXPECT_FALSE(std::filesystem::exists(ws_ + "/huge"));
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "outside/dl"));
  auto bad =
      server_.request(p::type::kDownloadFile, p::to_json(p::DownloadRequest{"ftp://x/y", "z"}));
  EXPECT_EQ(code_of(bad), "EINVAL");
}

TEST_F(RunnerTest, PlainBase64FilesOfAnySize) {
  std::string big(10 << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 7919) >> 3);
  auto w = server_.request(p::type::kWriteFile,
                           p::to_json(p::WriteFileRequest{"big.bin", big, 0644}), 60s);
  ASSERT_EQ(w.type, "ok");
  EXPECT_EQ(slurp(ws_ + "/big.bin") == big, true);
  auto r = path_req(p::type::kReadFile, "big.bin");
  ASSERT_EQ(r.type, "file_content");
  EXPECT_EQ(p::body_as<p::FileContent>(r)->data == big, true);
}

TEST_F(RunnerTest, DisconnectKillsChildrenAndReconnects) {
  p::BgExecRequest b{.task_id = "t", .command = "echo $$ > bgpid; exec sleep 300", .shell = true};
  ASSERT_EQ(server_.request(p::type::kBgExec, p::to_json(b)).type, "bg_started");
  p::StdioStart s{
      .stream_id = "s", .command = "sh", .args = {"-c", "echo $$ > stdiopid; exec sleep 300"}};
  ASSERT_EQ(server_.request(p::type::kStdioStart, p::to_json(s)).type, "ok");
  p::ExecRequest e{.command = "echo $$ > execpid; exec sleep 300", .shell = true, .timeout = 600};
  server_.send_request(p::type::kExec, p::to_json(e));
  for (int i = 0; i < 100; ++i) {
    if (!slurp(ws_ + "/bgpid").empty() && !slurp(ws_ + "/stdiopid").empty() &&
        !slurp(ws_ + "/execpid").empty()) {
      break;
    }
    usleep(50000);
  }
  std::vector<pid_t> pids;
  for (const char* f : {"bgpid", "stdiopid", "execpid"}) {
    pids.push_back(std::atoi(slurp(ws_ + "/" + f).c_str()));
    ASSERT_GT(pids.back(), 0) << f;
    ASSERT_FALSE(process_dead(pids.back())) << f;
  }
  server_.drop();
  for (pid_t pid : pids) EXPECT_TRUE(wait_dead(pid, 5000ms)) << pid << " survived the disconnect";
  EXPECT_TRUE(server_.wait_accepted(2, 10s)) << "no reconnect";
  // the new connection serves requests; the old tasks are forgotten
  EXPECT_EQ(p::body_as<p::ExecResult>(exec("echo back"))->stdout_data, "back\n");
  EXPECT_EQ(code_of(server_.request(p::type::kBgStatus, p::to_json(p::TaskRequest{"t"}))), "EIO");
}

// A peer that answers register_ok with version 2 (an agentboxd before version 3) to the runner's
// 3: version 2 is in force (the interop of a version-3 runner with an older server): files over
// 4 MiB in base64 file_chunk text frames, no binary frame; process streams.
class RunnerChunkedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ws_ = tmp_ / "ws";
    std::filesystem::create_directories(ws_);
    runner_ = std::make_unique<RunnerProcess>(server_.url(), "T", ws_);
    ASSERT_TRUE(server_.wait_accepted(1)) << "the runner did not register";
  }
  static std::string pattern(std::size_t n) {
    std::string s(n, '\0');
    for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 2654435761u) >> 13);
    return s;
  }
  std::size_t files_in_ws() {
    std::size_t n = 0;
    for (auto& e : std::filesystem::directory_iterator(ws_)) n += e.is_regular_file() ? 1 : 0;
    return n;
  }
  TempDir tmp_{"agentbox-runner-test"};
  std::string ws_;
  FakeXbotServer server_{FakeXbotServer::Options{.send_version = true}};
  std::unique_ptr<RunnerProcess> runner_;
};

// Version 2 (docs/runner-protocol.md "Process streams"): stderr apart, the pid, stdin's eof,
// stdio_signal, the exit's signal.
TEST_F(RunnerChunkedTest, ProcessStreamsOfVersion2) {
  p::StdioStart s{.stream_id = "v1", .command = "sh", .args = {"-c", "cat; echo err >&2; exit 3"}};
  s.stderr_pipe = true;
  auto r = server_.request(p::type::kStdioStart, p::to_json(s));
  ASSERT_EQ(r.type, "ok");
  auto ok = p::body_as<p::StreamRequest>(r);
  ASSERT_TRUE(ok);
  EXPECT_GT(ok->pid, 0);
  p::StreamData in{"v1", "typed\n"};
  in.eof = true;
  server_.send(p::frame("", p::type::kStdioWrite, p::to_json(in)));
  auto exit_of = [&](const std::string& id) -> std::optional<p::StreamExit> {
    std::optional<p::StreamExit> x;
    server_.wait_push([&](const auto& v) {
      for (const auto& e : v) {
        if (e.type != "stdio_exit") continue;
        auto b = p::body_as<p::StreamExit>(e);
        if (b && b->stream_id == id) x = *b;
      }
      return x.has_value();
    });
    return x;
  };
  auto x = exit_of("v1");
  ASSERT_TRUE(x);
  EXPECT_EQ(x->exit_code, 3);
  EXPECT_EQ(x->signal, 0);
  // stdout and stderr apart: the stderr pushes carry the flag.
  std::string out, err;
  for (const auto& e : server_.pushes()) {
    auto d = p::body_as<p::StreamData>(e);
    if (e.type == "stdio_data" && d && d->stream_id == "v1") (d->is_stderr ? err : out) += d->data;
  }
  EXPECT_EQ(out, "typed\n");
  EXPECT_EQ(err, "err\n");
  EXPECT_EQ(server_.request(p::type::kStdioClose, p::to_json(p::StreamRequest{"v1"})).type, "ok");

  p::StdioStart t{.stream_id = "v2", .command = "sleep", .args = {"60"}};
  ASSERT_EQ(server_.request(p::type::kStdioStart, p::to_json(t)).type, "ok");
  EXPECT_EQ(server_.request(p::type::kStdioSignal, p::to_json(p::StreamSignal{"v2", 15})).type,
            "ok");
  auto y = exit_of("v2");
  ASSERT_TRUE(y);
  EXPECT_EQ(y->signal, 15);
  EXPECT_EQ(y->exit_code, -1);
  EXPECT_EQ(code_of(server_.request(p::type::kStdioSignal, p::to_json(p::StreamSignal{"zz", 9}))),
            "ENOENT");
  EXPECT_EQ(code_of(server_.request(p::type::kStdioSignal, p::to_json(p::StreamSignal{"v2", 0}))),
            "EINVAL");
}

TEST_F(RunnerChunkedTest, UploadInChunksWithAcks) {
  std::string data = pattern((9 << 20) + 123);
  std::string id = server_.send_request(
      p::type::kFileBegin,
      p::to_json(p::FileBegin{"big.bin", 0644, static_cast<std::int64_t>(data.size())}));
  auto a0 = server_.wait_reply(id);
  ASSERT_TRUE(a0);
  ASSERT_EQ(p::encode(*a0), R"({"id":")" + id + R"(","type":"ack","body":{"offset":0}})");
  std::int64_t off = 0;
  while (off < static_cast<std::int64_t>(data.size())) {
    std::size_t n = std::min<std::size_t>(p::kChunkSize, data.size() - off);
    server_.send_with_id(id, p::type::kFileChunk,
                         p::to_json(p::FileChunk{off, data.substr(off, n)}));
    off += static_cast<std::int64_t>(n);
    auto a = server_.wait_reply(id);
    ASSERT_TRUE(a);
    ASSERT_EQ(a->type, "ack") << p::encode(*a);
    EXPECT_EQ(p::body_as<p::Ack>(*a)->offset, off);
  }
  EXPECT_FALSE(std::filesystem::exists(ws_ + "/big.bin")) << "visible before file_end";
  server_.send_with_id(id, p::type::kFileEnd, p::to_json(p::FileEnd{off}));
  auto ok = server_.wait_reply(id);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->type, "ok");
  EXPECT_TRUE(slurp(ws_ + "/big.bin") == data);
  EXPECT_EQ(files_in_ws(), 1u) << "a temp file was left";
}

TEST_F(RunnerChunkedTest, BadUploadsLeaveNothing) {
  spit(ws_ + "/keep.bin", "old");
  std::string id = server_.send_request(p::type::kFileBegin,
                                        p::to_json(p::FileBegin{"keep.bin", 0644, 5 << 20}));
  ASSERT_EQ(server_.wait_reply(id)->type, "ack");
  server_.send_with_id(id, p::type::kFileChunk,
                       p::to_json(p::FileChunk{0, std::string(1000, 'x')}));
  ASSERT_EQ(server_.wait_reply(id)->type, "ack");
  server_.send_with_id(id, p::type::kFileChunk, p::to_json(p::FileChunk{5, "y"}));  // out of order
  auto err = server_.wait_reply(id);
  ASSERT_TRUE(err);
  EXPECT_EQ(code_of(*err), "EINVAL");
  EXPECT_EQ(slurp(ws_ + "/keep.bin"), "old");
  EXPECT_EQ(files_in_ws(), 1u);
  // over the cap, and through a symlink out
  auto big = server_.request(p::type::kFileBegin,
                             p::to_json(p::FileBegin{"x", 0644, p::kMaxFileSize + 1}));
  EXPECT_EQ(code_of(big), "ETOOBIG");
  std::filesystem::create_directories(tmp_ / "outside");
  std::filesystem::create_symlink(tmp_ / "outside", ws_ + "/link");
  auto out =
      server_.request(p::type::kFileBegin, p::to_json(p::FileBegin{"link/x", 0644, 5 << 20}));
  EXPECT_EQ(code_of(out), "EPERM");
  EXPECT_TRUE(std::filesystem::is_empty(tmp_ / "outside"));
  // abandoned by the server: an error frame of the transfer's id
  std::string id2 = server_.send_request(p::type::kFileBegin,
                                         p::to_json(p::FileBegin{"gone.bin", 0644, 5 << 20}));
  ASSERT_EQ(server_.wait_reply(id2)->type, "ack");
  server_.send(p::error_frame(id2, "EIO", "client went away"));
  std::string probe = server_.send_request(p::type::kStat, p::to_json(p::PathRequest{"keep.bin"}));
  ASSERT_TRUE(server_.wait_reply(probe));
  EXPECT_EQ(files_in_ws(), 1u);
}

TEST_F(RunnerChunkedTest, DownloadInChunksWithinTheWindow) {
  std::string data = pattern((12 << 20) + 7);
  ASSERT_TRUE(spit(ws_ + "/big.bin", data));
  std::string id = server_.send_request(p::type::kReadFile, p::to_json(p::PathRequest{"big.bin"}));
  auto begin = server_.wait_reply(id);
  ASSERT_TRUE(begin);
  ASSERT_EQ(p::encode(*begin), R"({"id":")" + id + R"(","type":"file_begin","body":{"size":)" +
                                   std::to_string(data.size()) + "}}");
  // without acks the runner stops at the window (8 MiB)
  std::string got;
  for (;;) {
    auto c = server_.wait_reply(id, 1000ms);
    if (!c) break;
    ASSERT_EQ(c->type, "file_chunk");
    auto fc = p::body_as<p::FileChunk>(*c);
    EXPECT_EQ(fc->offset, static_cast<std::int64_t>(got.size()));
    got += fc->data;
  }
  EXPECT_EQ(got.size(), static_cast<std::size_t>(p::kWindowBytes));
  server_.send_with_id(id, p::type::kAck,
                       p::to_json(p::Ack{static_cast<std::int64_t>(got.size())}));
  for (;;) {
    auto c = server_.wait_reply(id, 10s);
    ASSERT_TRUE(c);
    if (c->type == "file_end") {
      EXPECT_EQ(p::body_as<p::FileEnd>(*c)->size, static_cast<std::int64_t>(data.size()));
      break;
    }
    ASSERT_EQ(c->type, "file_chunk");
    got += p::body_as<p::FileChunk>(*c)->data;
    server_.send_with_id(id, p::type::kAck,
                         p::to_json(p::Ack{static_cast<std::int64_t>(got.size())}));
  }
  EXPECT_TRUE(got == data);
  // a small file is still plain file_content
  spit(ws_ + "/small", "abc");
  auto small = server_.request(p::type::kReadFile, p::to_json(p::PathRequest{"small"}));
  EXPECT_EQ(small.type, "file_content");
}

// wss:// with a CA given by --ca: a TLS WebSocket server (a self-signed certificate for
// 127.0.0.1 made here with the openssl tool) registers the runner and gets an exec answered.
TEST(RunnerTls, WssWithAnExtraCa) {
  TempDir tmp{"agentbox-runner-test"};
  std::filesystem::create_directories(tmp / "ws");
  std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
      "-addext subjectAltName=IP:127.0.0.1 -keyout " +
      (tmp / "key.pem") + " -out " + (tmp / "cert.pem") + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  namespace ssl = boost::asio::ssl;
  ssl::context ctx(ssl::context::tls_server);
  ctx.use_certificate_chain_file(tmp / "cert.pem");
  ctx.use_private_key_file(tmp / "key.pem", ssl::context::pem);
  fx::asio::io_context io;
  fx::tcp::acceptor acc(io, {fx::asio::ip::make_address("127.0.0.1"), 0});
  int port = acc.local_endpoint().port();
  std::string reg_text, reply_text, error;
  std::thread srv([&] {
    try {
      fx::tcp::socket sock(io);
      acc.accept(sock);
      fx::websocket::stream<ssl::stream<fx::tcp::socket>> ws(std::move(sock), ctx);
      ws.next_layer().handshake(ssl::stream_base::server);
      ws.accept();
      fx::beast::flat_buffer buf;
      ws.read(buf);
      reg_text = fx::beast::buffers_to_string(buf.data());
      ws.text(true);
      ws.write(fx::asio::buffer(p::frame("", p::type::kRegisterOk, p::to_json(p::RegisterOk{}))));
      p::ExecRequest e{.command = "echo tls", .shell = true, .timeout = 10};
      ws.write(fx::asio::buffer(p::frame("req_1", p::type::kExec, p::to_json(e))));
      buf.consume(buf.size());
      ws.read(buf);
      reply_text = fx::beast::buffers_to_string(buf.data());
    } catch (const std::exception& ex) {
      error = ex.what();
    }
  });
  {
    RunnerProcess runner("wss://127.0.0.1:" + std::to_string(port) + "/ws/alice", "T", tmp / "ws",
                         {"--ca", tmp / "cert.pem"});
    srv.join();
  }
  EXPECT_EQ(error, "");
  EXPECT_NE(reg_text.find(R"("type":"register")"), std::string::npos) << reg_text;
  EXPECT_EQ(
      reply_text,
      R"({"id":"req_1","type":"exec_result","body":{"stdout":"tls\n","stderr":"","exit_code":0,"timed_out":false}})");
}

TEST(RunnerTls, AnUntrustedCertificateIsRefused) {
  TempDir tmp{"agentbox-runner-test"};
  std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
      "-addext subjectAltName=IP:127.0.0.1 -keyout " +
      (tmp / "key.pem") + " -out " + (tmp / "cert.pem") + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  namespace ssl = boost::asio::ssl;
  ssl::context ctx(ssl::context::tls_server);
  ctx.use_certificate_chain_file(tmp / "cert.pem");
  ctx.use_private_key_file(tmp / "key.pem", ssl::context::pem);
  fx::asio::io_context io;
  fx::tcp::acceptor acc(io, {fx::asio::ip::make_address("127.0.0.1"), 0});
  int port = acc.local_endpoint().port();
  bool handshake_ok = true;
  std::thread srv([&] {
    fx::tcp::socket sock(io);
    acc.accept(sock);
    ssl::stream<fx::tcp::socket> s(std::move(sock), ctx);
    boost::system::error_code ec;
    s.handshake(ssl::stream_base::server, ec);
    handshake_ok = !ec;
  });
  {
    RunnerProcess runner("wss://127.0.0.1:" + std::to_string(port) + "/ws/alice", "T", tmp.path());
    srv.join();
  }
  EXPECT_FALSE(handshake_ok) << "the runner accepted a certificate no CA vouches for";
}

std::vector<long> gaps_ms(const std::vector<std::chrono::steady_clock::time_point>& t) {
  std::vector<long> out;
  for (std::size_t i = 1; i < t.size(); ++i) {
    out.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(t[i] - t[i - 1]).count());
  }
  return out;
}

TEST(RunnerReconnect, RefusedRegistrationsBackOffExponentially) {
  TempDir tmp{"agentbox-runner-test"};
  FakeXbotServer server;
  RunnerProcess runner(server.url(), "wrong", tmp.path(), {"--backoff-base-ms", "200"});
  ASSERT_TRUE(server.wait_connections(4, 20s));
  runner.stop();
  auto regs = server.registrations();
  ASSERT_GE(regs.size(), 3u);
  EXPECT_EQ(server.accepted(), 0);
  auto g = gaps_ms(server.connect_times());
  // 200 ms, 400 ms, 800 ms (+ up to a quarter of jitter)
  EXPECT_GE(g[0], 190);
  EXPECT_GE(g[1], 390);
  EXPECT_GE(g[2], 790);
  EXPECT_GT(g[2], g[1]);
  EXPECT_GT(g[1], g[0]);
}

TEST(RunnerReconnect, BackoffStartsAgainAfterAGoodConnection) {
  TempDir tmp{"agentbox-runner-test"};
  FakeXbotServer server;
  RunnerProcess runner(server.url(), "T", tmp.path(), {"--backoff-base-ms", "200"});
  for (int i = 1; i <= 4; ++i) {
    ASSERT_TRUE(server.wait_accepted(i, 10s)) << i;
    server.drop();
  }
  auto g = gaps_ms(server.connect_times());
  ASSERT_GE(g.size(), 3u);
  // every drop follows a successful registration: the delay stays at the base (xbot: 1, 2, 4 s)
  for (long ms : g) EXPECT_LT(ms, 700) << "back-off did not reset";
}

TEST(RunnerReconnect, ServerRefusalsAsXbot) {
  TempDir tmp{"agentbox-runner-test"};
  FakeXbotServer server;
  // user_id from --user-id that does not match the URL: FORBIDDEN, and the runner keeps trying
  RunnerProcess runner(server.url(), "T", tmp.path(),
                       {"--user-id", "bob", "--backoff-base-ms", "100"});
  ASSERT_TRUE(server.wait_connections(2, 10s));
  EXPECT_EQ(server.accepted(), 0);
  auto regs = server.registrations();
  ASSERT_FALSE(regs.empty());
  EXPECT_EQ(p::body_as<p::RegisterBody>(regs[0])->user_id, "bob");
}

}  // namespace
}  // namespace agentbox::testing
