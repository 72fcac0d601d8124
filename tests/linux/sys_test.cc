#include "linux/sys.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace agentbox::linux::sys {
namespace {

namespace fs = std::filesystem;

class SysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "agentbox-sys-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    fd_ = UniqueFd(::open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(fd_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  void touch(const std::string& rel) {
    UniqueFd f(::open((root_ + "/" + rel).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_TRUE(f) << rel;
  }

  std::string root_;
  UniqueFd fd_;
};

constexpr std::uint64_t kBeneath = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;

TEST_F(SysTest, Openat2OpensBeneathWithCloexec) {
  fs::create_directory(root_ + "/d");
  touch("d/f");
  auto fd = openat2(fd_.get(), "d/f", O_RDONLY, kBeneath);
  ASSERT_TRUE(fd) << fd.error().message;
  EXPECT_NE(::fcntl(fd->get(), F_GETFD) & FD_CLOEXEC, 0);
  auto self = openat2(fd_.get(), "", O_PATH | O_DIRECTORY, kBeneath);  // "" is the dir itself
  ASSERT_TRUE(self) << self.error().message;
}

TEST_F(SysTest, Openat2RefusesEscapesAndNamesThePath) {
  fs::create_symlink("/etc", root_ + "/link");
  auto up = openat2(fd_.get(), "../x", O_RDONLY, kBeneath);
  ASSERT_FALSE(up);
  EXPECT_EQ(up.error().sys_errno, EXDEV);
  EXPECT_EQ(up.error().code, Code::kAccess);
  EXPECT_NE(up.error().message.find("open(../x)"), std::string::npos) << up.error().message;

  auto link = openat2(fd_.get(), "link/passwd", O_RDONLY, kBeneath, "archive: open(link/passwd)");
  ASSERT_FALSE(link);
  EXPECT_EQ(link.error().sys_errno, ELOOP);
  EXPECT_EQ(link.error().message.rfind("archive: open(link/passwd): ", 0), 0u)
      << link.error().message;

  auto missing = openat2(fd_.get(), "nope", O_RDONLY, kBeneath);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Code::kNotFound);
}

TEST_F(SysTest, Openat2RawReportsErrno) {
  errno = 0;
  EXPECT_EQ(openat2_raw(fd_.get(), "nope", O_RDONLY, kBeneath), -1);
  EXPECT_EQ(errno, ENOENT);
  const int fd = openat2_raw(fd_.get(), ".", O_PATH, kBeneath);
  ASSERT_GE(fd, 0);
  EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  ::close(fd);
}

TEST(SysPipeTest, BothEndsCloexecAndConnected) {
  auto p = pipe();
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_NE(::fcntl(p->read.get(), F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_NE(::fcntl(p->write.get(), F_GETFD) & FD_CLOEXEC, 0);
  ASSERT_EQ(::write(p->write.get(), "hi", 2), 2);
  char buf[2];
  ASSERT_EQ(::read(p->read.get(), buf, 2), 2);
  EXPECT_EQ(std::string(buf, 2), "hi");
}

TEST(SysPipeTest, AboveStdioNeverReturnsAStandardFd) {
  // With stdin closed, pipe2 hands out fd 0; above_stdio moves that end above 2.
  UniqueFd saved(::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3));
  ASSERT_TRUE(saved);
  ASSERT_EQ(::close(STDIN_FILENO), 0);
  auto low = pipe();
  auto high = pipe(true);
  ASSERT_TRUE(low);
  ASSERT_TRUE(high);
  const int low_read = low->read.get();
  low = Pipe{};  // frees fd 0 again
  EXPECT_GT(high->read.get(), STDERR_FILENO);
  EXPECT_GT(high->write.get(), STDERR_FILENO);
  ASSERT_EQ(::dup2(saved.get(), STDIN_FILENO), STDIN_FILENO);
  EXPECT_EQ(low_read, STDIN_FILENO);  // without above_stdio the fd 0 is handed out
}

TEST_F(SysTest, ReadDirListsNamesSortedWithoutFollowing) {
  touch("b");
  fs::create_directory(root_ + "/a");
  fs::create_symlink("/etc", root_ + "/c");
  auto entries = read_dir(fd_.get(), "w");  // an O_PATH fd is fine
  ASSERT_TRUE(entries) << entries.error().message;
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].name, "a");
  EXPECT_EQ((*entries)[0].type, DT_DIR);
  EXPECT_EQ((*entries)[1].name, "b");
  EXPECT_EQ((*entries)[1].type, DT_REG);
  EXPECT_EQ((*entries)[2].name, "c");
  EXPECT_EQ((*entries)[2].type, DT_LNK);  // the link itself, not /etc
  auto names = list_names(fd_.get(), "w");
  ASSERT_TRUE(names);
  EXPECT_EQ(*names, (std::vector<std::string>{"a", "b", "c"}));
}

TEST_F(SysTest, ReadDirIsBoundedAndNamesTheDirectory) {
  for (int i = 0; i < 5; ++i) touch("f" + std::to_string(i));
  EXPECT_TRUE(read_dir(fd_.get(), "w", 5));
  auto over = read_dir(fd_.get(), "/workspace/w", 4);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code, Code::kTooBig);
  EXPECT_NE(over.error().message.find("readdir(/workspace/w): more than 4 entries"),
            std::string::npos)
      << over.error().message;
}

TEST_F(SysTest, ReadDirOfAFileIsNotDir) {
  touch("f");
  UniqueFd f(::openat(fd_.get(), "f", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(f);
  auto r = read_dir(f.get(), "f");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kNotDir);
}

// Runs `body` in a forked child (identity changes must not touch the test process); its exit
// status is the test's verdict.
template <typename F>
int in_child(F body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(SysIdentityTest, SwitchSetsEveryIdAndDropsGroups) {
  if (::geteuid() != 0) GTEST_FAIL() << "needs root (tests run as root)";
  const int rc = in_child([] {
    gid_t extra = 4;
    if (::setgroups(1, &extra) != 0) return 10;
    if (switch_identity(65534, 65533) != 0) return 11;
    uid_t r, e, s;
    gid_t gr, ge, gs;
    if (::getresuid(&r, &e, &s) != 0 || r != 65534 || e != 65534 || s != 65534) return 12;
    if (::getresgid(&gr, &ge, &gs) != 0 || gr != 65533 || ge != 65533 || gs != 65533) return 13;
    if (::getgroups(0, nullptr) != 0) return 14;
    // No way back: every step now fails, and the first failing step's errno is returned.
    if (switch_identity(0, 0) != EPERM) return 15;
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

}  // namespace
}  // namespace agentbox::linux::sys
