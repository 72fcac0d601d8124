// sandbox/health_checks.h on a real box of the host backend (no isolation needed for what is tested
// here: the order of the checks, the template-defined checks and their repairs, the marker rule,
// a box that is not up). The ns boxes, the venv and node_modules checks and their repairs are
// tested through the daemon (tests/integration/api_packages_test.cc).
#include "sandbox/health_checks.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <filesystem>

#include "sandbox/host_backend.h"
#include "support/support.h"
#include "sandbox/installers.h"

namespace agentbox::sandbox {
namespace {

namespace fs = std::filesystem;

class HealthChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    sandbox::HostBackend backend;
    auto box = backend.create(
        sandbox::BoxConfig{.key = "health", .workspace_dir = fs::canonical(dir_.path()).string()});
    ASSERT_TRUE(box.has_value()) << box.error().message;
    target_.box = std::move(*box);
  }
  void TearDown() override {
    if (target_.box) target_.box->shutdown();
  }

  HealthReport run(bool repair) {
    boost::asio::io_context io;
    auto fut = boost::asio::co_spawn(io, repair ? repair_health(target_) : check_health(target_),
                                     boost::asio::use_future);
    io.run();
    return fut.get();
  }
  static const CheckResult* find(const HealthReport& r, const std::string& name) {
    for (const auto& c : r.checks) {
      if (c.name == name) return &c;
    }
    return nullptr;
  }
  static std::vector<std::string> names(const HealthReport& r) {
    std::vector<std::string> out;
    for (const auto& c : r.checks) out.push_back(c.name);
    return out;
  }

  testing::TempDir dir_{"agentbox-health"};
  HealthTarget target_;
};

TEST_F(HealthChecks, TemplateChecksRunAfterTheBuiltInOnesAndTheirRepairsFixThem) {
  target_.template_checks = {
      {"greeting", "test -f hello.txt && cat hello.txt", "echo hi > hello.txt"},
      {"always-broken", "echo broken >&2; exit 3", ""},
  };
  HealthReport h = run(false);
  EXPECT_EQ(names(h), (std::vector<std::string>{"box", "workspace", "disk", "marker", "greeting",
                                                "always-broken"}));
  EXPECT_FALSE(h.healthy);
  ASSERT_NE(find(h, "greeting"), nullptr);
  EXPECT_FALSE(find(h, "greeting")->ok);
  EXPECT_EQ(find(h, "greeting")->detail, "exit 1");
  EXPECT_EQ(find(h, "always-broken")->detail, "exit 3: broken");
  EXPECT_TRUE(find(h, "marker")->ok);  // nothing configured this workspace: no marker needed

  HealthReport r = run(true);
  EXPECT_FALSE(r.healthy);  // always-broken has no repair
  EXPECT_TRUE(find(r, "greeting")->ok);
  EXPECT_EQ(find(r, "greeting")->detail, "hi");
  EXPECT_TRUE(find(r, "greeting")->repair_attempted);
  EXPECT_EQ(find(r, "greeting")->repair_detail, "repair ran");
  EXPECT_FALSE(find(r, "always-broken")->ok);
  EXPECT_EQ(find(r, "always-broken")->repair_detail, "no repair step for this check");
  EXPECT_FALSE(find(r, "workspace")->repair_attempted);
  EXPECT_EQ(testing::slurp(dir_ / "hello.txt"), "hi\n");
}

TEST_F(HealthChecks, AConfiguredWorkspaceNeedsItsMarker) {
  target_.configured = true;  // e.g. made from a template
  HealthReport h = run(false);
  EXPECT_FALSE(h.healthy);
  EXPECT_EQ(find(h, "marker")->detail, target_.box->workspace() + "/.workspace_configured is missing");
  HealthReport r = run(true);
  EXPECT_TRUE(r.healthy);
  EXPECT_TRUE(find(r, "marker")->repair_attempted);
  EXPECT_FALSE(testing::slurp(dir_ / ".workspace_configured").empty());
}

TEST_F(HealthChecks, AnUnreadableManifestIsAFailingCheckNotAnError) {
  ASSERT_TRUE(testing::spit(dir_ / "package.json", "{not json"));
  HealthReport h = run(false);
  EXPECT_FALSE(h.healthy);
  ASSERT_NE(find(h, "node"), nullptr);
  EXPECT_EQ(find(h, "node")->detail, "package.json is not a JSON object");
}

TEST_F(HealthChecks, ABoxThatIsNotUpFailsOnlyTheBoxCheck) {
  target_.box->shutdown();
  target_.box.reset();
  target_.box_error = "EQUOTA: too many boxes running";
  HealthReport h = run(true);
  EXPECT_FALSE(h.healthy);
  ASSERT_EQ(h.checks.size(), 1u);
  EXPECT_EQ(h.checks[0].name, "box");
  EXPECT_EQ(h.checks[0].detail, "EQUOTA: too many boxes running");
}

}  // namespace
}  // namespace agentbox::sandbox
