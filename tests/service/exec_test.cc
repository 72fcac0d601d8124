// service::Exec: one "exec" event per command that ran (what ran, how it ended; never its stdin,
// env or output), the artifact_dir rule, the caller leaving.

#include "service/exec.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "service_fixture.h"

namespace agentbox::service {
namespace {

asio::awaitable<void> never() {
  asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::hours(1));
  co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
}

asio::awaitable<void> now(bool* gone) {
  *gone = true;
  co_return;
}

TEST_F(ServiceTest, ExecCreatesTheSessionRunsAndEmitsOneEventWithoutStdinOrEnv) {
  bool gone = false;
  sandbox::ExecSpec spec;
  spec.command = "echo hi";
  spec.stdin_data = "a secret on stdin";
  spec.env = {{"TOKEN", "a secret in env"}};
  auto r = run(services_->exec.run(as("t1"), "s1", spec, nullptr, StopSignal{never(), &gone}));
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(*r) << r->error().message;
  // The session was made by the exec (exec routes create), as tenant t1's.
  auto info = manager_->get("s1", session::Caller("t1", false, 0));
  ASSERT_TRUE(info) << info.error().message;
  // The box got the command with its stdin and env.
  auto execs = fake_box("s1")->execs();
  ASSERT_EQ(execs.size(), 1u);
  EXPECT_EQ(execs[0].stdin_data, "a secret on stdin");
  EXPECT_EQ(execs[0].env.at("TOKEN"), "a secret in env");
  // One event, naming what ran, without the secrets.
  ASSERT_EQ(events_.size(), 1u);
  const SeenEvent& ev = events_[0];
  EXPECT_EQ(ev.op, "exec");
  EXPECT_EQ(ev.tenant, "t1");
  EXPECT_EQ(ev.session, "s1");
  EXPECT_TRUE(ev.has_exec);
  ASSERT_NE(ev.field("command"), nullptr);
  EXPECT_EQ(std::get<std::string>(*ev.field("command")), "echo hi");
  EXPECT_EQ(std::get<std::int64_t>(*ev.field("exit_code")), 0);
  for (const auto& [k, v] : ev.fields) {
    if (const auto* s = std::get_if<std::string>(&v)) {
      EXPECT_EQ(s->find("secret"), std::string::npos) << k;
    }
  }
}

TEST_F(ServiceTest, ExecCollectsOutputWithoutASinkAndForwardsItWithOne) {
  bool gone = false;
  // Make the session first so its fake box can be told what to answer.
  ASSERT_TRUE(run(services_->sessions.create(as("t1"), "s2", {})));
  sandbox::ExecResult want;
  want.stdout_data = "out\n";
  want.exit_code = 3;
  fake_box("s2")->set_next_result(want);
  sandbox::ExecSpec spec;
  spec.argv = {"false"};
  auto r = run(services_->exec.run(as("t1"), "s2", spec, nullptr, StopSignal{never(), &gone}));
  ASSERT_TRUE(r && *r);
  EXPECT_EQ((*r)->stdout_data, "out\n");
  EXPECT_EQ((*r)->exit_code, 3);
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(std::get<std::vector<std::string>>(*events_[0].field("argv")),
            std::vector<std::string>{"false"});
  EXPECT_EQ(events_[0].field("command"), nullptr);
  EXPECT_EQ(std::get<std::int64_t>(*events_[0].field("exit_code")), 3);
}

TEST_F(ServiceTest, ExecWithAnArtifactDirOutsideTheWorkspaceRunsNothing) {
  bool gone = false;
  sandbox::ExecSpec spec;
  spec.command = "true";
  spec.artifact_dir = "/etc";
  auto r = run(services_->exec.run(as("t1"), "s3", spec, nullptr, StopSignal{never(), &gone}));
  ASSERT_TRUE(r.has_value());
  ASSERT_FALSE(*r);
  EXPECT_EQ((*r).error().code, Code::kInvalid);
  EXPECT_NE((*r).error().message.find("artifact_dir"), std::string::npos);
  EXPECT_TRUE(fake_box("s3")->execs().empty());
  EXPECT_TRUE(events_.empty());
  EXPECT_FALSE(check_artifact_dir("/workspace2/out", "/workspace"));
}

TEST(CheckArtifactDir, UnderTheWorkspaceOrItsBackendPathOrRelative) {
  // Once the box is known: under /workspace (or the backend's own workspace path), or relative.
  EXPECT_TRUE(check_artifact_dir("", "/workspace"));
  EXPECT_TRUE(check_artifact_dir("out/x", "/workspace"));
  EXPECT_TRUE(check_artifact_dir("/workspace", "/workspace"));
  EXPECT_TRUE(check_artifact_dir("/workspace/out", "/workspace"));
  EXPECT_TRUE(check_artifact_dir("/workspace/out", "/data/ws/a"));
  EXPECT_TRUE(check_artifact_dir("/data/ws/a/out", "/data/ws/a/"));
  for (const char* bad : {"/home/user/out", "/workspaces/x", "/tmp/out", "/data/ws/ab"}) {
    auto st = check_artifact_dir(bad, "/data/ws/a");
    ASSERT_FALSE(st) << bad;
    EXPECT_EQ(st.error().code, Code::kInvalid);
    EXPECT_NE(st.error().message.find("'artifact_dir'"), std::string::npos);
    EXPECT_NE(st.error().message.find(bad), std::string::npos);
  }
}

TEST_F(ServiceTest, ExecOfAnInvalidIdIsEinvalAndMakesNoSession) {
  bool gone = false;
  sandbox::ExecSpec spec;
  spec.command = "true";
  auto r = run(services_->exec.run(as("t1"), "../x", spec, nullptr, StopSignal{never(), &gone}));
  ASSERT_TRUE(r.has_value());
  ASSERT_FALSE(*r);
  EXPECT_EQ((*r).error().code, Code::kInvalid);
  EXPECT_EQ(fake_->creates_, 0);
  EXPECT_TRUE(events_.empty());
}

TEST_F(ServiceTest, ExecWhoseCallerLeftIsNulloptAndAuditedAsGone) {
  bool gone = false;
  sandbox::ExecSpec spec;
  spec.command = "true";
  auto r = run(services_->exec.run(as("t1"), "s4", spec, nullptr, StopSignal{now(&gone), &gone}));
  EXPECT_FALSE(r.has_value());
  // Whether the command finished first or not, at most one event, marked as the caller gone.
  ASSERT_LE(events_.size(), 1u);
  if (!events_.empty()) {
    ASSERT_NE(events_[0].field("client_gone"), nullptr);
    EXPECT_TRUE(std::get<bool>(*events_[0].field("client_gone")));
  }
}

}  // namespace
}  // namespace agentbox::service
