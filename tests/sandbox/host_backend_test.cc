// The host backend end to end: real commands, real files, through the Sandbox interface.

#include "sandbox/host_backend.h"
#include "support/support.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace agentbox::sandbox {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using testing::slurp;

// Gone, or a zombie nobody reaped yet (our pid 1 may not reap orphans).
bool process_dead(pid_t pid) {
  if (::kill(pid, 0) < 0 && errno == ESRCH) return true;
  std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  auto close_paren = stat.rfind(')');
  return close_paren == std::string::npos ||
         (close_paren + 2 < stat.size() && stat[close_paren + 2] == 'Z');
}

bool wait_dead(pid_t pid, std::chrono::seconds limit) {
  auto until = Clock::now() + limit;
  while (Clock::now() < until && !process_dead(pid)) std::this_thread::sleep_for(20ms);
  return process_dead(pid);
}

class HostBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "host-backend-XXXXXX").string();
    ws_ = fs::canonical(::mkdtemp(tmpl.data())).string();
    HostBackend backend;
    ASSERT_EQ(backend.name(), "host");
    ASSERT_TRUE(backend.check_usable().has_value());
    auto box =
        backend.create(BoxConfig{.key = "t", .workspace_dir = ws_, .env = {{"BOX_VAR", "box"}}});
    ASSERT_TRUE(box.has_value()) << box.error().message;
    box_ = std::move(*box);
  }
  void TearDown() override {
    box_.reset();
    fs::remove_all(ws_);
  }

  Result<ExecResult> exec(ExecSpec spec, OutputSink* sink = nullptr) {
    asio::io_context io;
    auto fut = asio::co_spawn(io, box_->exec(std::move(spec), sink), asio::use_future);
    io.run();
    return fut.get();
  }
  ExecResult sh(const std::string& command, std::string cwd = {}) {
    auto r = exec(ExecSpec{.command = command, .cwd = std::move(cwd)});
    EXPECT_TRUE(r.has_value()) << r.error().message;
    return r.value_or(ExecResult{});
  }

  std::string ws_;
  std::unique_ptr<Sandbox> box_;
};

TEST_F(HostBackendTest, WorkspaceIsTheHostPath) {
  EXPECT_EQ(box_->name(), "host");
  EXPECT_EQ(box_->workspace(), ws_);
  EXPECT_FALSE(box_->uid().has_value());
}

TEST_F(HostBackendTest, RejectsARelativeOrMissingWorkspace) {
  HostBackend backend;
  EXPECT_EQ(backend.create(BoxConfig{.workspace_dir = "relative/dir"}).error().code,
            Code::kInvalid);
  EXPECT_EQ(backend.create(BoxConfig{.workspace_dir = ws_ + "/missing"}).error().code,
            Code::kNotFound);
}

TEST_F(HostBackendTest, CommandRunsInTheWorkspaceByDefault) {
  ExecResult r = sh("pwd -P; echo \"$HOME\"");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stdout_data, ws_ + "\n" + ws_ + "\n");
}

TEST_F(HostBackendTest, ArgvRunsWithoutAShell) {
  auto r = exec(ExecSpec{.argv = {"echo", "$HOME", "a b"}});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->stdout_data, "$HOME a b\n");
}

TEST_F(HostBackendTest, NeitherArgvNorCommandIsInvalid) {
  auto r = exec(ExecSpec{});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kInvalid);
  auto r2 = exec(ExecSpec{.argv = {""}});
  ASSERT_FALSE(r2.has_value());
  EXPECT_EQ(r2.error().code, Code::kInvalid);
}

TEST_F(HostBackendTest, MissingBinaryIs127NotAnError) {
  auto r = exec(ExecSpec{.argv = {"agentbox-no-such-tool"}});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->exit_code, 127);
  EXPECT_NE(r->stderr_data.find("command not found"), std::string::npos);
  EXPECT_EQ(sh("agentbox-no-such-tool").exit_code, 127);
}

TEST_F(HostBackendTest, CwdAcceptsAliasHostPathAndRelative) {
  fs::create_directories(ws_ + "/sub/dir");
  const std::string want = ws_ + "/sub/dir\n";
  EXPECT_EQ(sh("pwd -P", "/workspace/sub/dir").stdout_data, want);
  EXPECT_EQ(sh("pwd -P", ws_ + "/sub/dir").stdout_data, want);
  EXPECT_EQ(sh("pwd -P", "sub/dir").stdout_data, want);
}

TEST_F(HostBackendTest, BadCwdIsAnErrorNamingIt) {
  auto missing = exec(ExecSpec{.command = "pwd", .cwd = "/workspace/nope"});
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, Code::kNotFound);
  EXPECT_NE(missing.error().message.find("nope"), std::string::npos) << missing.error().message;

  auto outside = exec(ExecSpec{.command = "pwd", .cwd = "/etc"});
  ASSERT_FALSE(outside.has_value());
  EXPECT_EQ(outside.error().code, Code::kAccess);

  auto escape = exec(ExecSpec{.command = "pwd", .cwd = "/workspace/.."});
  ASSERT_FALSE(escape.has_value());
  EXPECT_EQ(escape.error().code, Code::kAccess);

  std::ofstream(ws_ + "/file") << "x";
  auto file = exec(ExecSpec{.command = "pwd", .cwd = "file"});
  ASSERT_FALSE(file.has_value());
  EXPECT_EQ(file.error().code, Code::kNotDir);

  fs::create_directory_symlink("/etc", ws_ + "/etc-link");
  auto link = exec(ExecSpec{.command = "pwd", .cwd = "etc-link"});
  ASSERT_FALSE(link.has_value());
  EXPECT_EQ(link.error().code, Code::kAccess);
}

TEST_F(HostBackendTest, EnvironmentLayersBaseBoxAndSpec) {
  auto r = exec(ExecSpec{.command = "echo $PATH; echo $LANG; echo $BOX_VAR; echo $MINE",
                         .env = {{"MINE", "spec"}}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->stdout_data, "/usr/local/bin:/usr/bin:/bin\nC.UTF-8\nbox\nspec\n");

  auto over = exec(ExecSpec{.command = "echo $BOX_VAR", .env = {{"BOX_VAR", "overridden"}}});
  ASSERT_TRUE(over.has_value());
  EXPECT_EQ(over->stdout_data, "overridden\n");

  auto bad = exec(ExecSpec{.command = "true", .env = {{"A=B", "x"}}});
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, Code::kInvalid);
}

TEST_F(HostBackendTest, StdinAndCapsPassThrough) {
  auto r = exec(ExecSpec{.argv = {"cat"}, .stdin_data = "fed\n"});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->stdout_data, "fed\n");

  auto big = exec(ExecSpec{.command = "head -c 1000000 /dev/zero", .max_output_bytes = 100});
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->stdout_data.size(), 100u);
  EXPECT_TRUE(big->stdout_truncated);
}

TEST_F(HostBackendTest, TimeoutKillsBackgroundChildrenToo) {
  auto r = exec(
      ExecSpec{.command = "echo $$ > pid1; sleep 30 & echo $! > pid2; wait", .timeout = 500ms});
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->timed_out);
  EXPECT_EQ(r->exit_code, -1);
  pid_t p1 = std::stoi(slurp(ws_ + "/pid1"));
  pid_t p2 = std::stoi(slurp(ws_ + "/pid2"));
  EXPECT_TRUE(wait_dead(p1, 5s));
  EXPECT_TRUE(wait_dead(p2, 5s));
}

TEST_F(HostBackendTest, ShutdownKillsLeftoverBackgroundProcesses) {
  auto start = Clock::now();
  ExecResult r = sh("sleep 30 > /dev/null 2>&1 & echo $!");
  EXPECT_LT(Clock::now() - start, 5s);
  pid_t bg = std::stoi(r.stdout_data);
  ASSERT_GT(bg, 0);
  EXPECT_FALSE(process_dead(bg)) << "a finished command's background child lives on";
  box_->shutdown();
  EXPECT_TRUE(wait_dead(bg, 5s));
  box_->shutdown();  // idempotent
  auto after = exec(ExecSpec{.command = "true"});
  ASSERT_FALSE(after.has_value());
  EXPECT_EQ(after.error().code, Code::kUnavailable);
  EXPECT_EQ(box_->stat("/workspace").error().code, Code::kUnavailable);
}

TEST_F(HostBackendTest, ReportsArtifactsWithMimeTypes) {
  std::ofstream(ws_ + "/keep.txt") << "untouched";
  // The artifact dir does not exist before the command: everything in it is new.
  auto r = exec(ExecSpec{
      .command = "mkdir -p out/sub && printf '\\211PNG\\r\\n\\032\\n\\000\\000\\000\\rIHDR"
                 "\\000\\000\\000\\020\\000\\000\\000\\020\\010\\006\\000\\000\\000' > out/cat.png"
                 " && echo hello > out/sub/note.txt",
      .artifact_dir = "/workspace/out"});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ASSERT_EQ(r->exit_code, 0) << r->stderr_data;
  ASSERT_EQ(r->artifacts.size(), 2u);
  EXPECT_EQ(r->artifacts[0].path, "/workspace/out/cat.png");
  EXPECT_EQ(r->artifacts[0].mime_type, "image/png");
  EXPECT_EQ(r->artifacts[0].size, 29u);
  EXPECT_EQ(r->artifacts[1].path, "/workspace/out/sub/note.txt");
  EXPECT_EQ(r->artifacts[1].mime_type, "text/plain");
  EXPECT_EQ(r->artifacts[1].size, 6u);

  // Second run: only what changed.
  auto r2 = exec(ExecSpec{.command = "echo more >> out/sub/note.txt; echo new > out/new.txt",
                          .artifact_dir = ws_ + "/out"});
  ASSERT_TRUE(r2.has_value());
  ASSERT_EQ(r2->artifacts.size(), 2u);
  EXPECT_EQ(r2->artifacts[0].path, ws_ + "/out/new.txt");
  EXPECT_EQ(r2->artifacts[1].path, ws_ + "/out/sub/note.txt");

  // No artifact dir, no artifacts; an artifact dir outside the workspace is refused.
  EXPECT_TRUE(sh("echo x > out/another.txt").artifacts.empty());
  auto bad = exec(ExecSpec{.command = "true", .artifact_dir = "/etc"});
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, Code::kAccess);
}

TEST_F(HostBackendTest, FileOpsMapAliasAndHostPaths) {
  ASSERT_TRUE(box_->write_file("/workspace/a.txt", "alias", {}).has_value());
  EXPECT_EQ(slurp(ws_ + "/a.txt"), "alias");
  auto via_host = box_->read_file(ws_ + "/a.txt", 1 << 20);
  ASSERT_TRUE(via_host.has_value()) << via_host.error().message;
  EXPECT_EQ(*via_host, "alias");
  auto relative = box_->read_file("a.txt", 1 << 20);
  ASSERT_TRUE(relative.has_value());
  EXPECT_EQ(*relative, "alias");

  auto st = box_->stat("/workspace//a.txt");
  ASSERT_TRUE(st.has_value()) << st.error().message;
  EXPECT_EQ(st->path, "/workspace/a.txt");
  EXPECT_EQ(st->name, "a.txt");
  EXPECT_EQ(st->size, 5u);
  EXPECT_FALSE(st->is_dir);
  auto st_host = box_->stat(ws_ + "/a.txt");
  ASSERT_TRUE(st_host.has_value());
  EXPECT_EQ(st_host->path, ws_ + "/a.txt");
  auto root = box_->stat("/workspace");
  ASSERT_TRUE(root.has_value());
  EXPECT_TRUE(root->is_dir);

  ASSERT_TRUE(box_->mkdir_all("/workspace/d/e").has_value());
  ASSERT_TRUE(box_->rename("/workspace/a.txt", ws_ + "/d/e/b.txt").has_value());
  auto entries = box_->read_dir("d/e");
  ASSERT_TRUE(entries.has_value());
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].name, "b.txt");

  auto busy = box_->remove("/workspace/d");
  ASSERT_FALSE(busy.has_value());
  EXPECT_EQ(busy.error().code, Code::kNotEmpty);
  ASSERT_TRUE(box_->remove_all("/workspace/d").has_value());
  EXPECT_FALSE(fs::exists(ws_ + "/d"));
}

TEST_F(HostBackendTest, FileOpsCannotLeaveTheWorkspace) {
  EXPECT_EQ(box_->read_file("/etc/passwd", 1 << 20).error().code, Code::kAccess);
  EXPECT_EQ(box_->read_file("/workspace/../../etc/passwd", 1 << 20).error().code, Code::kAccess);
  EXPECT_EQ(box_->read_file("../x", 1 << 20).error().code, Code::kAccess);
  EXPECT_EQ(box_->write_file("/tmp/agentbox-escape", "x", {}).error().code, Code::kAccess);
  EXPECT_FALSE(fs::exists("/tmp/agentbox-escape"));
  // A sibling whose name extends the workspace's is not inside it.
  EXPECT_EQ(box_->stat(ws_ + "2/x").error().code, Code::kAccess);
  // A symlink pointing out is not followed out.
  fs::create_symlink("/etc/passwd", ws_ + "/pw");
  EXPECT_EQ(box_->read_file("/workspace/pw", 1 << 20).error().code, Code::kAccess);
}

TEST_F(HostBackendTest, WorkspaceRootCannotBeRemoved) {
  EXPECT_EQ(box_->remove("/workspace").error().code, Code::kAccess);
  EXPECT_EQ(box_->remove_all("/workspace").error().code, Code::kAccess);
  EXPECT_EQ(box_->remove_all(ws_).error().code, Code::kAccess);
  EXPECT_EQ(box_->remove_all("/workspace/").error().code, Code::kAccess);
  EXPECT_TRUE(fs::is_directory(ws_));
}

}  // namespace
}  // namespace agentbox::sandbox
