// Clean exits (issue 9, item 6): after SIGTERM the daemon leaves no capped workspace mounted,
// no loop device attached to its images and no agentbox-<hash> cgroup dir in any hierarchy;
// the image stays and the session's files are there again at the next start.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "integration/api_test_util.h"
#include "integration/daemon.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;

std::string slurp_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Loop devices whose backing file lies under `dir`.
std::vector<std::string> loops_backed_under(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/sys/block", ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("loop", 0) != 0) continue;
    std::string backing = slurp_file(e.path().string() + "/loop/backing_file");
    if (backing.find(dir) != std::string::npos) out.push_back(name + " -> " + backing);
  }
  return out;
}

// Every directory named `name` at the top of a cgroup hierarchy (v2 root, v1 controllers).
std::vector<std::string> cgroup_dirs_named(const std::string& name) {
  std::vector<std::string> out;
  const fs::path root = "/sys/fs/cgroup";
  std::error_code ec;
  if (fs::exists(root / name, ec)) out.push_back((root / name).string());
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.is_directory(ec) && fs::exists(e.path() / name, ec)) {
      out.push_back((e.path() / name).string());
    }
  }
  return out;
}

TEST(CleanExit, SigtermUnmountsQuotaDisksDetachesLoopsAndRemovesTheCgroupDirs) {
  Daemon d({"--backend", "ns"});
  Api api(d);
  auto created = api.post("/v1/sessions", {{"id", "capped"}, {"limits", {{"disk_mb", 16}}}});
  ASSERT_EQ(created.status, 201) << created;
  ASSERT_EQ(api.sh("capped", "echo kept > /workspace/kept.txt").status, 200);
  const std::string ws = d.data_dir() + "/workspaces/capped";
  const std::string disks = d.data_dir() + "/disks/";

  // While it runs: mounted, on a loop device, under the daemon's cgroup parent.
  std::smatch m;
  const std::string log = d.log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex(R"(cgroup v[12] at (\S+),)"))) << log;
  const std::string parent = fs::path(m[1].str()).filename().string();
  ASSERT_EQ(parent.rfind("agentbox-", 0), 0u) << parent;
  EXPECT_NE(slurp_file("/proc/mounts").find(" " + ws + " "), std::string::npos);
  EXPECT_FALSE(loops_backed_under(disks).empty());
  EXPECT_FALSE(cgroup_dirs_named(parent).empty());

  ASSERT_EQ(d.stop(SIGTERM), 0) << d.log();
  EXPECT_EQ(slurp_file("/proc/mounts").find(" " + ws + " "), std::string::npos)
      << "the workspace image is still mounted";
  EXPECT_EQ(loops_backed_under(disks), std::vector<std::string>{});
  EXPECT_EQ(cgroup_dirs_named(parent), std::vector<std::string>{}) << d.log();
  EXPECT_TRUE(fs::exists(disks + "capped.img"));  // the session's bytes stay
}

}  // namespace
}  // namespace agentbox::testing
