// Processes (sandbox/process_table.h) on both backends, through Sandbox::processes(): start,
// list, get by tag and pid, output offsets and resume, a bounded flood, stdin in and out (an echo
// "MCP server"), signals, killing the whole tree, ptys, exit codes, one attacher, and the end of
// every process with the box. The ns cases run real boxes as root; never skipped.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <gtest/gtest.h>
#include <optional>
#include <sstream>
#include <thread>

#include "sandbox/host_backend.h"
#include "sandbox/ns_backend.h"
#include "sandbox/process_table.h"

namespace agentbox::sandbox {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string bin_dir() {
  if (const char* dir = std::getenv("AGENTBOX_BIN_DIR")) return dir;
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "bin").string();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string status_field(const std::string& pid, const std::string& key) {
  std::istringstream in(slurp("/proc/" + pid + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return line.substr(key.size() + 2);
  }
  return "";
}

// Host processes (not zombies) whose real uid is `uid`.
int count_pids_of_uid(uid_t uid) {
  int n = 0;
  DIR* d = ::opendir("/proc");
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string uids = status_field(e->d_name, "Uid");
    std::string state = status_field(e->d_name, "State");
    if (uids.empty() || state.rfind("Z", 0) == 0) continue;
    if (static_cast<uid_t>(std::stoul(uids)) == uid) ++n;
  }
  ::closedir(d);
  return n;
}

bool host_pid_alive(pid_t pid) {
  std::string state = status_field(std::to_string(pid), "State");
  return !state.empty() && state[0] != 'Z';
}

class ProcessTest : public ::testing::TestWithParam<const char*> {
 protected:
  bool ns() const { return std::string(GetParam()) == "ns"; }

  void SetUp() override {
    char dir[] = "/tmp/agentbox-proctest-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    ASSERT_EQ(::chmod(dir, 0755), 0);
    if (ns()) {
      NsBackendOptions o;
      o.runtime_dir = dir_ + "/run";
      o.init_path = bin_dir() + "/agentbox-init";
      o.cgroup_parent = "agentbox-proctest-" + std::to_string(::getpid());
      auto b = make_ns_backend(o);
      ASSERT_TRUE(b) << b.error().message;
      backend_ = std::move(*b);
    } else {
      backend_ = std::make_unique<HostBackend>();
    }
    ASSERT_TRUE(backend_->check_usable());
    box_ = make_box("a", kUid);
  }

  void TearDown() override {
    for (auto* b : {&box_, &other_}) {
      if (*b) (*b)->shutdown();
    }
    // Let the processes' coroutines see their ends before the boxes go.
    run_until([] { return false; }, 200ms);
    box_.reset();
    other_.reset();
    backend_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::unique_ptr<Sandbox> make_box(const std::string& key, uid_t uid) {
    std::string ws = dir_ + "/ws-" + key;
    fs::create_directories(ws);
    EXPECT_EQ(::chown(ws.c_str(), uid, uid), 0);
    BoxConfig c;
    c.key = key;
    c.workspace_dir = ws;
    c.uid = uid;
    c.gid = uid;
    auto s = backend_->create(std::move(c));
    EXPECT_TRUE(s) << s.error().message;
    return s ? std::move(*s) : nullptr;
  }

  // Runs the io_context until pred() holds or `limit` passes (a safety net against a hang, not
  // a timing assertion).
  bool run_until(const std::function<bool()>& pred, std::chrono::milliseconds limit = 20s) {
    const auto end = Clock::now() + limit;
    while (!pred()) {
      if (Clock::now() > end) return false;
      if (io_.stopped()) io_.restart();
      if (io_.run_one_for(20ms) == 0) std::this_thread::sleep_for(1ms);
    }
    return true;
  }

  template <typename T>
  T await(asio::awaitable<T> a) {
    std::optional<T> out;
    asio::co_spawn(io_, std::move(a), [&out](std::exception_ptr e, T r) {
      if (e) std::rethrow_exception(e);
      out = std::move(r);
    });
    EXPECT_TRUE(run_until([&] { return out.has_value(); }));
    return std::move(*out);
  }

  ProcessTable& procs(Sandbox* s = nullptr) {
    ProcessTable* t = (s ? s : box_.get())->processes();
    AB_CHECK(t != nullptr);
    return *t;
  }

  ProcessInfo start(ProcessSpec spec, ProcessTable::ExitCallback cb = {}) {
    auto r = await(procs().start(std::move(spec), std::move(cb)));
    EXPECT_TRUE(r) << r.error().message;
    return r.value_or(ProcessInfo{});
  }
  ProcessInfo start_sh(std::string command, std::string tag = {}, bool with_stdin = false) {
    ProcessSpec s;
    s.command = std::move(command);
    s.tag = std::move(tag);
    s.stdin_open = with_stdin;
    return start(std::move(s));
  }

  bool wait_ended(const std::string& ref) {
    return run_until([&] {
      auto i = procs().get(ref);
      return i && i->state != ProcessState::kRunning;
    });
  }

  // Everything kept of one stream, from offset 0 (concatenated).
  std::string stream_text(const std::string& ref, OutputRecord::Type type) {
    auto b = procs().output(ref, 0, 64 << 20);
    EXPECT_TRUE(b);
    std::string out;
    for (const auto& r : b->records) {
      if (r.type == type) out += r.data;
    }
    return out;
  }

  // Follows until the kept output contains `needle`.
  bool wait_output(const std::string& ref, const std::string& needle, OutputRecord::Type type) {
    return run_until([&] { return stream_text(ref, type).find(needle) != std::string::npos; });
  }

  static constexpr uid_t kUid = 43101;
  std::string dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Sandbox> box_;
  std::unique_ptr<Sandbox> other_;
  asio::io_context io_;
};

INSTANTIATE_TEST_SUITE_P(Backends, ProcessTest, ::testing::Values("host", "ns"),
                         [](const auto& info) { return std::string(info.param); });

TEST_P(ProcessTest, StartListAndGetByTagAndPid) {
  ProcessInfo p = start_sh("echo hello; echo oops >&2; exit 7", "job-1");
  EXPECT_GT(p.pid, 0);
  EXPECT_EQ(p.tag, "job-1");
  EXPECT_EQ(p.command, "echo hello; echo oops >&2; exit 7");
  ASSERT_TRUE(wait_ended("job-1"));

  auto by_tag = procs().get("job-1");
  ASSERT_TRUE(by_tag);
  EXPECT_EQ(by_tag->state, ProcessState::kExited);
  EXPECT_EQ(by_tag->exit_code, 7);
  EXPECT_FALSE(by_tag->signal);
  EXPECT_TRUE(by_tag->ended_at);
  auto by_pid = procs().get(std::to_string(p.pid));
  ASSERT_TRUE(by_pid);
  EXPECT_EQ(by_pid->tag, "job-1");
  auto all = procs().list();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].pid, p.pid);

  // Both streams, offsets contiguous across them, then the exit record at the end.
  auto b = procs().output("job-1", std::nullopt);
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->ended);
  std::uint64_t at = 0;
  std::string out, err;
  for (const auto& r : b->records) {
    EXPECT_EQ(r.offset, at);
    if (r.type == OutputRecord::Type::kStdout) out += r.data;
    if (r.type == OutputRecord::Type::kStderr) err += r.data;
    if (r.type == OutputRecord::Type::kExit) {
      EXPECT_EQ(r.exit_code, 7);
    }
    at += r.data.size();
  }
  EXPECT_EQ(out, "hello\n");
  EXPECT_EQ(err, "oops\n");
  EXPECT_EQ(b->records.back().type, OutputRecord::Type::kExit);
  EXPECT_EQ(b->next, 11u);

  EXPECT_EQ(procs().get("nope").error().code, Code::kNotFound);
  EXPECT_EQ(procs().get("999999").error().code, Code::kNotFound);
}

TEST_P(ProcessTest, TagsAreUniqueAmongLiveProcessesAndValidated) {
  start_sh("sleep 1000", "web");
  auto dup = await(procs().start(ProcessSpec{.command = "true", .tag = "web"}));
  ASSERT_FALSE(dup);
  EXPECT_EQ(dup.error().code, Code::kExists);
  for (const char* bad : {"123", "a b", "../x"}) {
    auto r = await(procs().start(ProcessSpec{.command = "true", .tag = bad}));
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, Code::kInvalid) << bad;
  }
  auto none = await(procs().start(ProcessSpec{}));
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Code::kInvalid);
  ASSERT_TRUE(procs().kill("web"));
  ASSERT_TRUE(wait_ended("web"));
  // Ended: the tag is free again, and the pid-less lookup finds the live one.
  ProcessInfo again = start_sh("sleep 1000", "web");
  auto got = procs().get("web");
  ASSERT_TRUE(got);
  EXPECT_EQ(got->pid, again.pid);
  EXPECT_EQ(got->state, ProcessState::kRunning);
}

TEST_P(ProcessTest, OutputOffsetsResumeWithSince) {
  start_sh("i=0; while [ $i -lt 3000 ]; do echo line$i; i=$((i+1)); done", "lines");
  ASSERT_TRUE(wait_ended("lines"));
  std::string expected;
  for (int i = 0; i < 3000; ++i) expected += "line" + std::to_string(i) + "\n";

  // Small batches, each resuming where the last one stopped: all of it, once, in order.
  std::string got;
  std::uint64_t since = 0;
  for (;;) {
    auto b = procs().output("lines", since, 1000);
    ASSERT_TRUE(b);
    for (const auto& r : b->records) {
      if (r.type == OutputRecord::Type::kExit) continue;
      EXPECT_EQ(r.offset, got.size());
      got += r.data;
    }
    since = b->next;
    if (b->ended) break;
  }
  EXPECT_EQ(got, expected);
  // A reader that resumes in the middle of a record gets exactly the rest.
  auto mid = procs().output("lines", 12345, 1 << 20);
  ASSERT_TRUE(mid);
  ASSERT_FALSE(mid->records.empty());
  EXPECT_EQ(mid->records.front().offset, 12345u);
  EXPECT_EQ(mid->records.front().data, expected.substr(12345, mid->records.front().data.size()));
}

TEST_P(ProcessTest, FloodKeepsOnlyTheLastMegabyte) {
  start_sh("head -c 20000000 /dev/zero", "flood");
  ASSERT_TRUE(wait_ended("flood"));
  auto b = procs().output("flood", std::nullopt, 64 << 20);
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->ended);
  std::size_t kept = 0;
  for (const auto& r : b->records) kept += r.data.size();
  EXPECT_GE(kept, OutputRing::kDefaultCap);
  EXPECT_LE(kept, OutputRing::kDefaultCap + OutputRing::kCoalesceBytes);
  EXPECT_EQ(b->records.back().offset, 20000000u);
  EXPECT_EQ(b->records.front().offset, 20000000u - kept);
  // since=0 is older than what is kept: the reply starts at the oldest byte kept.
  auto old = procs().output("flood", 0, 1 << 20);
  ASSERT_TRUE(old);
  EXPECT_EQ(old->records.front().offset, 20000000u - kept);
}

TEST_P(ProcessTest, EchoServerOverStdinWithFollow) {
  // An MCP stdio server in miniature: one line in, one line out.
  start_sh("while read l; do echo \"$l\"; done", "mcp", /*with_stdin=*/true);
  ASSERT_TRUE(procs().write_stdin("mcp", "{\"id\":1}\n"));
  auto first = await(procs().follow("mcp", 0));
  ASSERT_TRUE(first);
  ASSERT_EQ(first->records.size(), 1u);
  EXPECT_EQ(first->records[0].data, "{\"id\":1}\n");
  EXPECT_EQ(first->records[0].offset, 0u);

  ASSERT_TRUE(procs().write_stdin("mcp", "{\"id\":2}\n"));
  auto second = await(procs().follow("mcp", first->next));
  ASSERT_TRUE(second);
  ASSERT_EQ(second->records.size(), 1u);
  EXPECT_EQ(second->records[0].data, "{\"id\":2}\n");
  EXPECT_EQ(second->records[0].offset, 9u);
  // A follower that reconnects with since=N: nothing lost, nothing twice.
  auto again = await(procs().follow("mcp", 4));
  ASSERT_TRUE(again);
  std::string rest;
  for (const auto& r : again->records) rest += r.data;
  EXPECT_EQ(rest, "\":1}\n{\"id\":2}\n");

  ASSERT_TRUE(procs().write_stdin("mcp", "", /*close=*/true));
  auto end = await(procs().follow("mcp", second->next));
  ASSERT_TRUE(end);
  ASSERT_TRUE(end->ended);
  EXPECT_EQ(end->records.back().type, OutputRecord::Type::kExit);
  EXPECT_EQ(end->records.back().exit_code, 0);

  // Ended: stdin is refused (HTTP 409).
  auto late = procs().write_stdin("mcp", "x\n");
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, Code::kExists);
}

TEST_P(ProcessTest, StdinOnlyWhenAskedFor) {
  start_sh("sleep 1000", "nostdin");
  auto r = procs().write_stdin("nostdin", "x");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalid);
}

TEST_P(ProcessTest, SignalsReachTheProcess) {
  start_sh("trap 'echo got-usr1; exit 3' USR1; echo ready; while :; do sleep 0.05; done", "trap");
  ASSERT_TRUE(wait_output("trap", "ready", OutputRecord::Type::kStdout));
  ASSERT_TRUE(procs().signal("trap", SIGUSR1));
  ASSERT_TRUE(wait_ended("trap"));
  EXPECT_EQ(procs().get("trap")->exit_code, 3);
  EXPECT_NE(stream_text("trap", OutputRecord::Type::kStdout).find("got-usr1"), std::string::npos);

  ProcessInfo p = start(ProcessSpec{.argv = {"sleep", "1000"}, .tag = "term"});
  ASSERT_TRUE(procs().signal(std::to_string(p.pid), SIGTERM));
  ASSERT_TRUE(wait_ended("term"));
  auto term = procs().get("term");
  EXPECT_EQ(term->state, ProcessState::kKilled);
  EXPECT_EQ(term->signal, SIGTERM);
  EXPECT_EQ(term->exit_code, 128 + SIGTERM);

  auto ended = procs().signal("term", SIGTERM);
  ASSERT_FALSE(ended);
  EXPECT_EQ(ended.error().code, Code::kExists);
  EXPECT_EQ(parse_signal("SIGSTOP"), std::nullopt);
  EXPECT_EQ(parse_signal("TERM"), SIGTERM);
  EXPECT_EQ(parse_signal("SIGUSR2"), SIGUSR2);
}

TEST_P(ProcessTest, KillTakesTheWholeTree) {
  // A child that forks a grandchild (on ns also one that left the process group).
  std::string cmd = ns() ? "sleep 1000 & setsid sleep 1001 & echo $!; wait"
                         : "sleep 1000 & echo $!; wait";
  std::optional<std::pair<ProcessInfo, bool>> exit_seen;
  start(ProcessSpec{.command = cmd, .tag = "tree"},
        [&exit_seen](const ProcessInfo& i, const ProcessEnd& end) {
          exit_seen.emplace(i, end.requested);
        });
  ASSERT_TRUE(run_until([&] { return !stream_text("tree", OutputRecord::Type::kStdout).empty(); }));
  const pid_t grandchild = std::atoi(stream_text("tree", OutputRecord::Type::kStdout).c_str());
  ASSERT_TRUE(procs().kill("tree"));
  ASSERT_TRUE(wait_ended("tree"));
  EXPECT_EQ(procs().get("tree")->state, ProcessState::kKilled);
  ASSERT_TRUE(run_until([&] { return exit_seen.has_value(); }));
  EXPECT_TRUE(exit_seen->second) << "a kill() is a requested end";
  if (ns()) {
    EXPECT_TRUE(run_until([&] { return count_pids_of_uid(kUid) == 0; }));
  } else {
    EXPECT_TRUE(run_until([&] { return !host_pid_alive(grandchild); }));
  }
}

TEST_P(ProcessTest, EndOfLeaderEndsItsTreeAndReportsUnrequested) {
  std::optional<bool> requested;
  start(ProcessSpec{.command = "sleep 1000 & exit 0", .tag = "leaver"},
        [&requested](const ProcessInfo&, const ProcessEnd& end) { requested = end.requested; });
  ASSERT_TRUE(wait_ended("leaver"));
  ASSERT_TRUE(run_until([&] { return requested.has_value(); }));
  EXPECT_FALSE(*requested);
  if (ns()) {
    EXPECT_TRUE(run_until([&] { return count_pids_of_uid(kUid) == 0; }));
  }
}

TEST_P(ProcessTest, PtyIsTheControllingTerminalAndResizes) {
  ProcessSpec spec;
  spec.command = "tty; stty size; read x; stty size; read y";
  spec.tag = "term";
  spec.pty = PtySize{80, 24};
  start(std::move(spec));
  ASSERT_TRUE(wait_output("term", "24 80", OutputRecord::Type::kPty));
  std::string text = stream_text("term", OutputRecord::Type::kPty);
  EXPECT_NE(text.find("/dev/pts/"), std::string::npos) << text;
  ASSERT_TRUE(procs().resize("term", PtySize{100, 30}));
  ASSERT_TRUE(procs().write_stdin("term", "\n"));
  ASSERT_TRUE(wait_output("term", "30 100", OutputRecord::Type::kPty));
  EXPECT_EQ(procs().get("term")->pty->cols, 100);
  ASSERT_TRUE(procs().write_stdin("term", "", /*close=*/true));  // ^D ends the last read
  ASSERT_TRUE(wait_ended("term"));

  start_sh("sleep 1000", "plain");
  auto r = procs().resize("plain", PtySize{100, 30});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalid);
  auto zero = await(procs().start(ProcessSpec{.command = "true", .pty = PtySize{0, 24}}));
  ASSERT_FALSE(zero);
  EXPECT_EQ(zero.error().code, Code::kInvalid);
}

TEST_P(ProcessTest, OneAttacherAtATime) {
  start_sh("sleep 1000", "att");
  auto first = procs().attach("att");
  ASSERT_TRUE(first);
  auto second = procs().attach("att");
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, Code::kExists);
  *first = AttachLease();  // the first attacher leaves
  EXPECT_TRUE(procs().attach("att"));
}

TEST_P(ProcessTest, ShutdownEndsEveryProcessAndLeavesNothing) {
  start_sh("sleep 1000", "s1");
  start_sh("sleep 1000 & sleep 1001", "s2");
  box_->shutdown();
  ASSERT_TRUE(wait_ended("s1"));
  ASSERT_TRUE(wait_ended("s2"));
  EXPECT_EQ(procs().get("s1")->state, ProcessState::kKilled);
  auto after = await(procs().start(ProcessSpec{.command = "true"}));
  ASSERT_FALSE(after);
  EXPECT_EQ(after.error().code, Code::kUnavailable);
  if (ns()) {
    EXPECT_TRUE(run_until([&] { return count_pids_of_uid(kUid) == 0; }));
  }
}

// Isolation between sessions: the ns backend only (the host backend has none, by design).
class NsProcessTest : public ProcessTest {};
INSTANTIATE_TEST_SUITE_P(Backends, NsProcessTest, ::testing::Values("ns"),
                         [](const auto& info) { return std::string(info.param); });

// SECURITY.md T10: a process of one session cannot signal another session's processes.
TEST_P(NsProcessTest, AnotherSessionCannotSignalOurProcesses) {
  other_ = make_box("b", kUid + 1);
  ASSERT_TRUE(other_);
  ProcessInfo victim = start_sh("sleep 1000", "victim");
  ProcessSpec attack;
  attack.command = "kill -KILL " + std::to_string(victim.pid) + " -1 2>/dev/null; echo done";
  attack.tag = "attack";
  auto a = await(procs(other_.get()).start(std::move(attack)));
  ASSERT_TRUE(a) << a.error().message;
  ASSERT_TRUE(run_until([&] {
    auto i = procs(other_.get()).get("attack");
    return i && i->state != ProcessState::kRunning;
  }));
  run_until([] { return false; }, 100ms);
  auto v = procs().get("victim");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->state, ProcessState::kRunning);
}

}  // namespace
}  // namespace agentbox::sandbox
