// Workspace archives (workspace/archive.h). The hostile cases are shared/SECURITY.md T5: each
// archive is built here with libarchive itself (so it says exactly what an attacker can make
// it say), handed to extract_archive(), and the test asserts it is refused (or neutralised) and
// that nothing appeared outside the target directory.

#include "workspace/archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "support/support.h"

namespace agentbox::workspace {
namespace {

namespace fs = std::filesystem;

constexpr uid_t kOwner = 43210;

using testing::TempDir;

std::string random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

void write_file(const std::string& path, const std::string& data, mode_t mode) {
  std::ofstream(path, std::ios::binary) << data;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One entry of a hand-made archive.
struct TarEntry {
  std::string name;
  mode_t type = AE_IFREG;
  std::string data;
  mode_t perm = 0644;
  std::string symlink;             // AE_IFLNK target
  std::string hardlink;            // makes it a hard link entry
  std::optional<la_int64_t> size;  // declared size (defaults to data.size())
};

enum class Filter { kZstd, kNone, kGzip };

// Writes `entries` as a pax tar (compressed with `filter`) to `path`.
void make_archive(const std::string& path, const std::vector<TarEntry>& entries,
                  Filter filter = Filter::kZstd) {
  struct archive* a = archive_write_new();
  ASSERT_NE(a, nullptr);
  if (filter == Filter::kZstd) {
    ASSERT_EQ(archive_write_add_filter_zstd(a), ARCHIVE_OK);
  }
  if (filter == Filter::kGzip) {
    ASSERT_EQ(archive_write_add_filter_gzip(a), ARCHIVE_OK);
  }
  ASSERT_EQ(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
  ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK) << archive_error_string(a);
  for (const TarEntry& t : entries) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, t.name.c_str());
    archive_entry_set_filetype(e, t.type);
    archive_entry_set_perm(e, t.perm);
    if (!t.symlink.empty()) archive_entry_set_symlink(e, t.symlink.c_str());
    if (!t.hardlink.empty()) archive_entry_set_hardlink(e, t.hardlink.c_str());
    if (t.type == AE_IFCHR || t.type == AE_IFBLK) archive_entry_set_rdev(e, makedev(1, 3));
    la_int64_t size = t.size.value_or(static_cast<la_int64_t>(t.data.size()));
    if (t.type == AE_IFREG && t.hardlink.empty()) archive_entry_set_size(e, size);
    ASSERT_GE(archive_write_header(a, e), ARCHIVE_WARN)
        << t.name << ": " << archive_error_string(a);
    if (!t.data.empty()) {
      ASSERT_GE(archive_write_data(a, t.data.data(), t.data.size()), 0);
    }
    archive_entry_free(e);
  }
  ASSERT_EQ(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
}

class ArchiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    into_ = tmp_.path() + "/into";
    outside_ = tmp_.path() + "/outside";
    archive_ = tmp_.path() + "/in.tar.zst";
    ASSERT_EQ(::mkdir(into_.c_str(), 0700), 0);
    ASSERT_EQ(::mkdir(outside_.c_str(), 0700), 0);
    write_file(outside_ + "/canary", "canary", 0644);
  }

  Result<ArchiveStats> extract(const ExtractLimits& limits = {}) {
    UniqueFd afd(::open(archive_.c_str(), O_RDONLY | O_CLOEXEC));
    UniqueFd dfd(::open(into_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    EXPECT_TRUE(afd && dfd);
    return extract_archive(afd.get(), dfd.get(), limits, ArchiveOwner{kOwner, kOwner},
                           "in.tar.zst");
  }

  // Asserts `entries` is refused with `code` and the message names `needle`, and that nothing
  // outside `into_` changed.
  void expect_refused(const std::vector<TarEntry>& entries, Code code, const std::string& needle,
                      const ExtractLimits& limits = {}) {
    make_archive(archive_, entries);
    auto r = extract(limits);
    ASSERT_FALSE(r.has_value()) << "archive was extracted; it must be refused";
    EXPECT_EQ(r.error().code, code) << r.error().message;
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
    expect_outside_untouched();
  }

  void expect_outside_untouched() {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(outside_)) names.push_back(e.path().filename());
    EXPECT_EQ(names, std::vector<std::string>{"canary"});
    EXPECT_EQ(read_file(outside_ + "/canary"), "canary");
    std::vector<std::string> top;
    for (const auto& e : fs::directory_iterator(tmp_.path())) top.push_back(e.path().filename());
    std::sort(top.begin(), top.end());
    EXPECT_EQ(top, (std::vector<std::string>{"in.tar.zst", "into", "outside"}));
  }

  TempDir tmp_;
  std::string into_;
  std::string outside_;
  std::string archive_;
};

// ---- round trip ----

struct Node {
  char type;  // f d l
  mode_t perm;
  std::string data;  // file content or link target
  uid_t uid;
  time_t mtime;
};

std::map<std::string, Node> snapshot(const std::string& root) {
  std::map<std::string, Node> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    std::string p = it->path().string();
    struct stat st;
    EXPECT_EQ(::lstat(p.c_str(), &st), 0);
    Node n{'?', static_cast<mode_t>(st.st_mode & 07777), "", st.st_uid, st.st_mtime};
    if (S_ISREG(st.st_mode)) {
      n.type = 'f';
      n.data = read_file(p);
    } else if (S_ISDIR(st.st_mode)) {
      n.type = 'd';
    } else if (S_ISLNK(st.st_mode)) {
      n.type = 'l';
      n.data = fs::read_symlink(p).string();
      n.perm = 0;  // link modes mean nothing
    }
    out[p.substr(root.size())] = n;
  }
  return out;
}

TEST_F(ArchiveTest, RoundTripKeepsFilesDirsSymlinksModesAndContent) {
  std::string src = tmp_.path() + "/src";
  ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
  write_file(src + "/hello.txt", "hello\n", 0644);
  write_file(src + "/run.sh", "#!/bin/sh\necho hi\n", 0755);
  write_file(src + "/secret", "s", 0600);
  write_file(src + "/empty", "", 0640);
  // Names are bytes: UTF-8 and not-UTF-8 survive the daemon's C locale.
  write_file(src + "/h\xc3\xa9llo-\xc3\xbc.txt", "utf8", 0644);
  write_file(src + "/latin1-\xe9", "raw", 0644);
  write_file(src + "/big.bin", random_bytes(3u << 20, 7), 0644);
  ASSERT_EQ(::mkdir((src + "/sub").c_str(), 0750), 0);
  ASSERT_EQ(::mkdir((src + "/sub/deeper").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((src + "/sub/empty-dir").c_str(), 0755), 0);
  write_file(src + "/sub/deeper/n.txt", "nested", 0444);
  ASSERT_EQ(::symlink("hello.txt", (src + "/link-rel").c_str()), 0);
  ASSERT_EQ(::symlink("../hello.txt", (src + "/sub/link-up").c_str()), 0);
  ASSERT_EQ(::symlink("/workspace/hello.txt", (src + "/link-abs").c_str()), 0);
  ASSERT_EQ(::symlink("missing", (src + "/dangling").c_str()), 0);
  ASSERT_EQ(::mkfifo((src + "/fifo").c_str(), 0644), 0);  // skipped, not archived

  TempDir out;
  {
    UniqueFd ws(::open(src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    UniqueFd od(::open(out.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    auto w = write_archive(ws.get(), od.get(), "ws.tar.zst", "src");
    ASSERT_TRUE(w.has_value()) << w.error().message;
    EXPECT_EQ(w->bytes, 6u + 18u + 1u + (3u << 20) + 6u + 4u + 3u);
  }
  // Only the final name is left: the temp file was renamed.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out.path())) names.push_back(e.path().filename());
  ASSERT_EQ(names, std::vector<std::string>{"ws.tar.zst"});
  EXPECT_LT(fs::file_size(out.path() + "/ws.tar.zst"), 4u << 20);

  archive_ = out.path() + "/ws.tar.zst";
  auto r = extract();
  ASSERT_TRUE(r.has_value()) << r.error().message;

  auto before = snapshot(src);
  before.erase("/fifo");
  auto after = snapshot(into_);
  ASSERT_EQ(before.size(), after.size());
  for (const auto& [path, b] : before) {
    SCOPED_TRACE(path);
    ASSERT_TRUE(after.count(path));
    const Node& a = after.at(path);
    EXPECT_EQ(a.type, b.type);
    EXPECT_EQ(a.perm, b.perm) << std::oct << a.perm << " vs " << b.perm;
    EXPECT_EQ(a.data, b.data);
    EXPECT_EQ(a.uid, kOwner) << "extracted entries belong to the session uid";
    if (a.type == 'f') {
      EXPECT_EQ(a.mtime, b.mtime);
    }
  }
}

TEST_F(ArchiveTest, WriteRefusesToReplaceAnExistingArchiveAndLeavesNoTemp) {
  TempDir out;
  UniqueFd ws(::open(into_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  UniqueFd od(::open(out.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  write_file(out.path() + "/x.tar.zst", "old", 0600);
  auto w = write_archive(ws.get(), od.get(), "x.tar.zst", "into");
  ASSERT_FALSE(w.has_value());
  EXPECT_EQ(w.error().code, Code::kExists);
  EXPECT_EQ(read_file(out.path() + "/x.tar.zst"), "old");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out.path())) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"x.tar.zst"});
}

TEST_F(ArchiveTest, WriteStoresSymlinksWithoutFollowingThem) {
  // A session plants a link to a host file; the archive must hold the link, not the file.
  std::string src = tmp_.path() + "/src";
  ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
  ASSERT_EQ(::symlink((outside_ + "/canary").c_str(), (src + "/steal").c_str()), 0);
  ASSERT_EQ(::symlink(outside_.c_str(), (src + "/steal-dir").c_str()), 0);
  TempDir out;
  UniqueFd ws(::open(src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  UniqueFd od(::open(out.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  auto w = write_archive(ws.get(), od.get(), "a.tar.zst", "src");
  ASSERT_TRUE(w.has_value()) << w.error().message;
  EXPECT_EQ(w->bytes, 0u);
  EXPECT_EQ(w->entries, 2u);
}

// ---- hostile archives (SECURITY.md T5) ----

TEST_F(ArchiveTest, RefusesDotDotEntries) {
  expect_refused({{.name = "../../x", .data = "pwned"}}, Code::kAccess, "'..'");
  expect_refused({{.name = "../outside/canary", .data = "pwned"}}, Code::kAccess, "'..'");
  expect_refused({{.name = "a/../../outside/x", .data = "pwned"}}, Code::kAccess, "'..'");
}

TEST_F(ArchiveTest, RefusesAbsoluteEntries) {
  expect_refused({{.name = "/etc/agentbox-archive-test", .data = "pwned"}}, Code::kAccess,
                 "absolute");
  EXPECT_FALSE(fs::exists("/etc/agentbox-archive-test"));
  expect_refused({{.name = outside_ + "/x", .data = "pwned"}}, Code::kAccess, "absolute");
}

TEST_F(ArchiveTest, RefusesWritingThroughASymlinkedDirectory) {
  // d -> / then d/etc/x: the classic. Also d -> (the canary dir) then d/x.
  expect_refused({{.name = "d", .type = AE_IFLNK, .symlink = "/"},
                  {.name = "d/etc/agentbox-archive-test", .data = "pwned"}},
                 Code::kAccess, "symlink");
  EXPECT_FALSE(fs::exists("/etc/agentbox-archive-test"));
  fs::remove_all(into_);
  ASSERT_EQ(::mkdir(into_.c_str(), 0700), 0);
  expect_refused(
      {{.name = "d", .type = AE_IFLNK, .symlink = outside_}, {.name = "d/x", .data = "pwned"}},
      Code::kAccess, "symlink");
  fs::remove_all(into_);
  ASSERT_EQ(::mkdir(into_.c_str(), 0700), 0);
  // Relative link climbing out, then a directory entry through it.
  expect_refused({{.name = "up", .type = AE_IFLNK, .symlink = "../outside"},
                  {.name = "up/newdir/", .type = AE_IFDIR, .perm = 0755}},
                 Code::kAccess, "symlink");
}

TEST_F(ArchiveTest, RefusesWritingOverASymlinkEntry) {
  // f -> canary, then a regular entry f: must not write through the link.
  expect_refused({{.name = "f", .type = AE_IFLNK, .symlink = outside_ + "/canary"},
                  {.name = "f", .data = "pwned"}},
                 Code::kInvalid, "duplicate");
}

TEST_F(ArchiveTest, RefusesHardLinks) {
  expect_refused({{.name = "h", .hardlink = "/etc/passwd"}}, Code::kAccess, "hard link");
  fs::remove_all(into_);
  ASSERT_EQ(::mkdir(into_.c_str(), 0700), 0);
  expect_refused({{.name = "h", .hardlink = "../outside/canary"}}, Code::kAccess, "hard link");
  fs::remove_all(into_);
  ASSERT_EQ(::mkdir(into_.c_str(), 0700), 0);
  expect_refused({{.name = "a", .data = "x"}, {.name = "h", .hardlink = "a"}}, Code::kAccess,
                 "hard link");
}

TEST_F(ArchiveTest, RefusesDevicesFifosAndSockets) {
  expect_refused({{.name = "null", .type = AE_IFCHR}}, Code::kAccess, "character device");
  expect_refused({{.name = "sda", .type = AE_IFBLK}}, Code::kAccess, "block device");
  expect_refused({{.name = "fifo", .type = AE_IFIFO}}, Code::kAccess, "FIFO");
  // (Sockets: no tar format can even encode one, so no archive can carry one.)
  for (const char* n : {"null", "sda", "fifo"}) {
    EXPECT_FALSE(fs::exists(fs::symlink_status(into_ + "/" + n))) << n;
  }
}

TEST_F(ArchiveTest, StripsSetuidSetgidAndStickyBits) {
  make_archive(archive_, {{.name = "suid", .data = "#!/bin/sh\n", .perm = 04755},
                          {.name = "sgid", .data = "x", .perm = 02755},
                          {.name = "dir/", .type = AE_IFDIR, .perm = 03777},
                          {.name = "dir/f", .data = "y", .perm = 06644}});
  auto r = extract();
  ASSERT_TRUE(r.has_value()) << r.error().message;
  struct stat st;
  ASSERT_EQ(::stat((into_ + "/suid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  EXPECT_EQ(st.st_uid, kOwner);
  ASSERT_EQ(::stat((into_ + "/sgid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  ASSERT_EQ(::stat((into_ + "/dir").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0777u);
  ASSERT_EQ(::stat((into_ + "/dir/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
}

TEST_F(ArchiveTest, AbortsAtTheTotalByteLimit) {
  ExtractLimits limits;
  limits.max_total_bytes = 1u << 20;
  // Incompressible, so the ratio check is not what stops it.
  expect_refused({{.name = "a", .data = random_bytes(700u << 10, 1)},
                  {.name = "b", .data = random_bytes(700u << 10, 2)}},
                 Code::kTooBig, "limit", limits);
  EXPECT_FALSE(fs::exists(into_ + "/b"));
}

TEST_F(ArchiveTest, AbortsAtTheEntryLimit) {
  ExtractLimits limits;
  limits.max_entries = 50;
  std::vector<TarEntry> entries;
  for (int i = 0; i < 51; ++i) entries.push_back({.name = "f" + std::to_string(i), .data = "x"});
  expect_refused(entries, Code::kTooBig, "entries", limits);
  EXPECT_FALSE(fs::exists(into_ + "/f50"));
  // 50 is fine.
  fs::remove_all(into_);
  ASSERT_EQ(::mkdir(into_.c_str(), 0700), 0);
  entries.pop_back();
  make_archive(archive_, entries);
  auto r = extract(limits);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->entries, 50u);
}

TEST_F(ArchiveTest, AbortsAtTheDepthLimit) {
  ExtractLimits limits;
  limits.max_depth = 8;
  expect_refused({{.name = "1/2/3/4/5/6/7/8/9", .data = "deep"}}, Code::kTooBig, "levels deep",
                 limits);
  EXPECT_FALSE(fs::exists(into_ + "/1"));
}

TEST_F(ArchiveTest, AbortsAnExpansionBomb) {
  ExtractLimits limits;
  limits.max_ratio = 10;
  limits.ratio_floor_bytes = 1u << 20;
  // 16 MiB of zeros compress to a few hundred bytes.
  expect_refused({{.name = "zeros", .data = std::string(16u << 20, '\0')}}, Code::kTooBig,
                 "compressed size", limits);
  // It stopped soon after the floor, not at the end of the 16 MiB.
  struct stat st;
  if (::stat((into_ + "/zeros").c_str(), &st) == 0) {
    EXPECT_LE(st.st_size, 2 << 20);
  }
}

TEST_F(ArchiveTest, AbortsOnADeclaredSizeOverTheLimit) {
  // The header alone claims more than the limit: refused before a byte is written.
  ExtractLimits limits;
  limits.max_total_bytes = 1u << 20;
  expect_refused({{.name = "huge", .data = std::string(2u << 20, 'a')}}, Code::kTooBig,
                 "2097152 bytes", limits);
  EXPECT_FALSE(fs::exists(into_ + "/huge"));
}

TEST_F(ArchiveTest, RefusesWhatIsNotATarZst) {
  make_archive(archive_, {{.name = "a", .data = "x"}}, Filter::kNone);
  auto r = extract();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kInvalid);
  EXPECT_NE(r.error().message.find("in.tar.zst"), std::string::npos) << r.error().message;
  EXPECT_FALSE(fs::exists(into_ + "/a"));

  make_archive(archive_, {{.name = "a", .data = "x"}}, Filter::kGzip);
  r = extract();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kInvalid);

  write_file(archive_, "this is not an archive at all", 0644);
  r = extract();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kInvalid);

  write_file(archive_, "", 0644);
  r = extract();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kInvalid);
  EXPECT_TRUE(fs::is_empty(into_));
}

TEST_F(ArchiveTest, RefusesDuplicateFileEntries) {
  expect_refused({{.name = "a", .data = "first"}, {.name = "a", .data = "second"}}, Code::kInvalid,
                 "duplicate");
  EXPECT_EQ(read_file(into_ + "/a"), "first");
}

TEST_F(ArchiveTest, CreatesMissingParentsOwnedByTheSession) {
  make_archive(archive_, {{.name = "./x/y/z.txt", .data = "z"}, {.name = "./", .type = AE_IFDIR}});
  auto r = extract();
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(read_file(into_ + "/x/y/z.txt"), "z");
  struct stat st;
  ASSERT_EQ(::stat((into_ + "/x").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kOwner);
  ASSERT_EQ(::stat((into_ + "/x/y").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kOwner);
}

}  // namespace
}  // namespace agentbox::workspace
