// Artifact snapshots and diffs on real directory trees.

#include "sandbox/artifacts.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace agentbox::sandbox {
namespace {

namespace fs = std::filesystem;

// A minimal PNG: signature and an IHDR chunk (what libmagic looks at).
const std::string kPng(
    "\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x06\x00\x00\x00"
    "\x1f\xf3\xff\x61",
    33);

class ArtifactsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "artifacts-XXXXXX").string();
    root_ = ::mkdtemp(tmpl.data());
    fd_ = UniqueFd(::open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(fd_.valid());
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const std::string& rel, const std::string& data) {
    fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary | std::ios::trunc) << data;
  }
  TreeSnapshot snap(const SnapshotLimits& limits = {}) {
    auto s = snapshot_tree(fd_.get(), limits);
    EXPECT_TRUE(s.has_value()) << s.error().message;
    return s.value_or(TreeSnapshot{});
  }
  std::vector<Artifact> diff(const TreeSnapshot& before) {
    return diff_artifacts(before, snap(), fd_.get(), "/workspace/out");
  }

  std::string root_;
  UniqueFd fd_;
};

std::vector<std::string> paths(const std::vector<Artifact>& a) {
  std::vector<std::string> out;
  for (const auto& x : a) out.push_back(x.path);
  return out;
}

TEST_F(ArtifactsTest, ReportsNewFilesWithSizeAndMimeTypeSortedByPath) {
  TreeSnapshot before = snap();
  write("z.txt", "hello, plain text\n");
  write("cat.png", kPng);
  write("sub/deeper/notes.txt", "nested\n");
  auto a = diff(before);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(paths(a), (std::vector<std::string>{"/workspace/out/cat.png",
                                                "/workspace/out/sub/deeper/notes.txt",
                                                "/workspace/out/z.txt"}));
  EXPECT_EQ(a[0].mime_type, "image/png");
  EXPECT_EQ(a[0].size, kPng.size());
  EXPECT_EQ(a[1].mime_type, "text/plain");
  EXPECT_EQ(a[2].mime_type, "text/plain");
  EXPECT_EQ(a[2].size, 18u);
}

TEST_F(ArtifactsTest, UnchangedFilesAreNotReportedModifiedOnesAre) {
  write("same.txt", "same\n");
  write("grows.txt", "a\n");
  write("touched.txt", "same size\n");
  write("replaced.txt", "12345\n");
  TreeSnapshot before = snap();

  write("grows.txt", "a\nb\n");
  // Same size, new mtime.
  std::string touched = root_ + "/touched.txt";
  timespec times[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, touched.c_str(), times, 0), 0);
  // Same size and mtime, but a different file (replaced by rename).
  struct stat old_st;
  ASSERT_EQ(::stat((root_ + "/replaced.txt").c_str(), &old_st), 0);
  write("tmp.txt", "54321\n");
  timespec same[2] = {{0, UTIME_OMIT}, old_st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, (root_ + "/tmp.txt").c_str(), same, 0), 0);
  fs::rename(root_ + "/tmp.txt", root_ + "/replaced.txt");

  EXPECT_EQ(paths(diff(before)),
            (std::vector<std::string>{"/workspace/out/grows.txt", "/workspace/out/replaced.txt",
                                      "/workspace/out/touched.txt"}));
}

TEST_F(ArtifactsTest, DeletedFilesAreNotArtifacts) {
  write("gone.txt", "bye\n");
  TreeSnapshot before = snap();
  fs::remove(root_ + "/gone.txt");
  EXPECT_TRUE(diff(before).empty());
}

TEST_F(ArtifactsTest, SymlinksAreNeitherFollowedNorReported) {
  TreeSnapshot before = snap();
  // A link to a directory outside (with files in it) and a link to a file outside.
  fs::create_directory_symlink("/etc", root_ + "/etc-link");
  fs::create_symlink("/etc/passwd", root_ + "/passwd-link");
  write("real.txt", "real\n");
  TreeSnapshot after = snap();
  EXPECT_EQ(after.files.size(), 1u);
  EXPECT_EQ(paths(diff_artifacts(before, after, fd_.get(), "/w")),
            (std::vector<std::string>{"/w/real.txt"}));
}

TEST_F(ArtifactsTest, FileSwappedForASymlinkAfterTheSnapshotIsDropped) {
  TreeSnapshot before = snap();
  write("sub/secret.txt", "x\n");
  TreeSnapshot after = snap();
  // The agent replaces the directory by a symlink to /etc between the walk and the sniffing.
  fs::remove_all(root_ + "/sub");
  fs::create_directory_symlink("/etc", root_ + "/sub");
  write("sub2/x", "");
  EXPECT_TRUE(diff_artifacts(before, after, fd_.get(), "/w").empty());
}

TEST_F(ArtifactsTest, FifosAndOtherSpecialFilesAreIgnored) {
  TreeSnapshot before = snap();
  ASSERT_EQ(::mkfifo((root_ + "/pipe").c_str(), 0644), 0);
  EXPECT_TRUE(diff(before).empty());
}

TEST_F(ArtifactsTest, WalkIsBounded) {
  for (int i = 0; i < 20; ++i) write("f" + std::to_string(i), "x");
  TreeSnapshot limited = snap(SnapshotLimits{.max_files = 5});
  EXPECT_EQ(limited.files.size(), 5u);
  EXPECT_FALSE(limited.complete);
  EXPECT_TRUE(snap().complete);

  std::string deep;
  for (int i = 0; i < 5; ++i) deep += "d/";
  write(deep + "bottom.txt", "x");
  TreeSnapshot shallow = snap(SnapshotLimits{.max_depth = 3});
  EXPECT_FALSE(shallow.complete);
  EXPECT_EQ(shallow.files.count(deep + "bottom.txt"), 0u);
  EXPECT_EQ(snap().files.count(deep + "bottom.txt"), 1u);
}

TEST_F(ArtifactsTest, ArtifactDirWithTrailingSlashGivesCleanPaths) {
  TreeSnapshot before = snap();
  write("a.txt", "a\n");
  EXPECT_EQ(paths(diff_artifacts(before, snap(), fd_.get(), "/workspace/out/")),
            (std::vector<std::string>{"/workspace/out/a.txt"}));
}

TEST_F(ArtifactsTest, SnapshotOfAFileFdFails) {
  write("plain", "x");
  UniqueFd file(::open((root_ + "/plain").c_str(), O_RDONLY | O_CLOEXEC));
  auto s = snapshot_tree(file.get());
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.error().code, Code::kNotDir);
}

TEST(MimeType, DetectsCommonTypes) {
  std::string tmpl = (fs::temp_directory_path() / "mime-XXXXXX").string();
  int raw = ::mkstemp(tmpl.data());
  ASSERT_GE(raw, 0);
  UniqueFd fd(raw);
  ::unlink(tmpl.c_str());
  ASSERT_EQ(::write(fd.get(), "%PDF-1.4\n%\xe2\xe3\xcf\xd3\n", 15), 15);
  ::lseek(fd.get(), 0, SEEK_SET);
  EXPECT_EQ(detect_mime_type(fd.get()), "application/pdf");
}

}  // namespace
}  // namespace agentbox::sandbox
