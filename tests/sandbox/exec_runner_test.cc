// The exec runner with real processes and real pipes (started by launch_host_process).

#include "sandbox/exec_runner.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "sandbox/host_exec.h"
#include "support/support.h"

namespace agentbox::sandbox {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using testing::process_dead;
using testing::slurp;
using testing::TempDir;
using testing::wait_dead;

pid_t read_pid(const std::string& path) {
  std::string s = slurp(path);
  return s.empty() ? 0 : static_cast<pid_t>(std::stol(s));
}

int thread_count() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

LaunchSpec spec_for(std::vector<std::string> argv, std::string cwd = {}) {
  LaunchSpec s;
  s.argv = std::move(argv);
  s.cwd = std::move(cwd);
  s.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"};
  return s;
}

asio::awaitable<ExecResult> launch_and_run(LaunchSpec spec, RunOptions opts, OutputSink* sink) {
  spec.with_stdin = !opts.stdin_data.empty();
  // g++ 12: no temporaries with destructors inside co_await expressions; named locals instead.
  asio::any_io_executor ex = co_await asio::this_coro::executor;
  auto p = launch_host_process(ex, std::move(spec));
  if (!p) throw std::runtime_error(p.error().message);
  asio::awaitable<ExecResult> run = run_process(std::move(*p), std::move(opts), sink);
  co_return co_await std::move(run);
}

ExecResult run(LaunchSpec spec, RunOptions opts = {}, OutputSink* sink = nullptr) {
  asio::io_context io;
  auto fut =
      asio::co_spawn(io, launch_and_run(std::move(spec), std::move(opts), sink), asio::use_future);
  io.run();
  return fut.get();
}

ExecResult sh(const std::string& script, RunOptions opts = {}, OutputSink* sink = nullptr) {
  return run(spec_for({"/bin/sh", "-c", script}), std::move(opts), sink);
}

struct Chunk {
  StreamKind kind;
  std::string data;
};

class CollectingSink : public OutputSink {
 public:
  explicit CollectingSink(std::size_t stop_after_chunks = SIZE_MAX)
      : stop_after_(stop_after_chunks) {}
  asio::awaitable<bool> on_output(StreamKind kind, std::string data) override {
    EXPECT_FALSE(in_call_) << "sink called concurrently";
    in_call_ = true;
    // Yield once, as a real network sink would, so overlapping calls would be visible.
    asio::any_io_executor ex = co_await asio::this_coro::executor;
    asio::steady_timer t(ex, 1ms);
    co_await t.async_wait(asio::use_awaitable);
    chunks.push_back(Chunk{kind, std::move(data)});
    in_call_ = false;
    co_return chunks.size() < stop_after_;
  }
  std::string joined(StreamKind kind) const {
    std::string s;
    for (const auto& c : chunks) {
      if (c.kind == kind) s += c.data;
    }
    return s;
  }
  std::vector<Chunk> chunks;

 private:
  std::size_t stop_after_;
  bool in_call_ = false;
};

TEST(ExecRunner, ReportsExitCodeAndBothStreams) {
  ExecResult r = sh("echo hello; echo oops >&2; exit 3");
  EXPECT_EQ(r.stdout_data, "hello\n");
  EXPECT_EQ(r.stderr_data, "oops\n");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_FALSE(r.signal.has_value());
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.killed_by, KilledBy::kNone);  // ended on its own
  EXPECT_FALSE(r.stdout_truncated);
  EXPECT_FALSE(r.stderr_truncated);
}

TEST(ExecRunner, KilledBySignalReports128PlusN) {
  ExecResult r = sh("kill -TERM $$");
  EXPECT_EQ(r.exit_code, 128 + SIGTERM);
  EXPECT_EQ(r.signal, SIGTERM);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.killed_by, KilledBy::kNone);  // a signal it sent itself: no limit stopped it
}

TEST(ExecRunner, MissingBinaryIs127WithMessage) {
  ExecResult r = run(spec_for({"agentbox-no-such-binary"}));
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_NE(r.stderr_data.find("agentbox-no-such-binary: command not found"), std::string::npos)
      << r.stderr_data;

  ExecResult r2 = run(spec_for({"/nonexistent/dir/tool"}));
  EXPECT_EQ(r2.exit_code, 127);
  EXPECT_NE(r2.stderr_data.find("No such file or directory"), std::string::npos) << r2.stderr_data;
}

TEST(ExecRunner, NonExecutableFileIs126) {
  TempDir dir;
  std::string file = dir.path() + "/data.txt";
  std::ofstream(file) << "not a program\n";
  ::chmod(file.c_str(), 0644);
  ExecResult r = run(spec_for({file}));
  EXPECT_EQ(r.exit_code, 126);
  EXPECT_NE(r.stderr_data.find("Permission denied"), std::string::npos) << r.stderr_data;
}

TEST(ExecRunner, ScriptWithoutShebangRunsWithTheShell) {
  TempDir dir;
  std::string file = dir.path() + "/script";
  std::ofstream(file) << "echo via-sh $1\n";
  ::chmod(file.c_str(), 0755);
  ExecResult r = run(spec_for({file, "arg"}));
  EXPECT_EQ(r.exit_code, 0) << r.stderr_data;
  EXPECT_EQ(r.stdout_data, "via-sh arg\n");
}

TEST(ExecRunner, PathLookupUsesTheCommandsOwnPath) {
  TempDir dir;
  std::string tool = dir.path() + "/mytool";
  std::ofstream(tool) << "#!/bin/sh\necho found-in-custom-path\n";
  ::chmod(tool.c_str(), 0755);
  LaunchSpec s = spec_for({"mytool"});
  s.env = {"PATH=/usr/bin:" + dir.path()};
  ExecResult r = run(std::move(s));
  EXPECT_EQ(r.exit_code, 0) << r.stderr_data;
  EXPECT_EQ(r.stdout_data, "found-in-custom-path\n");
}

TEST(ExecRunner, FeedsStdinThenClosesIt) {
  std::string input("line one\n\0binary\xff\n", 19);
  ExecResult r = run(spec_for({"cat"}), RunOptions{.stdin_data = input});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stdout_data, input);

  // Without stdin data the command reads EOF at once instead of hanging.
  ExecResult r2 = run(spec_for({"cat"}), RunOptions{.timeout = 10s});
  EXPECT_FALSE(r2.timed_out);
  EXPECT_EQ(r2.stdout_data, "");
}

TEST(ExecRunner, LargeStdinIsWrittenInPieces) {
  std::string input(3 * 1024 * 1024 + 7, 'x');
  ExecResult r = run(spec_for({"wc", "-c"}), RunOptions{.stdin_data = input});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stdout_data, std::to_string(input.size()) + "\n");
}

TEST(ExecRunner, CommandClosingStdinEarlyIsFine) {
  // head exits after one byte; the rest of our write meets EPIPE, which must not SIGPIPE us.
  std::string input(8 * 1024 * 1024, 'y');
  ExecResult r = run(spec_for({"head", "-c", "1"}), RunOptions{.stdin_data = input});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stdout_data, "y");
}

TEST(ExecRunner, PassesEnvironmentAndCwd) {
  TempDir dir;
  LaunchSpec s = spec_for({"/bin/sh", "-c", "echo \"$GREETING\"; pwd -P"}, dir.path());
  s.env.push_back("GREETING=hello world");
  ExecResult r = run(std::move(s));
  std::string real = std::filesystem::canonical(dir.path()).string();
  EXPECT_EQ(r.stdout_data, "hello world\n" + real + "\n");
}

TEST(ExecRunner, LargeOutputIsCappedAndDoesNotBlockTheCommand) {
  auto start = Clock::now();
  // 10 MB on stdout, a little on stderr after it: the command only gets to stderr and exits if
  // we keep draining stdout past the cap.
  ExecResult r = sh("head -c 10000000 /dev/zero; echo done >&2",
                    RunOptions{.timeout = 60s, .max_output_bytes = 65536});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.stdout_data.size(), 65536u);
  EXPECT_TRUE(r.stdout_truncated);
  EXPECT_EQ(r.stderr_data, "done\n");
  EXPECT_FALSE(r.stderr_truncated);
  EXPECT_LT(Clock::now() - start, 30s);
}

TEST(ExecRunner, OutputExactlyAtTheCapIsNotTruncated) {
  ExecResult r = sh("printf 0123456789", RunOptions{.max_output_bytes = 10});
  EXPECT_EQ(r.stdout_data, "0123456789");
  EXPECT_FALSE(r.stdout_truncated);
  ExecResult r2 = sh("printf 0123456789x", RunOptions{.max_output_bytes = 10});
  EXPECT_EQ(r2.stdout_data, "0123456789");
  EXPECT_TRUE(r2.stdout_truncated);
}

TEST(ExecRunner, NonUtf8BytesSurviveRaw) {
  ExecResult r = sh("printf '\\377\\376\\000abc\\200'");
  EXPECT_EQ(r.stdout_data, std::string("\xff\xfe\0abc\x80", 7));
}

TEST(ExecRunner, TimeoutKillsTheWholeProcessGroup) {
  TempDir dir;
  auto start = Clock::now();
  ExecResult r = run(
      spec_for({"/bin/sh", "-c", "echo $$ > pid1; sleep 30 & echo $! > pid2; wait"}, dir.path()),
      RunOptions{.timeout = 500ms});
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.killed_by, KilledBy::kTimeout);
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_GE(r.duration, 400ms);
  pid_t shell = read_pid(dir.path() + "/pid1");
  pid_t sleeper = read_pid(dir.path() + "/pid2");
  ASSERT_GT(shell, 0);
  ASSERT_GT(sleeper, 0);
  EXPECT_TRUE(wait_dead(shell, 5s));
  EXPECT_TRUE(wait_dead(sleeper, 5s)) << "the background sleep survived the timeout";
}

TEST(ExecRunner, BackgroundChildHoldingStdoutDoesNotDelayTheReply) {
  TempDir dir;
  auto start = Clock::now();
  ExecResult r = run(spec_for({"/bin/sh", "-c", "sleep 5 & echo $! > bg; echo done"}, dir.path()),
                     RunOptions{.timeout = 30s});
  auto took = Clock::now() - start;
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stdout_data, "done\n");
  EXPECT_FALSE(r.timed_out);
  EXPECT_LT(took, 3s) << "waited for the background child's EOF";
  pid_t bg = read_pid(dir.path() + "/bg");
  if (bg > 0) ::kill(bg, SIGKILL);
}

TEST(ExecRunner, DurationIsMeasured) {
  ExecResult r = sh("sleep 0.3");
  EXPECT_GE(r.duration, 250ms);
  EXPECT_LT(r.duration, 10s);
}

TEST(ExecRunner, StreamsChunksInOrderToTheSink) {
  CollectingSink sink;
  ExecResult r =
      sh("for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; sleep 0.05; done", {}, &sink);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stdout_data, "");  // went to the sink
  EXPECT_EQ(r.stderr_data, "");
  EXPECT_EQ(sink.joined(StreamKind::kStdout), "out1\nout2\nout3\nout4\nout5\n");
  EXPECT_EQ(sink.joined(StreamKind::kStderr), "err1\nerr2\nerr3\nerr4\nerr5\n");
  EXPECT_GE(sink.chunks.size(), 5u);  // streamed as produced, not in one piece at the end
}

TEST(ExecRunner, SinkCapAppliesToForwardedBytes) {
  CollectingSink sink;
  ExecResult r = sh("head -c 100000 /dev/zero", RunOptions{.max_output_bytes = 1000}, &sink);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(sink.joined(StreamKind::kStdout).size(), 1000u);
  EXPECT_TRUE(r.stdout_truncated);
}

TEST(ExecRunner, SinkReturningFalseKillsTheCommand) {
  TempDir dir;
  CollectingSink sink(/*stop_after_chunks=*/1);
  auto start = Clock::now();
  ExecResult r = run(spec_for({"/bin/sh", "-c", "echo $$ > pid; echo start; sleep 30"}, dir.path()),
                     RunOptions{.timeout = 60s}, &sink);
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_EQ(sink.chunks.size(), 1u);
  pid_t shell = read_pid(dir.path() + "/pid");
  ASSERT_GT(shell, 0);
  EXPECT_TRUE(wait_dead(shell, 5s));
}

TEST(ExecRunner, HundredConcurrentExecsShareOneThread) {
  asio::io_context io;
  constexpr int kExecs = 100;
  std::vector<std::future<ExecResult>> results;
  for (int i = 0; i < kExecs; ++i) {
    results.push_back(asio::co_spawn(
        io,
        launch_and_run(spec_for({"/bin/sh", "-c", "sleep 1; echo " + std::to_string(i)}),
                       RunOptions{.timeout = 60s}, nullptr),
        asio::use_future));
  }
  // Sample the thread count while all of them are running.
  int threads_mid_run = -1;
  asio::steady_timer probe(io, 500ms);
  probe.async_wait([&](boost::system::error_code) { threads_mid_run = thread_count(); });
  auto start = Clock::now();
  io.run();
  auto took = Clock::now() - start;
  for (int i = 0; i < kExecs; ++i) {
    ExecResult r = results[i].get();
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_EQ(r.stdout_data, std::to_string(i) + "\n");
  }
  EXPECT_LT(took, 20s);
  EXPECT_GT(threads_mid_run, 0);
  EXPECT_LE(threads_mid_run, 4) << "execs must not take a thread each";
}

TEST(ExecRunner, WorksOnAMultiThreadedIoContext) {
  asio::io_context io;
  constexpr int kExecs = 30;
  std::vector<std::future<ExecResult>> results;
  std::vector<std::unique_ptr<CollectingSink>> sinks;
  for (int i = 0; i < kExecs; ++i) {
    // Every other one streams, so sinks and plain runs mix across threads.
    sinks.push_back(std::make_unique<CollectingSink>());
    OutputSink* sink = i % 2 == 0 ? sinks.back().get() : nullptr;
    results.push_back(asio::co_spawn(
        io,
        launch_and_run(spec_for({"/bin/sh", "-c", "echo a" + std::to_string(i) + "; echo b >&2"}),
                       RunOptions{.timeout = 60s, .stdin_data = "in"}, sink),
        asio::use_future));
  }
  std::thread other([&io] { io.run(); });
  io.run();
  other.join();
  for (int i = 0; i < kExecs; ++i) {
    ExecResult r = results[i].get();
    EXPECT_EQ(r.exit_code, 0);
    std::string out = i % 2 == 0 ? sinks[i]->joined(StreamKind::kStdout) : r.stdout_data;
    EXPECT_EQ(out, "a" + std::to_string(i) + "\n");
  }
}

}  // namespace
}  // namespace agentbox::sandbox
