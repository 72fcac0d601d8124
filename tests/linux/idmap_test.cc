// linux/idmap.h: the id range mapping of image layers, and the owner swap of a template build on
// an image (ImageRootSpec::owner): what a file's owner is seen as through an idmapped clone.
// Runs as root; never skips.
#include "linux/idmap.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "support/support.h"

namespace agentbox::linux {
namespace {

constexpr std::uint32_t kBase = 1u << 30;
constexpr std::uint32_t kCount = 1u << 17;

// The owner of `dir`/`name` as seen through an idmapped clone of `dir` made with `userns`.
// (`dir` belongs to kBase, as a layer dir does: its owner must be mapped for root to enter it.)
std::pair<uid_t, gid_t> seen_owner(const std::string& dir, int userns, const char* name) {
  EXPECT_EQ(::chown(dir.c_str(), kBase, kBase), 0);
  UniqueFd tree(::open_tree(AT_FDCWD, dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
  EXPECT_TRUE(tree) << std::strerror(errno);
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_IDMAP;
  attr.userns_fd = static_cast<std::uint64_t>(userns);
  EXPECT_EQ(::mount_setattr(tree.get(), "", AT_EMPTY_PATH, &attr, sizeof attr), 0)
      << std::strerror(errno);
  struct stat st {};
  EXPECT_EQ(::fstatat(tree.get(), name, &st, AT_SYMLINK_NOFOLLOW), 0)
      << name << ": " << std::strerror(errno);
  return {st.st_uid, st.st_gid};
}

TEST(Idmap, ARangeMapsDiskBasePlusIToI) {
  testing::TempDir dir("agentbox-idmap");
  for (auto [name, id] : {std::pair{"root", kBase}, std::pair{"u42", kBase + 42}}) {
    ASSERT_TRUE(testing::spit(dir / name, "x"));
    ASSERT_EQ(::chown((dir / name).c_str(), id, id), 0);
  }
  auto ns = make_idmap_userns({kBase, kBase, 0, 0}, kCount);
  ASSERT_TRUE(ns) << ns.error().message;
  EXPECT_EQ(seen_owner(dir.path(), ns->get(), "root"), (std::pair<uid_t, gid_t>{0, 0}));
  EXPECT_EQ(seen_owner(dir.path(), ns->get(), "u42"), (std::pair<uid_t, gid_t>{42, 42}));
}

TEST(Idmap, AnOwnerSwapsWithTheImageRootAndNothingElseMoves) {
  testing::TempDir dir("agentbox-idmap");
  constexpr std::uint32_t kOwner = 9000;
  for (auto [name, id] : {std::pair{"root", kBase}, std::pair{"owner", kBase + kOwner},
                          std::pair{"u42", kBase + 42}, std::pair{"u9001", kBase + 9001}}) {
    ASSERT_TRUE(testing::spit(dir / name, "x"));
    ASSERT_EQ(::chown((dir / name).c_str(), id, id), 0);
  }
  auto ns = make_idmap_userns({kBase, kBase, 0, 0}, kCount, kOwner);
  ASSERT_TRUE(ns) << ns.error().message;
  using Ids = std::pair<uid_t, gid_t>;
  EXPECT_EQ(seen_owner(dir.path(), ns->get(), "root"), (Ids{kOwner, kOwner}));
  EXPECT_EQ(seen_owner(dir.path(), ns->get(), "owner"), (Ids{0, 0}));
  EXPECT_EQ(seen_owner(dir.path(), ns->get(), "u42"), (Ids{42, 42}));
  EXPECT_EQ(seen_owner(dir.path(), ns->get(), "u9001"), (Ids{9001, 9001}));
  // An owner outside the range is refused.
  EXPECT_FALSE(make_idmap_userns({kBase, kBase, 0, 0}, kCount, kCount));
}

}  // namespace
}  // namespace agentbox::linux
