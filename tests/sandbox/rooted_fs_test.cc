#include "sandbox/rooted_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sandbox/path.h"

namespace agentbox::sandbox {
namespace {

using namespace std::chrono_literals;

constexpr std::string_view kCanary = "canary: must never change";

// Where the tests with thousands-deep trees run: /dev/shm when it is a tmpfs. Creating and
// removing 10,000 directories on a shared disk can stall for tens of seconds on ext4 journal
// commits while other jobs write, which says nothing about remove_all.
std::string scratch_parent() {
  struct statfs sfs {};
  if (::statfs("/dev/shm", &sfs) == 0 && sfs.f_type == TMPFS_MAGIC) return "/dev/shm";
  return "/tmp";
}

// A temp dir holding "workspace/" (the root under test) and, OUTSIDE it, a canary file and a
// canary dir that no operation through the RootedFs may touch.
class RootedFsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = parent_dir() + "/agentbox-fs-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    base_ = tmpl;
    ws_ = base_ + "/workspace";
    canary_ = base_ + "/canary.txt";
    canary_dir_ = base_ + "/canary_dir";
    ASSERT_EQ(::mkdir(ws_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(canary_dir_.c_str(), 0755), 0);
    put(canary_, kCanary);
    put(canary_dir_ + "/keep.txt", kCanary);
  }

  virtual std::string parent_dir() const { return "/tmp"; }

  void TearDown() override {
    EXPECT_EQ(get(canary_), kCanary) << "the canary outside the workspace changed";
    // rm copes with trees deeper than PATH_MAX, which a failed deep-tree test may leave.
    const std::string cmd = "rm -rf -- '" + base_ + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }

  RootedFs fs(RootMode mode = RootMode::kBeneath, std::optional<Owner> owner = std::nullopt) {
    UniqueFd root(::open(ws_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    EXPECT_TRUE(root.valid());
    return RootedFs(std::move(root), mode, owner, "/workspace");
  }

  static void put(const std::string& host_path, std::string_view data) {
    std::ofstream(host_path, std::ios::binary | std::ios::trunc) << data;
  }
  static std::string get(const std::string& host_path) {
    std::ifstream in(host_path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static bool exists(const std::string& host_path) {
    struct stat st {};
    return ::lstat(host_path.c_str(), &st) == 0;
  }
  static std::vector<std::string> names_in(const std::string& host_dir) {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(host_dir.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") out.push_back(n);
      }
      ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  static Status write(const RootedFs& fs, const std::string& path, std::string_view data,
                      WriteOptions opts = {}) {
    auto w = fs.create_file(path, opts);
    if (!w) return std::unexpected(w.error());
    if (auto s = (*w)->write(data); !s) return s;
    auto n = (*w)->commit();
    if (!n) return std::unexpected(n.error());
    EXPECT_EQ(*n, data.size());
    return {};
  }
  static Result<std::string> read(const RootedFs& fs, const std::string& path) {
    auto r = fs.open_file(path);
    if (!r) return std::unexpected(r.error());
    std::string out;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(r->fd.get(), buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
    return out;
  }

  std::string base_, ws_, canary_, canary_dir_;
};

// The same layout on scratch_parent(), for trees thousands of levels deep.
class RootedFsDeepTest : public RootedFsTest {
 protected:
  std::string parent_dir() const override { return scratch_parent(); }
};

#define EXPECT_CODE(expr, c)                                                   \
  do {                                                                         \
    auto r_ = (expr);                                                          \
    ASSERT_FALSE(r_.has_value()) << #expr << " succeeded";                     \
    EXPECT_EQ(code_name(r_.error().code), code_name(c)) << r_.error().message; \
  } while (0)

// ---- escapes by "..", absolute paths, symlinks, magic links ----

TEST_F(RootedFsTest, DotDotAndAbsoluteEscapesAreRefused) {
  ASSERT_EQ(::mkdir((ws_ + "/a").c_str(), 0755), 0);
  auto f = fs();
  for (const std::string p :
       {"../canary.txt", "a/../../canary.txt", canary_.c_str(), "/etc/passwd", "..", "a/../.."}) {
    SCOPED_TRACE(p);
    EXPECT_CODE(f.open_file(p), Code::kAccess);
    EXPECT_CODE(f.stat(p), Code::kAccess);
    EXPECT_CODE(f.read_dir(p), Code::kAccess);
    EXPECT_CODE(f.open_dir(p), Code::kAccess);
  }
  EXPECT_CODE(write(f, "../canary.txt", "pwned"), Code::kAccess);
  EXPECT_CODE(write(f, "a/../../canary.txt", "pwned"), Code::kAccess);
  EXPECT_CODE(write(f, "../evil.txt", "pwned", {.mkdirs = true}), Code::kAccess);
  EXPECT_CODE(f.mkdir_all("../evil_dir/x"), Code::kAccess);
  EXPECT_CODE(f.remove("../canary.txt"), Code::kAccess);
  EXPECT_CODE(f.remove_all("../canary_dir"), Code::kAccess);
  EXPECT_CODE(f.rename("../canary.txt", "stolen"), Code::kAccess);
  ASSERT_TRUE(write(f, "mine", "x"));
  EXPECT_CODE(f.rename("mine", "../canary.txt"), Code::kAccess);
  EXPECT_EQ(names_in(base_), (std::vector<std::string>{"canary.txt", "canary_dir", "workspace"}));
  EXPECT_EQ(names_in(canary_dir_), std::vector<std::string>{"keep.txt"});
}

TEST_F(RootedFsTest, ErrorMessagesNameTheAgentPathNotTheHostPath) {
  auto f = fs();
  auto r = f.open_file("nope/missing.txt");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kNotFound);
  EXPECT_NE(r.error().message.find("/workspace/nope/missing.txt"), std::string::npos)
      << r.error().message;
  EXPECT_EQ(r.error().message.find(base_), std::string::npos) << r.error().message;
}

TEST_F(RootedFsTest, SymlinksLeavingTheRootAreRefused) {
  ASSERT_EQ(::symlink(canary_.c_str(), (ws_ + "/abs").c_str()), 0);
  ASSERT_EQ(::symlink("../canary.txt", (ws_ + "/rel").c_str()), 0);
  ASSERT_EQ(::symlink("/", (ws_ + "/slash").c_str()), 0);
  ASSERT_EQ(::symlink(canary_dir_.c_str(), (ws_ + "/outdir").c_str()), 0);
  ASSERT_EQ(::symlink("/proc/self/root", (ws_ + "/magic").c_str()), 0);
  auto f = fs();
  for (const char* p : {"abs", "rel", "slash/etc/passwd", "magic/etc/passwd", "outdir/keep.txt"}) {
    SCOPED_TRACE(p);
    EXPECT_CODE(f.open_file(p), Code::kAccess);
  }
  for (const char* p : {"slash", "outdir", "magic"}) {
    SCOPED_TRACE(p);
    EXPECT_CODE(f.read_dir(p), Code::kAccess);
  }
  EXPECT_CODE(write(f, "outdir/new.txt", "pwned"), Code::kAccess);
  EXPECT_CODE(write(f, "slash/tmp/new.txt", "pwned"), Code::kAccess);
  EXPECT_CODE(f.mkdir_all("outdir/sub"), Code::kAccess);
  EXPECT_CODE(f.remove("outdir/keep.txt"), Code::kAccess);
  EXPECT_CODE(f.remove_all("outdir/keep.txt"), Code::kAccess);
  EXPECT_CODE(f.rename("outdir/keep.txt", "stolen"), Code::kAccess);
  EXPECT_EQ(names_in(canary_dir_), std::vector<std::string>{"keep.txt"});
  // stat does not follow the final link: it reports the link itself.
  auto st = f.stat("abs");
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_TRUE(st->is_symlink);
  EXPECT_EQ(st->name, "abs");
}

TEST_F(RootedFsTest, WritingToAPlantedSymlinkReplacesTheLinkNotTheTarget) {
  ASSERT_EQ(::symlink(canary_.c_str(), (ws_ + "/s").c_str()), 0);
  auto f = fs();
  ASSERT_TRUE(write(f, "s", "new content"));
  EXPECT_EQ(get(canary_), kCanary);
  struct stat st {};
  ASSERT_EQ(::lstat((ws_ + "/s").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(get(ws_ + "/s"), "new content");
}

TEST_F(RootedFsTest, WritingToAPlantedHardLinkLeavesTheOtherName) {
  ASSERT_EQ(::link(canary_.c_str(), (ws_ + "/h").c_str()), 0);
  auto f = fs();
  ASSERT_TRUE(write(f, "h", "new content"));
  EXPECT_EQ(get(ws_ + "/h"), "new content");
  EXPECT_EQ(get(canary_), kCanary);
}

TEST_F(RootedFsTest, RemovingASymlinkRemovesTheLinkOnly) {
  ASSERT_EQ(::symlink(canary_.c_str(), (ws_ + "/s").c_str()), 0);
  ASSERT_EQ(::symlink(canary_dir_.c_str(), (ws_ + "/d").c_str()), 0);
  auto f = fs();
  ASSERT_TRUE(f.remove("s"));
  ASSERT_TRUE(f.remove_all("d"));
  EXPECT_FALSE(exists(ws_ + "/s"));
  EXPECT_FALSE(exists(ws_ + "/d"));
  EXPECT_EQ(names_in(canary_dir_), std::vector<std::string>{"keep.txt"});
}

TEST_F(RootedFsTest, MagicLinksAreRefusedEvenWhenTheRootIsSlash) {
  // With the real "/" as an in-root root, /proc is reachable, so only RESOLVE_NO_MAGICLINKS
  // stands between a path and /proc/self/root's jump.
  RootedFs slash(UniqueFd(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)), RootMode::kInRoot);
  ASSERT_TRUE(read(slash, "/etc/passwd"));
  EXPECT_CODE(slash.open_file("/proc/self/root/etc/passwd"), Code::kAccess);
  EXPECT_CODE(slash.open_file("/proc/self/cwd/" + canary_), Code::kAccess);
  EXPECT_CODE(slash.read_dir("/proc/1/root"), Code::kAccess);

  RootedFs proc(UniqueFd(::open("/proc/self", O_PATH | O_DIRECTORY | O_CLOEXEC)),
                RootMode::kBeneath);
  EXPECT_CODE(proc.open_dir("root"), Code::kAccess);
  EXPECT_CODE(proc.open_dir("cwd"), Code::kAccess);

  // Even a magic link that lands on the same mount, inside the root, is refused. (Kernels up to
  // at least 6.x refuse every magic-link jump in scoped lookups; RESOLVE_NO_MAGICLINKS keeps it
  // so should that ever be relaxed.)
  RootedFs procfs(UniqueFd(::open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC)), RootMode::kBeneath);
  UniqueFd status(::open("/proc/self/status", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(status.valid());
  ASSERT_TRUE(procfs.open_file("self/status"));
  EXPECT_CODE(procfs.open_file("self/fd/" + std::to_string(status.get())), Code::kAccess);
}

TEST_F(RootedFsTest, SymlinksStayingInsideAreFollowed) {
  ASSERT_EQ(::mkdir((ws_ + "/d").c_str(), 0755), 0);
  put(ws_ + "/d/real.txt", "real");
  ASSERT_EQ(::symlink("d/real.txt", (ws_ + "/link").c_str()), 0);
  ASSERT_EQ(::symlink("d", (ws_ + "/dlink").c_str()), 0);
  ASSERT_EQ(::symlink("../d/real.txt", (ws_ + "/d/up").c_str()), 0);
  auto f = fs();
  EXPECT_EQ(read(f, "link").value_or("<error>"), "real");
  EXPECT_EQ(read(f, "d/up").value_or("<error>"), "real");
  EXPECT_EQ(read(f, "dlink/real.txt").value_or("<error>"), "real");
  auto entries = f.read_dir("dlink");
  ASSERT_TRUE(entries) << entries.error().message;
  ASSERT_EQ(entries->size(), 2u);
  ASSERT_TRUE(write(f, "dlink/new.txt", "n"));
  EXPECT_EQ(get(ws_ + "/d/new.txt"), "n");
  ASSERT_TRUE(f.mkdir_all("dlink/sub/subsub"));
  struct stat st {};
  EXPECT_EQ(::stat((ws_ + "/d/sub/subsub").c_str(), &st), 0);
}

// ---- kInRoot: "/" and ".." clamp to the root ----

TEST_F(RootedFsTest, InRootAbsolutePathsAndDotDotClampToTheRoot) {
  ASSERT_EQ(::mkdir((ws_ + "/etc").c_str(), 0755), 0);
  put(ws_ + "/etc/passwd", "box passwd");
  ASSERT_EQ(::symlink("/etc/passwd", (ws_ + "/abs").c_str()), 0);
  ASSERT_EQ(::symlink("/", (ws_ + "/slash").c_str()), 0);
  auto f = fs(RootMode::kInRoot);
  for (const char* p :
       {"/etc/passwd", "etc/passwd", "../../etc/passwd", "/../etc/passwd",
        "/etc/../../../etc/passwd", "abs", "slash/etc/passwd", "slash/../slash/etc/passwd"}) {
    EXPECT_EQ(read(f, p).value_or("<error>"), "box passwd") << p;
  }
  ASSERT_TRUE(write(f, "/../../tmp.txt", "x"));
  EXPECT_EQ(get(ws_ + "/tmp.txt"), "x");
  ASSERT_TRUE(f.mkdir_all("/../a/../b"));
  EXPECT_TRUE(exists(ws_ + "/b"));
  EXPECT_CODE(f.remove("/"), Code::kAccess);
  EXPECT_CODE(f.remove_all("/.."), Code::kAccess);
  EXPECT_CODE(f.rename("/", "x"), Code::kAccess);
  EXPECT_CODE(f.rename("tmp.txt", "/"), Code::kAccess);
  // The absolute host path of the canary means <root>/<that path> here: not there.
  EXPECT_CODE(f.open_file(canary_), Code::kNotFound);
}

// ---- reading ----

TEST_F(RootedFsTest, OpenFileRefusesNonRegularFilesWithoutHanging) {
  ASSERT_EQ(::mkfifo((ws_ + "/fifo").c_str(), 0644), 0);
  ASSERT_EQ(::mkdir((ws_ + "/dir").c_str(), 0755), 0);
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock_path = ws_ + "/sock";
  ASSERT_LT(sock_path.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, sock_path.c_str(), sock_path.size() + 1);
  ASSERT_EQ(::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  auto f = fs();

  // Off-thread, so a regression shows up as a failure rather than a hung test binary.
  auto fifo = std::async(std::launch::async, [&] { return f.open_file("fifo"); });
  if (fifo.wait_for(10s) != std::future_status::ready) {
    UniqueFd unblock(::open((ws_ + "/fifo").c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
    FAIL() << "open_file on a FIFO blocked";
  }
  EXPECT_CODE(fifo.get(), Code::kInvalid);
  EXPECT_CODE(f.open_file("sock"), Code::kInvalid);
  EXPECT_CODE(f.open_file("dir"), Code::kIsDir);
  EXPECT_CODE(f.open_file(""), Code::kIsDir);

  RootedFs slash(UniqueFd(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)), RootMode::kInRoot);
  EXPECT_CODE(slash.open_file("/dev/zero"), Code::kInvalid);
}

TEST_F(RootedFsTest, OpenFileReportsSizeAndBlockingReads) {
  put(ws_ + "/a.txt", "hello");
  auto f = fs();
  auto r = f.open_file("a.txt");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->size, 5u);
  EXPECT_EQ(::fcntl(r->fd.get(), F_GETFL) & O_NONBLOCK, 0);
  EXPECT_NE(::fcntl(r->fd.get(), F_GETFD) & FD_CLOEXEC, 0);
}

TEST_F(RootedFsTest, ReadDirIsSortedBoundedAndTakesAnyName) {
  const std::vector<std::string> names = {
      "b", "a", "new\nline", "\xff\xfe-not-utf8", "C", std::string(255, 'z')};
  for (const auto& n : names) put(ws_ + "/" + n, n);
  ASSERT_EQ(::mkdir((ws_ + "/sub").c_str(), 0750), 0);
  ASSERT_EQ(::symlink("/", (ws_ + "/link").c_str()), 0);
  auto f = fs();
  auto entries = f.read_dir("");
  ASSERT_TRUE(entries) << entries.error().message;
  std::vector<std::string> got;
  for (const auto& e : *entries) got.push_back(e.name);
  std::vector<std::string> want = names;
  want.push_back("sub");
  want.push_back("link");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
  for (const auto& e : *entries) {
    if (e.name == "sub") {
      EXPECT_TRUE(e.is_dir);
      EXPECT_EQ(e.mode & 07777, 0750u);
    } else if (e.name == "link") {
      EXPECT_TRUE(e.is_symlink);
      EXPECT_FALSE(e.is_dir);
    } else {
      EXPECT_FALSE(e.is_dir);
      EXPECT_EQ(e.size, e.name.size());
      EXPECT_GT(e.mod_time_ns, 0);
    }
  }
  EXPECT_TRUE(f.read_dir("", want.size()));
  EXPECT_CODE(f.read_dir("", want.size() - 1), Code::kTooBig);
  EXPECT_CODE(f.read_dir("a"), Code::kNotDir);
  EXPECT_CODE(f.read_dir("missing"), Code::kNotFound);
}

TEST_F(RootedFsTest, StatReportsFilesDirsAndTheRoot) {
  put(ws_ + "/f", "12345");
  ASSERT_EQ(::mkdir((ws_ + "/d").c_str(), 0755), 0);
  auto f = fs();
  auto st = f.stat("d/../f");
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(st->size, 5u);
  EXPECT_EQ(st->name, "f");
  EXPECT_EQ(st->path, "d/../f");
  EXPECT_FALSE(st->is_dir);
  EXPECT_TRUE(S_ISREG(st->mode));
  st = f.stat("d");
  ASSERT_TRUE(st);
  EXPECT_TRUE(st->is_dir);
  st = f.stat("");
  ASSERT_TRUE(st);
  EXPECT_TRUE(st->is_dir);
  EXPECT_CODE(f.stat("nope"), Code::kNotFound);
  EXPECT_CODE(f.stat(std::string("f\0/../../x", 10)), Code::kInvalid);
  EXPECT_CODE(f.stat(std::string(kMaxPathBytes + 1, 'a')), Code::kTooBig);
  EXPECT_CODE(f.stat(std::string(256, 'a')), Code::kTooBig);  // NAME_MAX
}

// ---- atomic writes ----

TEST_F(RootedFsTest, WriteCreatesAndReplacesAtomically) {
  auto f = fs();
  ASSERT_TRUE(write(f, "a.txt", "first"));
  EXPECT_EQ(get(ws_ + "/a.txt"), "first");
  ASSERT_TRUE(write(f, "a.txt", "second, longer"));
  EXPECT_EQ(get(ws_ + "/a.txt"), "second, longer");
  ASSERT_TRUE(write(f, "empty", ""));
  EXPECT_EQ(get(ws_ + "/empty"), "");
  EXPECT_EQ(names_in(ws_), (std::vector<std::string>{"a.txt", "empty"}));
}

TEST_F(RootedFsTest, ConcurrentReadersSeeTheOldOrTheNewContentNeverAMix) {
  auto f = fs();
  const std::string a(256 * 1024, 'a');
  const std::string b(128 * 1024, 'b');
  ASSERT_TRUE(write(f, "x", a));
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!stop.load()) {
      auto r = read(f, "x");
      if (!r || !(*r == a || *r == b)) ++torn;
      ++reads;
    }
  });
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(write(f, "x", i % 2 ? a : b));
  while (reads.load() < 10) std::this_thread::sleep_for(1ms);
  stop = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0) << "of " << reads.load() << " reads";
}

TEST_F(RootedFsTest, AnUncommittedWriteLeavesTheTargetAndNoTempFile) {
  put(ws_ + "/t.txt", "old");
  auto f = fs();
  {
    auto w = f.create_file("t.txt", {});
    ASSERT_TRUE(w) << w.error().message;
    ASSERT_TRUE((*w)->write("half of the new"));
    EXPECT_EQ(names_in(ws_).size(), 2u);  // the temp file exists while writing
    EXPECT_EQ(get(ws_ + "/t.txt"), "old");
  }
  EXPECT_EQ(get(ws_ + "/t.txt"), "old");
  EXPECT_EQ(names_in(ws_), std::vector<std::string>{"t.txt"});
}

TEST_F(RootedFsTest, WritingPastMaxBytesIsTooBigAndLeavesTheTarget) {
  put(ws_ + "/t.txt", "old");
  auto f = fs();
  auto w = f.create_file("t.txt", {.max_bytes = 10});
  ASSERT_TRUE(w);
  ASSERT_TRUE((*w)->write("123456"));
  EXPECT_CODE((*w)->write("78901"), Code::kTooBig);
  EXPECT_FALSE((*w)->commit());
  w->reset();
  EXPECT_EQ(get(ws_ + "/t.txt"), "old");
  EXPECT_EQ(names_in(ws_), std::vector<std::string>{"t.txt"});
  // Exactly at the limit is fine.
  ASSERT_TRUE(write(f, "t.txt", "1234567890", {.max_bytes = 10}));
  EXPECT_EQ(get(ws_ + "/t.txt"), "1234567890");
}

TEST_F(RootedFsTest, WriteParentsAndDirectories) {
  ASSERT_EQ(::mkdir((ws_ + "/d").c_str(), 0755), 0);
  auto f = fs();
  EXPECT_CODE(write(f, "missing/x.txt", "x"), Code::kNotFound);
  EXPECT_FALSE(exists(ws_ + "/missing"));
  ASSERT_TRUE(write(f, "p/q/x.txt", "x", {.mkdirs = true}));
  EXPECT_EQ(get(ws_ + "/p/q/x.txt"), "x");
  EXPECT_CODE(write(f, "d", "x"), Code::kIsDir);
  EXPECT_CODE(write(f, "", "x"), Code::kIsDir);
  EXPECT_CODE(write(f, "d/..", "x"), Code::kIsDir);
  EXPECT_CODE(write(f, "new/", "x"), Code::kIsDir);
  EXPECT_FALSE(exists(ws_ + "/new"));
  put(ws_ + "/file", "f");
  EXPECT_CODE(write(f, "file/x", "x"), Code::kNotDir);
  EXPECT_CODE(write(f, "file/x", "x", {.mkdirs = true}), Code::kNotDir);
}

TEST_F(RootedFsTest, WriteModes) {
  ::umask(022);
  auto f = fs();
  struct stat st {};
  ASSERT_TRUE(write(f, "default", "x"));
  ASSERT_EQ(::stat((ws_ + "/default").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  ASSERT_TRUE(write(f, "exec", "x", {.mode = 0777}));
  ASSERT_EQ(::stat((ws_ + "/exec").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0777u);  // exact, not masked by the umask
  ASSERT_EQ(::chmod((ws_ + "/exec").c_str(), 0640), 0);
  ASSERT_TRUE(write(f, "exec", "y"));
  ASSERT_EQ(::stat((ws_ + "/exec").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u) << "a replaced file keeps its mode";
  EXPECT_CODE(write(f, "suid", "x", {.mode = 04755}), Code::kInvalid);
  EXPECT_FALSE(exists(ws_ + "/suid"));
}

TEST_F(RootedFsTest, OwnerIsAppliedToCreatedFilesAndDirs) {
  auto f = fs(RootMode::kBeneath, Owner{12345, 23456});
  ASSERT_TRUE(write(f, "a/b/f.txt", "x", {.mkdirs = true}));
  ASSERT_TRUE(f.mkdir_all("c/d"));
  for (const char* p : {"/a", "/a/b", "/a/b/f.txt", "/c", "/c/d"}) {
    struct stat st {};
    ASSERT_EQ(::stat((ws_ + p).c_str(), &st), 0) << p;
    EXPECT_EQ(st.st_uid, 12345u) << p;
    EXPECT_EQ(st.st_gid, 23456u) << p;
  }
}

// ---- mkdir_all, remove, rename ----

TEST_F(RootedFsTest, MkdirAll) {
  auto f = fs();
  ASSERT_TRUE(f.mkdir_all("a/b/c"));
  ASSERT_TRUE(f.mkdir_all("a/b/c"));  // existing is fine
  ASSERT_TRUE(f.mkdir_all("a//./b/../b/d/"));
  EXPECT_TRUE(exists(ws_ + "/a/b/d"));
  ASSERT_TRUE(f.mkdir_all(""));
  put(ws_ + "/file", "x");
  EXPECT_CODE(f.mkdir_all("file"), Code::kNotDir);
  EXPECT_CODE(f.mkdir_all("file/sub"), Code::kNotDir);
  EXPECT_CODE(f.mkdir_all("a/../../escape"), Code::kAccess);
  EXPECT_FALSE(exists(base_ + "/escape"));
}

TEST_F(RootedFsTest, Remove) {
  put(ws_ + "/f", "x");
  ASSERT_EQ(::mkdir((ws_ + "/empty").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((ws_ + "/full").c_str(), 0755), 0);
  put(ws_ + "/full/x", "x");
  auto f = fs();
  ASSERT_TRUE(f.remove("f"));
  ASSERT_TRUE(f.remove("empty/"));
  EXPECT_CODE(f.remove("full"), Code::kNotEmpty);
  EXPECT_CODE(f.remove("f"), Code::kNotFound);
  EXPECT_EQ(names_in(ws_), std::vector<std::string>{"full"});
  for (const char* root : {"", ".", "full/..", "full/../full/.."}) {
    SCOPED_TRACE(root);
    EXPECT_CODE(f.remove(root), Code::kAccess);
    EXPECT_CODE(f.remove_all(root), Code::kAccess);
  }
  EXPECT_CODE(f.remove("full/."), Code::kInvalid);
  EXPECT_TRUE(exists(ws_ + "/full/x"));
}

TEST_F(RootedFsTest, RemoveAllRemovesTreesWithoutFollowingLinks) {
  ASSERT_EQ(::mkdir((ws_ + "/t").c_str(), 0755), 0);
  for (int i = 0; i < 20; ++i) {
    const std::string d = ws_ + "/t/d" + std::to_string(i);
    ASSERT_EQ(::mkdir(d.c_str(), 0700), 0);
    put(d + "/file", "x");
    ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0), 0);  // unreadable mode: root still removes
    ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0600), 0);
  }
  ASSERT_EQ(::symlink(canary_dir_.c_str(), (ws_ + "/t/out").c_str()), 0);
  ASSERT_EQ(::symlink("..", (ws_ + "/t/d0/up").c_str()), 0);
  ASSERT_EQ(::symlink("/", (ws_ + "/t/d1/root").c_str()), 0);
  put(ws_ + "/t/plain", "x");
  put(ws_ + "/sibling", "stays");
  auto f = fs();
  ASSERT_TRUE(f.remove_all("t"));
  EXPECT_EQ(names_in(ws_), std::vector<std::string>{"sibling"});
  EXPECT_EQ(names_in(canary_dir_), std::vector<std::string>{"keep.txt"});
  ASSERT_TRUE(f.remove_all("sibling"));  // a file is fine too
  EXPECT_CODE(f.remove_all("sibling"), Code::kNotFound);
}

TEST_F(RootedFsDeepTest, RemoveAllHandlesATenThousandDeepTreeWithFewFds) {
  constexpr int kDepth = 10000;
  {
    UniqueFd cur(::open(ws_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_EQ(::mkdirat(cur.get(), "deep", 0755), 0);
    cur = UniqueFd(::openat(cur.get(), "deep", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    for (int i = 0; i < kDepth; ++i) {
      ASSERT_EQ(::mkdirat(cur.get(), "d", 0755), 0) << i;
      if (i % 1000 == 0) {
        UniqueFd file(::openat(cur.get(), "f", O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
        ASSERT_TRUE(file.valid());
        ASSERT_EQ(::symlinkat(canary_dir_.c_str(), cur.get(), "out"), 0);
      }
      cur = UniqueFd(::openat(cur.get(), "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      ASSERT_TRUE(cur.valid()) << i;
    }
  }
  auto f = fs();
  // A handful of fds above what is open now: an implementation holding one fd per level fails
  // with EMFILE long before the bottom.
  int open_now = 0;
  for (int fd = 0; fd < 1024; ++fd) open_now += ::fcntl(fd, F_GETFD) != -1;
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(open_now + 16);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  auto s = f.remove_all("deep");
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_TRUE(names_in(ws_).empty());
  EXPECT_EQ(names_in(canary_dir_), std::vector<std::string>{"keep.txt"});
}

TEST_F(RootedFsTest, Rename) {
  put(ws_ + "/a", "A");
  put(ws_ + "/b", "B");
  ASSERT_EQ(::mkdir((ws_ + "/d").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(canary_.c_str(), (ws_ + "/s").c_str()), 0);
  auto f = fs();
  ASSERT_TRUE(f.rename("a", "d/a2"));
  EXPECT_EQ(get(ws_ + "/d/a2"), "A");
  ASSERT_TRUE(f.rename("d/a2", "b"));  // replaces
  EXPECT_EQ(get(ws_ + "/b"), "A");
  ASSERT_TRUE(f.rename("s", "s2"));  // moves the link, not its target
  char buf[256] = {};
  ASSERT_GT(::readlink((ws_ + "/s2").c_str(), buf, sizeof(buf) - 1), 0);
  EXPECT_EQ(std::string(buf), canary_);
  ASSERT_TRUE(f.rename("b", "s2"));  // replaces the link, not its target
  EXPECT_EQ(get(ws_ + "/s2"), "A");
  EXPECT_CODE(f.rename("missing", "x"), Code::kNotFound);
  EXPECT_CODE(f.rename("", "x"), Code::kAccess);
  EXPECT_CODE(f.rename("d", "d/inside"), Code::kInvalid);
}

// ---- races: a directory swapped for a symlink mid-operation ----

// Swaps host paths `a` and `b` with renameat2(RENAME_EXCHANGE) until stopped. When one of them
// is gone (removed by the code under test), `replant` may put it back, up to `replants` times.
class Exchanger {
 public:
  Exchanger(std::string a, std::string b, std::function<void()> replant = {}, int replants = 0)
      : a_(std::move(a)), b_(std::move(b)) {
    thread_ = std::thread([this, replant = std::move(replant), replants]() mutable {
      while (!stop_.load(std::memory_order_relaxed)) {
        if (::renameat2(AT_FDCWD, a_.c_str(), AT_FDCWD, b_.c_str(), RENAME_EXCHANGE) == 0) {
          swaps_.fetch_add(1, std::memory_order_relaxed);
        } else if (errno == ENOENT && replant && replants > 0) {
          --replants;
          replant();
        }
      }
    });
  }
  ~Exchanger() { stop(); }
  int stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return swaps_.load();
  }

 private:
  std::string a_, b_;
  std::atomic<bool> stop_{false};
  std::atomic<int> swaps_{0};
  std::thread thread_;
};

TEST_F(RootedFsTest, SymlinkExchangeRaceNeverWritesOutside) {
  for (RootMode mode : {RootMode::kBeneath, RootMode::kInRoot}) {
    SCOPED_TRACE(mode == RootMode::kBeneath ? "beneath" : "in-root");
    ASSERT_EQ(::mkdir((ws_ + "/d").c_str(), 0755), 0);
    ASSERT_EQ(::symlink(canary_dir_.c_str(), (ws_ + "/d2").c_str()), 0);
    auto f = fs(mode);
    int ok = 0;
    int refused = 0;
    {
      Exchanger ex(ws_ + "/d", ws_ + "/d2");
      for (int i = 0; i < 2000; ++i) {
        auto s = write(f, "d/f", "written through the race");
        if (s) {
          ++ok;
        } else {
          ++refused;
          const Code c = s.error().code;
          EXPECT_TRUE(c == Code::kAccess || c == Code::kNotFound) << s.error().message;
        }
      }
      EXPECT_GT(ex.stop(), 0);
    }
    EXPECT_EQ(ok + refused, 2000);
    EXPECT_EQ(names_in(canary_dir_), std::vector<std::string>{"keep.txt"});
    EXPECT_EQ(get(canary_dir_ + "/keep.txt"), kCanary);
    ASSERT_EQ(std::system(("rm -rf -- '" + ws_ + "/d' '" + ws_ + "/d2'").c_str()), 0);
  }
}

TEST_F(RootedFsTest, SymlinkExchangeRaceNeverReadsOutside) {
  ASSERT_EQ(::mkdir((ws_ + "/d").c_str(), 0755), 0);
  put(ws_ + "/d/keep.txt", "inside");
  ASSERT_EQ(::symlink(canary_dir_.c_str(), (ws_ + "/d2").c_str()), 0);
  auto f = fs();
  Exchanger ex(ws_ + "/d", ws_ + "/d2");
  for (int i = 0; i < 2000; ++i) {
    auto r = read(f, "d/keep.txt");
    if (r) {
      ASSERT_EQ(*r, "inside");
    }
    auto entries = f.read_dir("d");
    if (entries) {
      for (const auto& e : *entries) ASSERT_EQ(e.size, 6u);
    }
  }
  EXPECT_GT(ex.stop(), 0);
}

TEST_F(RootedFsTest, SymlinkExchangeRaceNeverRenamesOutside) {
  // A file goes into the racing dir under the canary's name and comes back out, over and over,
  // while the dir is swapped with a symlink to the canary dir. Through the symlink, the first
  // rename would replace the canary and the second would pull it into the workspace.
  for (RootMode mode : {RootMode::kBeneath, RootMode::kInRoot}) {
    SCOPED_TRACE(mode == RootMode::kBeneath ? "beneath" : "in-root");
    ASSERT_EQ(::mkdir((ws_ + "/d").c_str(), 0755), 0);
    ASSERT_EQ(::symlink(canary_dir_.c_str(), (ws_ + "/d2").c_str()), 0);
    put(ws_ + "/mine.txt", "mine");
    auto f = fs(mode);
    bool inside_d = false;
    int moves = 0;
    {
      Exchanger ex(ws_ + "/d", ws_ + "/d2");
      // At least 2000 attempts, and on until a move got through (see below).
      for (int i = 0; i < 20'000 && (i < 2000 || moves == 0); ++i) {
        auto s = inside_d ? f.rename("d/keep.txt", "mine.txt") : f.rename("mine.txt", "d/keep.txt");
        if (s) {
          ++moves;
          inside_d = !inside_d;
          if (!inside_d) {
            ASSERT_EQ(get(ws_ + "/mine.txt"), "mine") << "pulled in from outside";
          }
        } else {
          const Code c = s.error().code;
          EXPECT_TRUE(c == Code::kAccess || c == Code::kNotFound) << s.error().message;
        }
      }
      EXPECT_GT(ex.stop(), 0);
    }
    EXPECT_GT(moves, 0);
    EXPECT_EQ(names_in(canary_dir_), std::vector<std::string>{"keep.txt"});
    EXPECT_EQ(get(canary_dir_ + "/keep.txt"), kCanary);
    ASSERT_EQ(
        std::system(("rm -rf -- '" + ws_ + "/d' '" + ws_ + "/d2' '" + ws_ + "/mine.txt'").c_str()),
        0);
  }
}

TEST_F(RootedFsTest, SymlinkExchangeRaceNeverMakesDirectoriesOutside) {
  // mkdir_all through a parent that is swapped with a symlink to the canary dir.
  for (RootMode mode : {RootMode::kBeneath, RootMode::kInRoot}) {
    SCOPED_TRACE(mode == RootMode::kBeneath ? "beneath" : "in-root");
    ASSERT_EQ(::mkdir((ws_ + "/d").c_str(), 0755), 0);
    ASSERT_EQ(::symlink(canary_dir_.c_str(), (ws_ + "/d2").c_str()), 0);
    auto f = fs(mode);
    int made = 0;
    {
      Exchanger ex(ws_ + "/d", ws_ + "/d2");
      // At least 1000 attempts, and on until one got through (a loaded machine can let the
      // racer win many in a row): a race in which nothing is ever created proves little.
      for (int i = 0; i < 20'000 && (i < 1000 || made == 0); ++i) {
        auto s = f.mkdir_all("d/n" + std::to_string(i) + "/sub");
        if (s) {
          ++made;
        } else {
          const Code c = s.error().code;
          EXPECT_TRUE(c == Code::kAccess || c == Code::kNotFound) << s.error().message;
        }
      }
      EXPECT_GT(ex.stop(), 0);
    }
    EXPECT_GT(made, 0);
    EXPECT_EQ(names_in(canary_dir_), std::vector<std::string>{"keep.txt"});
    ASSERT_EQ(std::system(("rm -rf -- '" + ws_ + "/d' '" + ws_ + "/d2'").c_str()), 0);
  }
}

TEST_F(RootedFsTest, DirectoryJustMadeSwappedForASymlinkIsNotEntered) {
  // mkdir_all creates "x", then enters it to create "y": a racer swaps the fresh "x" with a
  // symlink to the canary dir in between. mkdir_all must then fail (or have entered the real
  // directory already), never create "y" in the canary dir.
  auto f = fs();
  const std::string x = ws_ + "/d/x";
  const std::string lnk = ws_ + "/lnk";
  ASSERT_EQ(::mkdir((ws_ + "/d").c_str(), 0755), 0);
  int swaps = 0;
  for (int round = 0; round < 300; ++round) {
    ASSERT_EQ(::symlink(canary_dir_.c_str(), lnk.c_str()), 0);
    {
      Exchanger ex(x, lnk);  // fails (ENOENT) until mkdir_all has made x
      auto s = f.mkdir_all("d/x/y/z");
      if (!s) {
        EXPECT_NE(s.error().code, Code::kInternal) << s.error().message;
      }
      swaps += ex.stop();
    }
    ASSERT_EQ(names_in(canary_dir_), std::vector<std::string>{"keep.txt"}) << "round " << round;
    // One of x and lnk is the real directory (rm -rf), the other the symlink (rm removes the
    // link only).
    ASSERT_EQ(std::system(("rm -rf -- '" + x + "' '" + lnk + "'").c_str()), 0);
  }
  EXPECT_GT(swaps, 0);
  EXPECT_EQ(get(canary_dir_ + "/keep.txt"), kCanary);
}

TEST_F(RootedFsTest, SymlinkExchangeRaceNeverRemovesOutside) {
  // t/x is a directory and t/y a symlink to the canary dir, swapped all the time; whichever
  // remove_all deletes is planted again, and t itself is rebuilt for the next round.
  auto f = fs();
  const std::string t = ws_ + "/t";
  auto plant = [&] {
    if (::mkdir((t + "/x").c_str(), 0755) == 0) {
      // Through an fd, not the name: "x" may already be the swapped-in symlink.
      UniqueFd x(::open((t + "/x").c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (x) UniqueFd(::openat(x.get(), "inside.txt", O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
    }
    (void)::symlink(canary_dir_.c_str(), (t + "/y").c_str());
  };
  int swaps = 0;
  {
    Exchanger ex(t + "/x", t + "/y", plant, 20'000);
    for (int round = 0; round < 500; ++round) {
      if (!exists(t)) {
        ASSERT_EQ(::mkdir(t.c_str(), 0755), 0);
        plant();
      }
      auto s = f.remove_all("t");
      if (!s) {
        const Code c = s.error().code;
        EXPECT_TRUE(c == Code::kNotEmpty || c == Code::kNotFound || c == Code::kAccess)
            << s.error().message;
      }
    }
    swaps = ex.stop();
  }
  EXPECT_GT(swaps, 0);
  EXPECT_EQ(names_in(canary_dir_), std::vector<std::string>{"keep.txt"});
}

TEST_F(RootedFsDeepTest, RemoveAllDoesNotChaseADirectoryMovedOutside) {
  // remove_all climbs with "..": if the agent moves the directory being emptied out of the
  // root, ".." is no longer the directory we came from, and remove_all must stop there instead
  // of emptying whatever is above the moved directory (here: the canaries).
  constexpr int kDepth = 3000;
  constexpr int kWatch = 2000;  // the racing thread holds this level ...
  constexpr int kGone = 500;    // ... and waits for the level this far below it to be removed
  bool raced = false;
  for (int attempt = 0; attempt < 5 && !raced; ++attempt) {
    const std::string p = ws_ + "/t/p";
    ASSERT_EQ(std::system(("mkdir -p '" + p + "'").c_str()), 0);
    UniqueFd watch;
    {
      UniqueFd cur(::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      for (int i = 0; i < kDepth; ++i) {
        ASSERT_EQ(::mkdirat(cur.get(), "d", 0755), 0);
        cur = UniqueFd(::openat(cur.get(), "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        ASSERT_TRUE(cur.valid());
        if (i == kWatch) watch = UniqueFd(::dup(cur.get()));
      }
    }
    std::string below;
    for (int i = 0; i < kGone; ++i) below += i ? "/d" : "d";
    const std::string moved = base_ + "/moved";
    std::atomic<bool> done{false};
    std::atomic<bool> moved_out{false};
    std::thread racer([&] {
      struct stat st {};
      while (!done.load() && ::fstatat(watch.get(), below.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      }
      if (!done.load() && ::rename(p.c_str(), moved.c_str()) == 0) moved_out = true;
    });
    auto s = fs().remove_all("t");
    done = true;
    racer.join();
    if (moved_out) {
      raced = true;
      ASSERT_FALSE(s) << "remove_all followed the moved directory";
      EXPECT_EQ(s.error().code, Code::kAccess) << s.error().message;
    }
    EXPECT_EQ(names_in(canary_dir_), std::vector<std::string>{"keep.txt"});
    ASSERT_TRUE(exists(ws_));
    ASSERT_TRUE(exists(canary_));
    ASSERT_EQ(std::system(("rm -rf -- '" + moved + "' '" + ws_ + "/t'").c_str()), 0);
  }
  EXPECT_TRUE(raced) << "the move never landed while remove_all was inside the tree";
}

}  // namespace
}  // namespace agentbox::sandbox
