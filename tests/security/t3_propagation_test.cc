// SECURITY.md T3 (mount table: exactly the designed list): a host dir bound into a box is a
// mount of the box's own. On a host whose mounts are shared (systemd makes "/" shared), a bind
// that stayed a peer of the host's mount would carry mounts across: one made on the host beneath
// it would appear in the box, and one made in the box beneath it (the daemon's own live mounts)
// would appear on the host, where nothing ever removes it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "security/box_fixture.h"

namespace agentbox::security {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

// Whether `dir` is a mountpoint in this (the host's) mount namespace.
bool host_mountpoint(const std::string& dir) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    // "id parent major:minor root mountpoint ..."
    std::istringstream f(line);
    std::string id, parent, dev, root, point;
    f >> id >> parent >> dev >> root >> point;
    if (point == dir) return true;
  }
  return false;
}

TEST(MountPropagationTest, ABindOfASharedHostMountCarriesNoMountEitherWay) {
  testing::TempDir root("agentbox-t3-prop");  // first: outlives the daemon, detaches leftovers
  const std::string allowed = root / "allowed";
  const std::string shared = allowed + "/shared";
  const std::string other = allowed + "/other";
  fs::create_directories(shared);
  fs::create_directories(other);
  std::ofstream(other + "/from-other") << "other\n";
  // The host side: a mount of its own, in a peer group (MS_SHARED), as under a systemd "/".
  ASSERT_EQ(::mount("agentbox-t3", shared.c_str(), "tmpfs", 0, "size=1m,mode=0755"), 0);
  ASSERT_EQ(::mount(nullptr, shared.c_str(), nullptr, MS_SHARED, nullptr), 0);
  fs::create_directories(shared + "/from-host");
  fs::create_directories(shared + "/from-box");
  std::ofstream(shared + "/base") << "base\n";

  Daemon d({"--backend", "ns", "--allow-mount-root", allowed});
  Box a(d, "t3-prop",
        {{"mounts", {{{"host_path", shared}, {"mount_path", "/mnt/shared"}, {"mode", "ro"}}}}});
  ASSERT_EQ(a.sh("cat /mnt/shared/base").value("stdout", ""), "base\n");

  // Host -> box: a mount made on the host beneath the bound dir once the box runs.
  ASSERT_EQ(::mount("agentbox-t3-host", (shared + "/from-host").c_str(), "tmpfs", 0, "size=64k"),
            0);
  std::ofstream(shared + "/from-host/marker") << "host mount\n";
  auto seen =
      a.sh("cat /mnt/shared/from-host/marker 2>/dev/null; grep /mnt/shared /proc/self/mountinfo");
  EXPECT_THAT(seen.value("stdout", ""), Not(HasSubstr("host mount"))) << seen.dump();
  EXPECT_THAT(seen.value("stdout", ""), Not(HasSubstr("/mnt/shared/from-host"))) << seen.dump();
  // ... and the bind itself is in no peer group ("shared:N" in the optional fields).
  EXPECT_THAT(seen.value("stdout", ""), HasSubstr(" /mnt/shared ")) << seen.dump();
  EXPECT_THAT(seen.value("stdout", ""), Not(HasSubstr("shared:"))) << seen.dump();

  // Box -> host: a mount the daemon attaches in the running box beneath the bind (a live mount).
  auto add = a.client().request(
      "POST", "/v1/sessions/t3-prop/mounts",
      json{{"mounts",
            {{{"host_path", other}, {"mount_path", "/mnt/shared/from-box"}, {"mode", "ro"}}}}}
          .dump());
  ASSERT_TRUE(add);
  ASSERT_EQ(add->status, 200) << add->body;
  ASSERT_EQ(json::parse(add->body).value("applied", ""), "live") << add->body;
  ASSERT_EQ(a.sh("cat /mnt/shared/from-box/from-other").value("stdout", ""), "other\n");
  EXPECT_FALSE(host_mountpoint(shared + "/from-box")) << "a box's mount appeared on the host";
  EXPECT_FALSE(fs::exists(shared + "/from-box/from-other")) << "a box's mount appeared on the host";

  auto del = a.client().request("DELETE", "/v1/sessions/t3-prop");
  ASSERT_TRUE(del && del->status == 200);
  EXPECT_FALSE(host_mountpoint(shared + "/from-box")) << "a box's mount outlived its session";
}

}  // namespace
}  // namespace agentbox::security
