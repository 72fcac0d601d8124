#include "common/unique_fd.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <gtest/gtest.h>

namespace agentbox {
namespace {

TEST(UniqueFdTest, ResetClosesTheFdAndKeepsErrno) {
  UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(fd);
  const int raw = fd.get();
  errno = ENOENT;  // what a failed call before the close reported
  fd.reset();
  EXPECT_EQ(errno, ENOENT);
  EXPECT_FALSE(fd);
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1);  // closed
}

TEST(UniqueFdTest, ResetKeepsErrnoEvenWhenCloseFails) {
  // A descriptor that is not open: close() fails with EBADF, and the caller's errno survives.
  UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(fd);
  ASSERT_EQ(::close(fd.get()), 0);
  errno = EACCES;
  fd.reset();
  EXPECT_EQ(errno, EACCES);
}

TEST(UniqueFdTest, DestructorKeepsErrno) {
  errno = 0;
  {
    UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(fd);
    errno = EXDEV;
  }
  EXPECT_EQ(errno, EXDEV);
}

TEST(UniqueFdTest, MoveTransfersOwnership) {
  UniqueFd a(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(a);
  const int raw = a.get();
  UniqueFd b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): the moved-from state is the contract
  EXPECT_EQ(b.get(), raw);
}

}  // namespace
}  // namespace agentbox
