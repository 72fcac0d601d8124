// Fail closed (API.md "General"): every request field and value either works or is refused
// with 501 ENOTSUP naming it; seed 002's names are aliases that work; a session shows its
// effective limits, and the config's default_limits are what a session's unset limits become.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;


class FailClosedApi : public ::testing::Test {
 protected:
  Daemon daemon_;
  Api api_{daemon_};

  // Expects 501 ENOTSUP whose message names `field`, and no session made.
  void expect_refused(const json& body, const std::string& field) {
    auto r = api_.post("/v1/sessions", body);
    EXPECT_EQ(r.status, 501) << body.dump() << " -> " << r;
    EXPECT_EQ(r.code(), "ENOTSUP") << r;
    EXPECT_NE(r.message().find("'" + field + "'"), std::string::npos) << field << ": " << r;
    EXPECT_EQ(api_.get("/v1/sessions/" + body["id"].get<std::string>()).status, 404)
        << body.dump() << ": a refused create must make nothing";
  }
};

TEST_F(FailClosedApi, UnbuiltFieldsAndValuesAre501NamingThem) {
  // API.md's cluster field, not built yet, and the image fields on a backend without image
  // roots (this daemon's host backend; a writable root needs an image): 501 naming them.
  // (On ns an image is pulled: api_images_test.cc covers it with a loopback registry.)
  if (test_backend() != "ns") {
    expect_refused({{"id", "i"}, {"image", "registry.example/team/py:3.12"}}, "image");
  }
  expect_refused({{"id", "r"}, {"read_only_rootfs", false}}, "read_only_rootfs");
  expect_refused({{"id", "n"}, {"node", "node-2"}}, "node");
}

TEST_F(FailClosedApi, MalformedIsStill400) {
  auto allow = api_.post("/v1/sessions", {{"id", "a"}, {"network", {{"allow", {"example.org"}}}}});
  EXPECT_EQ(allow.status, 400) << allow;
  EXPECT_EQ(allow.code(), "EINVAL");
  EXPECT_NE(allow.message().find("'network.allow'"), std::string::npos) << allow;
  // variables are type-checked also when id is given.
  auto vars = api_.post("/v1/sessions", {{"id", "a"}, {"variables", {{"x", {1, 2}}}}});
  EXPECT_EQ(vars.status, 400) << vars;
  EXPECT_NE(vars.message().find("'variables.x'"), std::string::npos) << vars;
  auto mode = api_.post("/v1/sessions", {{"id", "a"}, {"mount_path", "/data"}});
  EXPECT_EQ(mode.status, 400) << mode;
  EXPECT_NE(mode.message().find("'mount_path'"), std::string::npos) << mode;
  EXPECT_EQ(api_.get("/v1/sessions/a").status, 404);
}

TEST_F(FailClosedApi, SessionShowsItsEffectiveLimits) {
  auto c = api_.post("/v1/sessions", {{"id", "eff"}, {"limits", {{"memory_mb", 300}}}});
  ASSERT_EQ(c.status, 201) << c;
  const json& l = c.body["limits"];
  EXPECT_EQ(l["memory_mb"], 300);
  EXPECT_EQ(l["cpu_percent"], 100);
  EXPECT_EQ(l["max_pids"], 256);
  EXPECT_EQ(l["max_open_files"], 1024);
  EXPECT_FALSE(l.contains("disk_mb")) << l;  // no cap asked for, none by default
  EXPECT_EQ(api_.get("/v1/sessions/eff").body["limits"], l);
  // Asking again for what the defaults filled in is the same session, not a conflict.
  auto again = api_.post("/v1/sessions", {{"id", "eff"}, {"limits", {{"max_pids", 256}}}});
  EXPECT_EQ(again.status, 200) << again;
}

TEST_F(FailClosedApi, ArtifactDirOutsideTheWorkspaceIs400) {
  auto r = api_.exec("art", {{"command", "true"}, {"artifact_dir", "/home/someone/out"}});
  EXPECT_EQ(r.status, 400) << r;
  EXPECT_EQ(r.code(), "EINVAL");
  EXPECT_NE(r.message().find("'artifact_dir'"), std::string::npos) << r;
  auto ok = api_.exec("art", {{"command", "mkdir -p out && echo x > out/a.txt"},
                              {"artifact_dir", "/workspace/out"}});
  ASSERT_EQ(ok.status, 200) << ok;
  ASSERT_EQ(ok.body["artifacts"].size(), 1u) << ok;
}

// Seed 001's cgroup sets the limits when the agent's session is made; on a later exec a
// different one changes the live box's limits (ns), or, where the backend cannot (host), is
// refused naming it instead of run as if it were applied.
TEST_F(FailClosedApi, SeedCgroupThatCannotChangeALiveBoxIs501) {
  auto first = api_.post("/exec", {{"command", "true"},
                                   {"agent_id", "seed"},
                                   {"cgroup", {{"memory_mb", 256}, {"max_pids", 64}}}});
  ASSERT_EQ(first.status, 200) << first;
  auto same = api_.post("/exec", {{"command", "echo same"},
                                  {"agent_id", "seed"},
                                  {"cgroup", {{"memory_mb", 256}}}});
  EXPECT_EQ(same.status, 200) << same;
  EXPECT_EQ(same.body["stdout"], "same\n");
  // disk_mb is fixed on every backend (the workspace's disk is sized when it is made).
  auto disk = api_.post(
      "/exec", {{"command", "echo ran"}, {"agent_id", "seed"}, {"cgroup", {{"disk_mb", 64}}}});
  EXPECT_EQ(disk.status, 501) << disk;
  EXPECT_NE(disk.message().find("'cgroup.disk_mb'"), std::string::npos) << disk;
  if (test_backend() != "host") return;  // ns: LiveLimits.SeedExecWithADifferentCgroup...
  auto other = api_.post("/exec", {{"command", "echo ran"},
                                   {"agent_id", "seed"},
                                   {"cgroup", {{"memory_mb", 1024}}}});
  EXPECT_EQ(other.status, 501) << other;
  EXPECT_EQ(other.code(), "ENOTSUP");
  EXPECT_NE(other.message().find("'cgroup.memory_mb'"), std::string::npos) << other;
  EXPECT_EQ(api_.get("/v1/sessions/seed").body["limits"]["memory_mb"], 256);
}

TEST_F(FailClosedApi, ReadyzAndMetricsSayWhatIsBuilt) {
  auto r = api_.get("/readyz");
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["features"]["network_modes"], json::array({"none", "allowlist", "open"})) << r;
  EXPECT_EQ(r.body["features"]["templates"], true) << r;
  EXPECT_EQ(r.body["features"]["exec"], true) << r;
  ASSERT_TRUE(r.body["backends"].is_array()) << r;
  EXPECT_NE(std::find(r.body["backends"].begin(), r.body["backends"].end(), r.body["backend"]),
            r.body["backends"].end())
      << r;
  auto m = api_.get("/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.raw.find("agentbox_feature{name=\"templates\"} 1\n"), std::string::npos);
  EXPECT_NE(m.raw.find("agentbox_network_mode{mode=\"none\"} 1\n"), std::string::npos);
  EXPECT_NE(m.raw.find("agentbox_network_mode{mode=\"allowlist\"} 1\n"), std::string::npos);
  EXPECT_NE(m.raw.find("agentbox_network_mode{mode=\"open\"} 1\n"), std::string::npos);
}

TEST(FailClosedConfig, DefaultLimitsFromTheConfigFileAreApplied) {
  TempDir dir("agentbox-it-failclosed");
  std::string cfg = dir.path() + "/agentboxd.yaml";
  std::ofstream(cfg) << "default_limits:\n  memory_mb: 200\n  max_pids: 48\n";
  Daemon d({"--config", cfg});
  Api api(d);
  auto c = api.post("/v1/sessions", {{"id", "dl"}, {"limits", {{"max_pids", 96}}}});
  ASSERT_EQ(c.status, 201) << c;
  EXPECT_EQ(c.body["limits"]["memory_mb"], 200);
  EXPECT_EQ(c.body["limits"]["max_pids"], 96);  // the request wins
  EXPECT_EQ(c.body["limits"]["cpu_percent"], 100);
  EXPECT_EQ(api.get("/v1/sessions/dl").body["limits"]["memory_mb"], 200);
}

// Seed 002's names work: extra_mounts = mounts, a primary host_path mounted elsewhere than
// /workspace is one more mount, host_path_mode none mounts nothing.
TEST(FailClosedAliases, Seed002MountNamesWork) {
  if (::geteuid() != 0) GTEST_SKIP() << "bind mounts into ns boxes need root";
  TempDir roots("agentbox-it-failclosed");
  fs::create_directories(roots.path() + "/allowed/extra");
  fs::create_directories(roots.path() + "/allowed/project");
  std::ofstream(roots.path() + "/allowed/extra/e.txt") << "extra\n";
  std::ofstream(roots.path() + "/allowed/project/p.txt") << "project\n";
  Daemon d({"--backend", "ns", "--allow-mount-root", roots.path() + "/allowed"});
  Api api(d);
  auto c = api.post("/v1/sessions",
                    {{"id", "s2"},
                     {"extra_mounts",
                      {{{"host_path", roots.path() + "/allowed/extra"},
                        {"mount_path", "/extra"},
                        {"mode", "ro"}}}},
                     {"host_path", roots.path() + "/allowed/project"},
                     {"mount_path", "/project"},
                     {"host_path_mode", "ro"}});
  ASSERT_EQ(c.status, 201) << c;
  auto r = api.sh("s2", "cat /extra/e.txt /project/p.txt; touch /project/n 2>/dev/null; echo $?");
  EXPECT_EQ(r.body["stdout"], "extra\nproject\n1\n") << r;
  EXPECT_FALSE(fs::exists(roots.path() + "/allowed/project/n"));

  auto none = api.post("/v1/sessions", {{"id", "s3"},
                                        {"host_path", roots.path() + "/allowed/project"},
                                        {"mount_path", "/project"},
                                        {"host_path_mode", "none"}});
  ASSERT_EQ(none.status, 201) << none;
  auto n = api.sh("s3", "test -e /project/p.txt; echo $?");
  EXPECT_EQ(n.body["stdout"], "1\n") << n;
}

}  // namespace
}  // namespace agentbox::testing
