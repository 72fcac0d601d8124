// sandbox/dir_watch.h: inotify on a directory tree, with events named and typed as E2B's envd
// reports them, new and moved-in subdirectories followed, and nothing outside the tree watched.

#include "sandbox/dir_watch.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "support/support.h"

namespace agentbox::sandbox {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;

std::string op_name(WatchOp op) {
  switch (op) {
    case WatchOp::kCreate: return "create";
    case WatchOp::kWrite: return "write";
    case WatchOp::kRemove: return "remove";
    case WatchOp::kRename: return "rename";
    case WatchOp::kChmod: return "chmod";
  }
  return "?";
}

std::unique_ptr<DirWatch> watch(const std::string& dir, bool recursive, std::size_t max_dirs = 64) {
  UniqueFd fd(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  EXPECT_TRUE(fd);
  auto w = DirWatch::open(std::move(fd), "/workspace/w", {recursive, max_dirs});
  EXPECT_TRUE(w) << (w ? "" : w.error().message);
  return w ? std::move(*w) : nullptr;
}

// "op name" lines of everything that arrives within `quiet` of the previous event.
std::vector<std::string> drain(DirWatch* w, std::chrono::milliseconds quiet = 300ms) {
  std::vector<std::string> out;
  for (;;) {
    pollfd p{w->fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(quiet.count())) <= 0) break;
    std::vector<WatchEvent> evs;
    auto alive = w->read(&evs);
    EXPECT_TRUE(alive) << (alive ? "" : alive.error().message);
    for (const auto& e : evs) out.push_back(op_name(e.op) + " " + e.name + (e.is_dir ? "/" : ""));
    if (!alive || !*alive) {
      out.push_back("gone");
      break;
    }
  }
  return out;
}

bool has(const std::vector<std::string>& evs, const std::string& e) {
  return std::find(evs.begin(), evs.end(), e) != evs.end();
}

std::string joined(const std::vector<std::string>& evs) {
  std::string s;
  for (const auto& e : evs) s += e + "; ";
  return s;
}

TEST(E2bFilesDirWatch, FlatWatchReportsEachOperationByRelativeName) {
  TempDir tmp("e2bfs-watch");
  auto w = watch(tmp.path(), false);
  ASSERT_TRUE(w);
  ASSERT_TRUE(testing::spit(tmp / "a.txt", "one"));
  ASSERT_EQ(::chmod((tmp / "a.txt").c_str(), 0600), 0);
  ASSERT_EQ(::rename((tmp / "a.txt").c_str(), (tmp / "b.txt").c_str()), 0);
  ASSERT_EQ(::mkdir((tmp / "sub").c_str(), 0755), 0);
  ASSERT_TRUE(testing::spit(tmp / "sub/deep.txt", "not watched without recursive"));
  ASSERT_EQ(::unlink((tmp / "b.txt").c_str()), 0);
  auto evs = drain(w.get());
  SCOPED_TRACE(joined(evs));
  EXPECT_TRUE(has(evs, "create a.txt"));
  EXPECT_TRUE(has(evs, "write a.txt"));
  EXPECT_TRUE(has(evs, "chmod a.txt"));
  EXPECT_TRUE(has(evs, "rename a.txt"));
  EXPECT_TRUE(has(evs, "create b.txt"));
  EXPECT_TRUE(has(evs, "create sub/"));
  EXPECT_TRUE(has(evs, "remove b.txt"));
  for (const auto& e : evs) EXPECT_EQ(e.find("deep"), std::string::npos) << e;
}

TEST(E2bFilesDirWatch, AtomicWritesShowAsTheFileAppearing) {
  TempDir tmp("e2bfs-watch");
  auto w = watch(tmp.path(), false);
  ASSERT_TRUE(w);
  ASSERT_TRUE(testing::spit(tmp / ".agentbox-tmp-abc123", "whole"));
  ASSERT_EQ(::rename((tmp / ".agentbox-tmp-abc123").c_str(), (tmp / "done.txt").c_str()), 0);
  auto evs = drain(w.get());
  EXPECT_EQ(evs, std::vector<std::string>{"create done.txt"}) << joined(evs);
}

TEST(E2bFilesDirWatch, RecursiveFollowsNewAndMovedInDirectories) {
  TempDir tmp("e2bfs-watch");
  ASSERT_EQ(::mkdir((tmp / "w").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((tmp / "w/old").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((tmp / "outside").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((tmp / "outside/tree").c_str(), 0755), 0);
  auto w = watch(tmp / "w", true);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->watched_dirs(), 2u);
  ASSERT_TRUE(testing::spit(tmp / "w/old/x", "1"));
  ASSERT_EQ(::mkdir((tmp / "w/new").c_str(), 0755), 0);
  // Made before its directory's watch could be there: reported as created all the same.
  ASSERT_EQ(::mkdir((tmp / "w/gap").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((tmp / "w/gap/inner").c_str(), 0755), 0);
  ASSERT_TRUE(testing::spit(tmp / "w/gap/inner/early", "0"));
  auto first = drain(w.get());
  ASSERT_TRUE(testing::spit(tmp / "w/new/y", "2"));
  // A tree moved in is watched from then on; one moved out is not.
  ASSERT_EQ(::rename((tmp / "outside/tree").c_str(), (tmp / "w/tree").c_str()), 0);
  auto second = drain(w.get());
  ASSERT_TRUE(testing::spit(tmp / "w/tree/z", "3"));
  ASSERT_EQ(::rename((tmp / "w/old").c_str(), (tmp / "outside/old").c_str()), 0);
  auto third = drain(w.get());
  ASSERT_TRUE(testing::spit(tmp / "outside/old/after", "4"));
  auto fourth = drain(w.get());
  std::vector<std::string> evs = first;
  for (auto* v : {&second, &third}) evs.insert(evs.end(), v->begin(), v->end());
  SCOPED_TRACE(joined(evs));
  EXPECT_TRUE(has(evs, "create old/x"));
  EXPECT_TRUE(has(evs, "create new/"));
  EXPECT_TRUE(has(evs, "create gap/inner/"));
  EXPECT_TRUE(has(evs, "create gap/inner/early"));
  EXPECT_TRUE(has(evs, "create new/y"));
  EXPECT_TRUE(has(evs, "write new/y"));
  EXPECT_TRUE(has(evs, "create tree/"));
  EXPECT_TRUE(has(evs, "create tree/z"));
  EXPECT_TRUE(has(evs, "rename old/"));
  EXPECT_TRUE(fourth.empty()) << joined(fourth);
}

TEST(E2bFilesDirWatch, SymlinkedDirectoriesAreNotFollowed) {
  TempDir tmp("e2bfs-watch");
  ASSERT_EQ(::mkdir((tmp / "w").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((tmp / "secret").c_str(), 0755), 0);
  ASSERT_EQ(::symlink((tmp / "secret").c_str(), (tmp / "w/link").c_str()), 0);
  auto w = watch(tmp / "w", true);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->watched_dirs(), 1u);
  ASSERT_TRUE(testing::spit(tmp / "secret/s", "never reported"));
  EXPECT_TRUE(drain(w.get()).empty());
}

TEST(E2bFilesDirWatch, RemovingTheWatchedDirectoryEndsTheWatch) {
  TempDir tmp("e2bfs-watch");
  ASSERT_EQ(::mkdir((tmp / "w").c_str(), 0755), 0);
  auto w = watch(tmp / "w", false);
  ASSERT_TRUE(w);
  ASSERT_EQ(::rmdir((tmp / "w").c_str()), 0);
  auto evs = drain(w.get());
  SCOPED_TRACE(joined(evs));
  EXPECT_TRUE(has(evs, "remove /"));
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back(), "gone");
}

TEST(E2bFilesDirWatch, TooBigATreeAndNonDirectoriesAreRefused) {
  TempDir tmp("e2bfs-watch");
  for (int i = 0; i < 5; ++i) ASSERT_EQ(::mkdir((tmp / ("d" + std::to_string(i))).c_str(), 0755), 0);
  UniqueFd fd(::open(tmp.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  auto big = DirWatch::open(std::move(fd), "/workspace/w", {true, 3});
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().code, Code::kTooBig);
  EXPECT_NE(big.error().message.find("more than 3 directories"), std::string::npos);
  ASSERT_TRUE(testing::spit(tmp / "f", ""));
  UniqueFd ffd(::open((tmp / "f").c_str(), O_PATH | O_CLOEXEC));
  auto file = DirWatch::open(std::move(ffd), "/workspace/f", {});
  ASSERT_FALSE(file);
  EXPECT_EQ(file.error().code, Code::kNotDir);
}

}  // namespace
}  // namespace agentbox::sandbox
