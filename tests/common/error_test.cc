#include "common/error.h"

#include <gtest/gtest.h>

namespace agentbox {
namespace {

TEST(ErrorTest, ErrnoMapsToWireCodeAndNamesTheOperation) {
  Error e = Error::from_errno(ENOENT, "open(/workspace/a.txt)");
  EXPECT_EQ(e.code, Code::kNotFound);
  EXPECT_EQ(code_name(e.code), "ENOENT");
  EXPECT_EQ(e.sys_errno, ENOENT);
  EXPECT_NE(e.message.find("open(/workspace/a.txt)"), std::string::npos);
  EXPECT_NE(e.message.find("ENOENT"), std::string::npos);
}

TEST(ErrorTest, EscapesAndReadOnlyAreAccessErrors) {
  EXPECT_EQ(code_for_errno(EXDEV), Code::kAccess);   // openat2 refusing to leave the root
  EXPECT_EQ(code_for_errno(EROFS), Code::kAccess);
  EXPECT_EQ(code_for_errno(ELOOP), Code::kAccess);
  EXPECT_EQ(code_for_errno(ENOSPC), Code::kQuota);
  EXPECT_EQ(code_for_errno(ENOTEMPTY), Code::kNotEmpty);
}

}  // namespace
}  // namespace agentbox
