// service::Sessions: the id rule once, the one lease rule, tenants, the policy events.

#include "service/sessions.h"

#include "service_fixture.h"

namespace agentbox::service {
namespace {

TEST_F(ServiceTest, CreateIsIdempotentAndGetListSeeOnlyTheCallersSessions) {
  auto a = run(services_->sessions.create(as("t1"), "s1", {}));
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_TRUE(a->second);
  auto again = run(services_->sessions.create(as("t1"), "s1", {}));
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->second);
  ASSERT_TRUE(run(services_->sessions.create(as("t2"), "s2", {})));
  auto mine = run(services_->sessions.list(as("t1")));
  ASSERT_TRUE(mine);
  ASSERT_EQ(mine->size(), 1u);
  EXPECT_EQ((*mine)[0].id, "s1");
  auto theirs = run(services_->sessions.get(as("t1"), "s2"));
  ASSERT_FALSE(theirs);
  EXPECT_EQ(theirs.error().code, Code::kNotFound);
  // Lifecycle changes are the manager's events, not operation events.
  EXPECT_TRUE(events_.empty());
}

TEST_F(ServiceTest, AnInvalidIdIsEinvalOnEveryOperation) {
  for (const std::string& bad : std::vector<std::string>{"", "..", "a/b", std::string(129, 'x')}) {
    EXPECT_EQ(run(services_->sessions.get(as("t1"), bad)).error().code, Code::kInvalid) << bad;
    EXPECT_EQ(run(services_->sessions.lease(as("t1"), bad, true)).error().code, Code::kInvalid);
    EXPECT_EQ(run(services_->sessions.destroy(as("t1"), bad, false)).error().code, Code::kInvalid);
    EXPECT_EQ(run(services_->sessions.suspend(as("t1"), bad)).error().code, Code::kInvalid);
  }
  EXPECT_EQ(fake_->creates_, 0);
}

TEST_F(ServiceTest, LeaseResumesASuspendedSessionAndCreatesOnlyWhenAsked) {
  auto none = run(services_->sessions.lease(as("t1"), "l1", false));
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Code::kNotFound);
  auto made = run(services_->sessions.lease(as("t1"), "l1", true));
  ASSERT_TRUE(made) << made.error().message;
  EXPECT_EQ(made->id, "l1");
  EXPECT_EQ(made->box->name(), "ns");
  ASSERT_TRUE(run(services_->sessions.suspend(as("t1"), "l1")));
  EXPECT_EQ(run(services_->sessions.lease_running(as("t1"), "l1")), nullptr);
  auto back = run(services_->sessions.lease(as("t1"), "l1", false));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(fake_->creates_, 2);  // made, then resumed in a new box
  EXPECT_NE(run(services_->sessions.lease_running(as("t1"), "l1")), nullptr);
  // Another tenant cannot lease it, not even by asking to create it.
  auto other = run(services_->sessions.lease(as("t2"), "l1", true));
  ASSERT_FALSE(other);
}

TEST_F(ServiceTest, DestroyWithoutArchiveGivesNoPathAndTheSessionIsGone) {
  ASSERT_TRUE(run(services_->sessions.create(as("t1"), "d1", {})));
  auto r = run(services_->sessions.destroy(as("t1"), "d1", false));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(*r, "");
  EXPECT_EQ(run(services_->sessions.get(as("t1"), "d1")).error().code, Code::kNotFound);
}

TEST_F(ServiceTest, ANetworkChangeThatFailsEmitsNothing) {
  ASSERT_TRUE(run(services_->sessions.create(as("t1"), "n1", {})));
  session::NetworkSpec bad;
  bad.mode = "allowlist";
  bad.allow = {"not a host name!"};
  auto r = run(services_->sessions.set_network(as("t1"), "n1", bad));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalid);
  EXPECT_TRUE(events_.empty());
}

}  // namespace
}  // namespace agentbox::service
