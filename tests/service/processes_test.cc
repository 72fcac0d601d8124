// service::Processes on the host backend (a real ProcessTable, no root needed): start and kill
// emit one event each; managed processes are recorded in the session's state and come back with
// every new box of the session, whatever resumed it, with no HTTP server anywhere.

#include "service/processes.h"

#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <thread>

#include "service_fixture.h"

namespace agentbox::service {
namespace {

class ProcessesTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    session::SessionSpec spec;
    spec.backend = "host";
    ASSERT_TRUE(run(services_->sessions.create(as("t1"), "p1", spec)));
  }
  // Polls the session's table (on the io thread) until `pred` holds or 5 s pass.
  bool wait_for(const std::function<bool(sandbox::ProcessTable*)>& pred) {
    for (int i = 0; i < 500; ++i) {
      auto t = run(services_->processes.target(as("t1"), "p1", false));
      if (t && pred(t->table)) return true;
      asio::steady_timer timer(ioc_, std::chrono::milliseconds(10));
      timer.wait();
    }
    return false;
  }
};

TEST_F(ServiceTest, ProcessesOnABackendWithoutATableAreEnotsupNamingTheSession) {
  ASSERT_TRUE(run(services_->sessions.create(as("t1"), "np", {})));
  auto t = run(services_->processes.target(as("t1"), "np", false));
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, Code::kNotSupported);
  EXPECT_NE(t.error().message.find("np"), std::string::npos);
}

TEST_F(ProcessesTest, StartAndKillEmitOneEventEach) {
  auto t = run(services_->processes.target(as("t1"), "p1", false));
  ASSERT_TRUE(t) << t.error().message;
  sandbox::ProcessSpec spec;
  spec.command = "sleep 30";
  spec.tag = "sleeper";
  auto info = run(services_->processes.start(as("t1"), *t, spec));
  ASSERT_TRUE(info) << info.error().message;
  auto killed = run(services_->processes.kill(as("t1"), *t, "sleeper"));
  ASSERT_TRUE(killed) << killed.error().message;
  EXPECT_NE(killed->state, sandbox::ProcessState::kRunning);
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_EQ(events_[0].op, "process.start");
  EXPECT_EQ(std::get<std::string>(*events_[0].field("tag")), "sleeper");
  EXPECT_EQ(events_[1].op, "process.kill");
  EXPECT_EQ(std::get<std::int64_t>(*events_[1].field("pid")), info->pid);
}

TEST_F(ProcessesTest, AManagedProcessComesBackWithTheNextBoxWithoutAnyServer) {
  services_->start();  // revival follows the manager's events
  auto t = run(services_->processes.target(as("t1"), "p1", false));
  ASSERT_TRUE(t);
  sandbox::ProcessSpec spec;
  spec.command = "sleep 30";
  spec.tag = "svc";
  spec.restart = sandbox::ProcessSpec::Restart::kAlways;
  ASSERT_TRUE(run(services_->processes.start(as("t1"), *t, spec)));
  ASSERT_EQ(manager_->managed_specs("p1").size(), 1u);
  ASSERT_TRUE(run(services_->sessions.suspend(as("t1"), "p1")));
  // Any use resumes it; the revival starts "svc" in the new box.
  ASSERT_TRUE(run(services_->sessions.resume(as("t1"), "p1")));
  EXPECT_TRUE(wait_for([](sandbox::ProcessTable* table) {
    auto p = table->get("svc");
    return p && p->state == sandbox::ProcessState::kRunning;
  }));
  // Killed through the operation, it is forgotten: the next box does not bring it back.
  auto t2 = run(services_->processes.target(as("t1"), "p1", false));
  ASSERT_TRUE(t2);
  ASSERT_TRUE(run(services_->processes.kill(as("t1"), *t2, "svc")));
  // The forget runs on the pool once the table has seen the end.
  for (int i = 0; i < 500 && !manager_->managed_specs("p1").empty(); ++i) {
    (void)run(services_->processes.target(as("t1"), "p1", false));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(manager_->managed_specs("p1").empty());
}

}  // namespace
}  // namespace agentbox::service
