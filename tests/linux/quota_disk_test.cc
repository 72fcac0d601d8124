#include "linux/quota_disk.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace agentbox::linux {
namespace {

namespace fs = std::filesystem;

// Real loop devices and ext4 (root, as in CI): a temp dir with a mountpoint and an image path.
class QuotaDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/agentbox-qd-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    mnt_ = dir_ + "/ws";
    img_ = dir_ + "/ws.img";
    ASSERT_EQ(::mkdir(mnt_.c_str(), 0700), 0);
  }
  void TearDown() override {
    ::umount2(mnt_.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  QuotaDiskSpec spec(std::uint64_t mb) const { return {img_, mnt_, mb << 20, 12345, 12346}; }

  // Bytes written to `path` in 1 MiB writes until the first failure; errno_out gets its errno.
  static std::uint64_t fill(const std::string& path, int* errno_out) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
      *errno_out = errno;
      return 0;
    }
    std::vector<char> buf(1 << 20, 'x');
    std::uint64_t total = 0;
    *errno_out = 0;
    for (int i = 0; i < 1024; ++i) {
      ssize_t n = ::write(fd, buf.data(), buf.size());
      if (n < 0) {
        *errno_out = errno;
        break;
      }
      total += static_cast<std::uint64_t>(n);
    }
    ::close(fd);
    return total;
  }

  std::string dir_, mnt_, img_;
};

TEST_F(QuotaDiskTest, WritesStopWithEnospcAtTheCapAndTheHostIsUntouched) {
  struct statvfs before {};
  ASSERT_EQ(::statvfs(dir_.c_str(), &before), 0);
  ASSERT_TRUE(attach_quota_disk(spec(16)));
  auto root = is_mount_root(mnt_);
  ASSERT_TRUE(root && *root);

  // Owned by the session user, private, and empty (no lost+found for the agent to trip on).
  struct stat st {};
  ASSERT_EQ(::stat(mnt_.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 12345u);
  EXPECT_EQ(st.st_gid, 12346u);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_TRUE(fs::is_empty(mnt_));

  int err = 0;
  std::uint64_t wrote = fill(mnt_ + "/big", &err);
  EXPECT_EQ(err, ENOSPC);
  EXPECT_GT(wrote, 8ull << 20);   // most of the 16 MiB is usable
  EXPECT_LE(wrote, 16ull << 20);  // and never more

  // The image is sparse: the host paid for what was written, not for a 1 GiB "disk".
  struct stat img {};
  ASSERT_EQ(::stat(img_.c_str(), &img), 0);
  EXPECT_EQ(img.st_size, 16 << 20);
}

TEST_F(QuotaDiskTest, AttachIsIdempotentAndAReattachKeepsTheFiles) {
  ASSERT_TRUE(attach_quota_disk(spec(16)));
  ASSERT_TRUE(attach_quota_disk(spec(16)));  // already mounted: left as it is
  { std::ofstream(mnt_ + "/kept") << "still here"; }
  // A host reboot (or a lost mount) and a new attach: the same image comes back.
  ASSERT_EQ(::umount2(mnt_.c_str(), 0), 0);
  EXPECT_FALSE(fs::exists(mnt_ + "/kept"));
  // The kernel releases an autoclear loop device asynchronously (its last writes to the image
  // included); a reboot would have waited for it, so the test does too.
  auto attached = [&] {
    for (const auto& e : fs::directory_iterator("/sys/block")) {
      std::ifstream f(e.path() / "loop/backing_file");
      std::string b;
      if (std::getline(f, b) && b == img_) return true;
    }
    return false;
  };
  for (int i = 0; i < 500 && attached(); ++i) ::usleep(10000);
  ASSERT_FALSE(attached()) << "the loop device of " << img_ << " was not released";
  ASSERT_TRUE(attach_quota_disk(spec(16)));
  std::ifstream in(mnt_ + "/kept");
  std::string s;
  std::getline(in, s);
  EXPECT_EQ(s, "still here");
}

TEST_F(QuotaDiskTest, DetachUnmountsFreesTheLoopDeviceAndRemovesTheImage) {
  ASSERT_TRUE(attach_quota_disk(spec(16)));
  std::string backing;
  for (const auto& e : fs::directory_iterator("/sys/block")) {
    std::ifstream f(e.path() / "loop/backing_file");
    std::string b;
    if (std::getline(f, b) && b == img_) backing = e.path().filename();
  }
  ASSERT_FALSE(backing.empty()) << "no loop device backs " << img_;

  ASSERT_TRUE(detach_quota_disk(mnt_, img_));
  auto root = is_mount_root(mnt_);
  ASSERT_TRUE(root);
  EXPECT_FALSE(*root);
  EXPECT_FALSE(fs::exists(img_));
  std::ifstream f("/sys/block/" + backing + "/loop/backing_file");
  std::string b;
  EXPECT_FALSE(std::getline(f, b) && b == img_) << backing << " still attached";
  // Detaching what is not there is fine (a retried delete).
  EXPECT_TRUE(detach_quota_disk(mnt_, img_));
}

TEST_F(QuotaDiskTest, RefusesToHideFilesAndTinyDisks) {
  { std::ofstream(mnt_ + "/precious") << "x"; }
  auto st = attach_quota_disk(spec(16));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Code::kExists);
  EXPECT_NE(st.error().message.find("already has files"), std::string::npos) << st.error().message;
  EXPECT_FALSE(fs::exists(img_));
  fs::remove(mnt_ + "/precious");

  st = attach_quota_disk(spec(2));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Code::kInvalid);
  EXPECT_NE(st.error().message.find("disk_mb"), std::string::npos) << st.error().message;
  EXPECT_FALSE(fs::exists(img_));
}

}  // namespace
}  // namespace agentbox::linux
