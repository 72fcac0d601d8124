// Snapshot trees (workspace/tree.h): the content hash is the snapshot's identity.

#include "workspace/tree.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/unique_fd.h"
#include "support/support.h"

namespace agentbox::workspace {
namespace {

namespace fs = std::filesystem;

TreeStats hash_of(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  auto r = hash_tree(fd.get());
  EXPECT_TRUE(r) << r.error().message;
  return r ? *r : TreeStats{};
}

void write(const std::string& path, const std::string& data) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << data;
}

TEST(Tree, SameContentSameHashAnyChangeAnotherHash) {
  testing::TempDir a("tree-a"), b("tree-b");
  for (const auto* d : {&a, &b}) {
    write(*d / "x.txt", "hello");
    write(*d / "sub/y.txt", "world!");
    fs::create_symlink("x.txt", *d / "link");
  }
  TreeStats ha = hash_of(a.path()), hb = hash_of(b.path());
  EXPECT_EQ(ha.hash, hb.hash);
  EXPECT_EQ(ha.hash.size(), 64u);
  EXPECT_EQ(ha.bytes, 11u);
  EXPECT_EQ(ha.files, 4u);  // x.txt, sub, sub/y.txt, link

  write(b / "sub/y.txt", "world?");
  EXPECT_NE(hash_of(b.path()).hash, ha.hash) << "content";
  write(b / "sub/y.txt", "world!");
  ASSERT_EQ(hash_of(b.path()).hash, ha.hash);
  struct stat was {};
  ASSERT_EQ(::stat((b / "x.txt").c_str(), &was), 0);
  ::chmod((b / "x.txt").c_str(), 0600 ^ (was.st_mode & 07777) ? 0600 : 0640);
  EXPECT_NE(hash_of(b.path()).hash, ha.hash) << "mode";
  ::chmod((b / "x.txt").c_str(), was.st_mode & 07777);
  ASSERT_EQ(hash_of(b.path()).hash, ha.hash);
  fs::remove(b / "link");
  fs::create_symlink("sub", b / "link");
  EXPECT_NE(hash_of(b.path()).hash, ha.hash) << "symlink target";
}

TEST(Tree, DevicesAndFifosCannotBeFrozen) {
  testing::TempDir a("tree-fifo");
  write(a / "ok", "1");
  ASSERT_EQ(::mkfifo((a / "pipe").c_str(), 0600), 0);
  UniqueFd fd(::open(a.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  auto r = hash_tree(fd.get());
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("pipe"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace agentbox::workspace
