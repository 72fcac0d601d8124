// SECURITY.md T7: identity. Two sessions never share a uid; a session keeps its uid.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "security/box_fixture.h"

namespace agentbox::security {
namespace {

TEST(IdentityTest, SessionsNeverShareAUid) {
  std::set<uid_t> uids;
  for (int i = 0; i < 40; ++i) {
    Box b(shared_daemon(), "t7-uid-" + std::to_string(i));
    EXPECT_GE(b.uid(), 10000u);
    EXPECT_LT(b.uid(), 70000u);
    EXPECT_TRUE(uids.insert(b.uid()).second) << "uid " << b.uid() << " shared";
    EXPECT_EQ(b.sh("id -u").value("stdout", ""), std::to_string(b.uid()) + "\n");
  }
}

TEST(IdentityTest, WorkspaceFilesBelongToTheSessionUid) {
  Box b(shared_daemon(), "t7-owner");
  auto r = b.client().request("PUT", "/v1/sessions/t7-owner/files?path=/workspace/api.txt", "x",
                              "application/octet-stream");
  ASSERT_TRUE(r && r->status == 200);
  ASSERT_EQ(b.sh("echo y > /workspace/cmd.txt").value("exit_code", -1), 0);
  EXPECT_EQ(b.sh("stat -c %u /workspace/api.txt /workspace/cmd.txt /workspace").value("stdout", ""),
            std::to_string(b.uid()) + "\n" + std::to_string(b.uid()) + "\n" +
                std::to_string(b.uid()) + "\n");
}

TEST(IdentityTest, ASessionKeepsItsUidAcrossARestart) {
  uid_t before;
  std::string data_dir;
  {
    Daemon d({"--backend", "ns"});
    Box b(d, "t7-restart");
    before = b.uid();
    data_dir = d.data_dir();
    d.stop(SIGTERM);
    Daemon again({"--backend", "ns", "--data-dir", data_dir});
    Box c(again, "t7-restart");
    EXPECT_EQ(c.uid(), before);
    EXPECT_EQ(c.sh("id -u").value("stdout", ""), std::to_string(before) + "\n");
  }
}

}  // namespace
}  // namespace agentbox::security
