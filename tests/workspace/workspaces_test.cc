// Workspaces: the one mkdir -> open -> disk -> chmod -> chown sequence, refusal of a planted
// symlink, quota disks mounted, unmounted (image kept) and dropped, archive lookup rules.
// Real directories, real loop devices and ext4 (root, as in CI).

#include "workspace/workspaces.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "linux/quota_disk.h"

namespace agentbox::workspace {
namespace {

namespace fs = std::filesystem;

class WorkspacesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/agentbox-ws-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    data_ = tmpl;
    auto ws = Workspaces::open(data_);
    ASSERT_TRUE(ws) << ws.error().message;
    ws_.emplace(std::move(*ws));
  }
  void TearDown() override {
    ::umount2((data_ + "/workspaces/capped").c_str(), MNT_DETACH);
    ws_.reset();
    std::error_code ec;
    fs::remove_all(data_, ec);
  }
  Workspaces& ws() { return *ws_; }
  struct stat stat_of(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st;
  }

  std::string data_;
  std::optional<Workspaces> ws_;
};

TEST_F(WorkspacesTest, PrepareMakesA0700DirOwnedByTheOwnerAndReusesIt) {
  EXPECT_EQ(stat_of(data_ + "/workspaces").st_mode & 07777, 0700u);
  auto p = ws().prepare("s1", false, Owner{12345, 12346}, 0);
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_TRUE(p->created);
  auto st = stat_of(ws().path("s1"));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, 12345u);
  EXPECT_EQ(st.st_gid, 12346u);
  ASSERT_EQ(::chmod(ws().path("s1").c_str(), 0755), 0);
  auto again = ws().prepare("s1", false, std::nullopt, 0);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_FALSE(again->created);
  EXPECT_EQ(stat_of(ws().path("s1")).st_mode & 07777, 0700u);  // pinned again
  EXPECT_EQ(stat_of(ws().path("s1")).st_uid, 12345u);           // no owner: left as it is
  EXPECT_TRUE(ws().exists("s1"));
  EXPECT_EQ(ws().names(), std::vector<std::string>{"s1"});
  auto fresh = ws().prepare("s1", /*must_be_new=*/true, std::nullopt, 0);
  ASSERT_FALSE(fresh);
  EXPECT_EQ(fresh.error().code, Code::kExists);
}

TEST_F(WorkspacesTest, APlantedSymlinkIsRefusedAndNotFollowed) {
  fs::create_directories(data_ + "/outside");
  fs::create_directory_symlink(data_ + "/outside", ws().path("evil"));
  auto p = ws().prepare("evil", false, Owner{12345, 12345}, 0);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Code::kAccess) << p.error().message;
  EXPECT_EQ(stat_of(data_ + "/outside").st_uid, 0u);  // not chowned through the link
  EXPECT_TRUE(fs::is_symlink(ws().path("evil")));     // not ours to remove
}

TEST_F(WorkspacesTest, ACappedWorkspaceIsMountedUnmountedWithItsImageKeptAndDropped) {
  const std::string mnt = ws().path("capped");
  const std::string img = data_ + "/disks/capped.img";
  auto p = ws().prepare("capped", false, Owner{12345, 12345}, 16);
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_TRUE(*linux::is_mount_root(mnt));
  EXPECT_EQ(stat_of(mnt).st_uid, 12345u);
  p->dir.reset();
  std::ofstream(mnt + "/kept.txt") << "kept";
  ASSERT_TRUE(ws().unmount_disk("capped"));
  EXPECT_FALSE(*linux::is_mount_root(mnt));
  EXPECT_FALSE(fs::exists(mnt + "/kept.txt"));
  EXPECT_TRUE(fs::exists(img));
  ASSERT_TRUE(ws().unmount_disk("capped"));  // not mounted: nothing to do
  auto back = ws().prepare("capped", false, Owner{12345, 12345}, 16);
  ASSERT_TRUE(back) << back.error().message;
  back->dir.reset();
  EXPECT_TRUE(fs::exists(mnt + "/kept.txt"));  // the same image, mounted again
  ASSERT_TRUE(ws().drop_disk("capped"));
  EXPECT_FALSE(*linux::is_mount_root(mnt));
  EXPECT_FALSE(fs::exists(img));
}

TEST_F(WorkspacesTest, ArchivesAreFoundOnlyInTheArchivesDir) {
  ASSERT_TRUE(ws().prepare("a", false, std::nullopt, 0));
  std::ofstream(ws().path("a") + "/f.txt") << "x";
  auto path = ws().archive("a");
  ASSERT_TRUE(path) << path.error().message;
  EXPECT_EQ(path->rfind(ws().archives_dir() + "/a-", 0), 0u) << *path;
  EXPECT_TRUE(ws().open_archive(*path));
  EXPECT_TRUE(ws().open_archive(fs::path(*path).filename().string()));
  EXPECT_EQ(ws().open_archive(data_ + "/x.tar.zst").error().code, Code::kAccess);
  EXPECT_EQ(ws().open_archive("../workspaces/a/f.tar.zst").error().code, Code::kAccess);
  EXPECT_EQ(ws().open_archive("a.tar").error().code, Code::kInvalid);
}

}  // namespace
}  // namespace agentbox::workspace
