// image/layer.h: OCI layers unpacked into overlayfs lower dirs, hostile ones refused naming the
// entry. The tars are built by tests/support/registry.h.

#include "image/layer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "common/unique_fd.h"
#include "support/registry.h"

namespace agentbox::image {
namespace {

using testing::LayerEntry;
using testing::TempDir;

struct Unpacked {
  Result<LayerStats> stats;
  std::string diff_id;
};

Unpacked unpack(const TempDir& dir, const std::vector<LayerEntry>& entries) {
  auto built = testing::build_layer(entries);
  const std::string blob = dir / "blob";
  testing::spit(blob, built.blob);
  ::mkdir((dir / "out").c_str(), 0755);
  UniqueFd b(::open(blob.c_str(), O_RDONLY | O_CLOEXEC));
  UniqueFd into(::open((dir / "out").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  Unpacked u{unpack_layer(b.get(), into.get(), built.digest), ""};
  auto d = layer_diff_id(b.get(), built.digest);
  EXPECT_TRUE(d.has_value());
  if (d) u.diff_id = *d;
  EXPECT_EQ(u.diff_id, built.diff_id);
  return u;
}

TEST(ImageLayer, FilesDirsLinksAndWhiteoutsLandAsOverlayfsExpects) {
  TempDir dir("agentbox-layer");
  LayerEntry owned = LayerEntry::file("etc/owned", "o\n", 04755);
  owned.uid = 7;
  owned.gid = 8;
  LayerEntry hard{LayerEntry::Kind::kHardlink, "etc/hard", "etc/owned", 04755};
  auto u =
      unpack(dir, {LayerEntry::dir("etc", 0750), owned, hard,
                   LayerEntry::symlink("bin", "/usr/bin"), LayerEntry::file("etc/.wh.gone", ""),
                   LayerEntry::dir("opaque"), LayerEntry::file("opaque/.wh..wh..opq", "")});
  ASSERT_TRUE(u.stats) << u.stats.error().message;
  struct stat st;
  ASSERT_EQ(::lstat((dir / "out/etc/owned").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kLayerIdBase + 7);
  EXPECT_EQ(st.st_gid, kLayerIdBase + 8);
  EXPECT_EQ(st.st_mode & 07777, 04755u) << "kept; the box's root is nosuid";
  EXPECT_EQ(st.st_nlink, 2u);
  ASSERT_EQ(::lstat((dir / "out/etc").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  ASSERT_EQ(::lstat((dir / "out/bin").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  ASSERT_EQ(::lstat((dir / "out/etc/gone").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) << "an overlayfs whiteout";
  char v[4] = {};
  EXPECT_EQ(::getxattr((dir / "out/opaque").c_str(), "trusted.overlay.opaque", v, sizeof v), 1);
  EXPECT_EQ(v[0], 'y');
}

TEST(ImageLayer, HostileEntriesAreRefusedNamingThem) {
  LayerEntry dev{LayerEntry::Kind::kCharDev, "mem", "", 0600};
  LayerEntry big = LayerEntry::file("big-id", "x");
  big.uid = 70000;
  LayerEntry hard_out{LayerEntry::Kind::kHardlink, "h", "../etc/passwd", 0644};
  LayerEntry hard_missing{LayerEntry::Kind::kHardlink, "h", "not-here", 0644};
  std::vector<std::pair<std::vector<LayerEntry>, std::string>> cases = {
      {{LayerEntry::file("../x", "x")}, "'../x'"},
      {{LayerEntry::file("a/../../x", "x")}, "'a/../../x'"},
      {{LayerEntry::file("/x", "x")}, "'/x'"},
      {{LayerEntry::symlink("l", "/etc"), LayerEntry::file("l/passwd", "x")}, "'l/passwd'"},
      {{LayerEntry::symlink("l", "."), LayerEntry::file("l/x", "x")}, "'l/x'"},
      {{dev}, "'mem'"},
      {{big}, "'big-id'"},
      {{hard_out}, "'h'"},
      {{hard_missing}, "'h'"},
      {{LayerEntry::file(".wh.", "")}, "'.wh.'"},
      {{LayerEntry::file(".wh..", "")}, "'.wh..'"},
      {{LayerEntry::file("./.wh..wh..opq", "")}, "'./.wh..wh..opq'"},
  };
  for (const auto& [entries, named] : cases) {
    SCOPED_TRACE(named);
    TempDir dir("agentbox-layer");
    auto u = unpack(dir, entries);
    ASSERT_FALSE(u.stats);
    EXPECT_EQ(u.stats.error().code, Code::kImage) << u.stats.error().message;
    EXPECT_NE(u.stats.error().message.find(named), std::string::npos) << u.stats.error().message;
  }
}

}  // namespace
}  // namespace agentbox::image
