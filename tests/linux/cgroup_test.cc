// cgroup drivers: v1 and v2 on a fake layout (plain files in a temp dir, with a CgroupFs that
// fills new directories the way the kernel does), driver detection, and the real kernel for
// every hierarchy this host has: the real suite registers itself once per usable version (v1 on
// the hybrid dev/CI machines, v2 where a cgroup2 hierarchy has the memory, cpu and pids
// controllers), so nothing skips; the CgroupHost test says which suites apply here and why.
#include "linux/cgroup.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "support/support.h"

namespace agentbox::linux {
namespace {

namespace fs = std::filesystem;

using testing::slurp;
using testing::TempDir;

void put(const std::string& path, const std::string& value) {
  std::ofstream out(path, std::ios::trunc);
  out << value;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// ---------------------------------------------------------------------------------------------
// A fake kernel for the drivers: mkdir fills the new directory with interface files and their
// default values, rmdir refuses a directory with child cgroups (EBUSY, as the kernel does) and
// otherwise removes the files with it.

struct FakeOptions {
  bool v1_memsw = true;     // v1: memory.memsw.limit_in_bytes (swap accounting)
  bool v2_swap_max = true;  // v2: memory.swap.max
  std::string v2_controllers = "cpuset cpu io memory pids\n";
};

class FakeCgroupFs final : public CgroupFs {
 public:
  FakeCgroupFs(std::string root, bool v2, FakeOptions opt)
      : root_(std::move(root)), v2_(v2), opt_(std::move(opt)) {}

  int make_dir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) != 0) return errno;
    for (const auto& [name, value] : files_for(path)) put(path + "/" + name, value);
    made_.push_back(path);
    return 0;
  }

  int remove_dir(const std::string& path) override {
    std::error_code ec;
    if (!fs::exists(path, ec)) return ENOENT;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      if (e.is_directory()) return EBUSY;
    }
    for (const auto& e : fs::directory_iterator(path, ec)) fs::remove(e.path(), ec);
    return ::rmdir(path.c_str()) == 0 ? 0 : errno;
  }

  // Lays out the hierarchy roots the kernel would mount.
  void make_roots() {
    if (v2_) {
      fill_root(root_,
                {{"cgroup.controllers", opt_.v2_controllers}, {"cgroup.subtree_control", ""}});
      return;
    }
    for (const char* h : {"memory", "cpu", "pids", "freezer"}) {
      std::string d = root_ + "/" + h;
      ::mkdir(d.c_str(), 0755);
      fill_root(d, files_for(d));
    }
  }

  const std::vector<std::string>& made() const { return made_; }

 private:
  static void fill_root(const std::string& d, const std::map<std::string, std::string>& files) {
    ::mkdir(d.c_str(), 0755);
    put(d + "/cgroup.procs", "");
    for (const auto& [name, value] : files) put(d + "/" + name, value);
  }

  std::map<std::string, std::string> files_for(const std::string& path) const {
    std::map<std::string, std::string> f{{"cgroup.procs", ""}};
    if (v2_) {
      f["cgroup.controllers"] = "cpu memory pids\n";
      f["cgroup.subtree_control"] = "";
      f["cgroup.events"] = "populated 0\nfrozen 0\n";
      f["cgroup.freeze"] = "0\n";
      f["memory.max"] = "max\n";
      f["memory.current"] = "0\n";
      f["memory.oom.group"] = "0\n";
      f["cpu.max"] = "max 100000\n";
      f["pids.max"] = "max\n";
      if (opt_.v2_swap_max) f["memory.swap.max"] = "max\n";
      return f;
    }
    std::string rel = path.substr(root_.size() + 1);
    std::string hier = rel.substr(0, rel.find('/'));
    if (hier == "memory") {
      f["memory.limit_in_bytes"] = "9223372036854771712\n";
      f["memory.usage_in_bytes"] = "0\n";
      f["memory.swappiness"] = "60\n";
      f["memory.use_hierarchy"] = "0\n";
      if (opt_.v1_memsw) f["memory.memsw.limit_in_bytes"] = "9223372036854771712\n";
    } else if (hier == "cpu") {
      f["cpu.cfs_period_us"] = "100000\n";
      f["cpu.cfs_quota_us"] = "-1\n";
    } else if (hier == "pids") {
      f["pids.max"] = "max\n";
    } else if (hier == "freezer") {
      f["freezer.state"] = "THAWED\n";
    }
    return f;
  }

  std::string root_;
  bool v2_;
  FakeOptions opt_;
  std::vector<std::string> made_;
};

constexpr CgroupLimits kLimits{64ull << 20, 50, 32};

// ---------------------------------------------------------------------------------------------
// v2 on a fake layout.

class V2Fake : public ::testing::Test {
 protected:
  void init(FakeOptions opt = {}, std::string parent = "agentbox") {
    fake_ = std::make_shared<FakeCgroupFs>(tmp_.path(), true, std::move(opt));
    fake_->make_roots();
    driver_ = make_cgroup_v2_driver(tmp_.path(), std::move(parent), fake_);
  }
  std::string at(const std::string& rel) const { return tmp_.path() + "/" + rel; }
  std::string read(const std::string& rel) const { return slurp(at(rel)); }

  TempDir tmp_;
  std::shared_ptr<FakeCgroupFs> fake_;
  std::unique_ptr<CgroupDriver> driver_;
};

TEST_F(V2Fake, CreateWritesLimitsAndHandsControllersDown) {
  init();
  EXPECT_EQ(driver_->version(), "v2");
  auto box = driver_->create("s1", kLimits);
  ASSERT_TRUE(box) << box.error().message;
  EXPECT_EQ(read("cgroup.subtree_control"), "+memory +cpu +pids");
  EXPECT_EQ(read("agentbox/cgroup.subtree_control"), "+memory +cpu +pids");
  EXPECT_EQ(read("agentbox/s1/memory.max"), std::to_string(64ull << 20));
  EXPECT_EQ(read("agentbox/s1/memory.swap.max"), "0");
  EXPECT_EQ(read("agentbox/s1/cpu.max"), "50000 100000");
  EXPECT_EQ(read("agentbox/s1/pids.max"), "32");
  // The box distributes controllers to its children, so its own processes live in a leaf.
  EXPECT_EQ(read("agentbox/s1/cgroup.subtree_control"), "+memory +cpu +pids");
  EXPECT_TRUE(fs::is_directory(at("agentbox/s1/init")));
  EXPECT_EQ((*box)->procs_path(), at("agentbox/s1/init/cgroup.procs"));
  EXPECT_EQ((*box)->describe(), at("agentbox/s1"));
  EXPECT_EQ(driver_->parent_path(), at("agentbox"));
}

TEST_F(V2Fake, ZeroMeansUnlimited) {
  init();
  auto box = driver_->create("s1", CgroupLimits{0, 0, 0});
  ASSERT_TRUE(box) << box.error().message;
  EXPECT_EQ(read("agentbox/s1/memory.max"), "max");
  EXPECT_EQ(read("agentbox/s1/cpu.max"), "max 100000");
  EXPECT_EQ(read("agentbox/s1/pids.max"), "max");
  auto big = driver_->create("s2", CgroupLimits{1, 400, 1});
  ASSERT_TRUE(big) << big.error().message;
  EXPECT_EQ(read("agentbox/s2/cpu.max"), "400000 100000");  // four CPUs' worth
}

TEST_F(V2Fake, ControllersAlreadyEnabledAreLeftAlone) {
  init();
  put(at("cgroup.subtree_control"), "cpu memory pids io\n");
  ASSERT_TRUE(driver_->create("s1", kLimits));
  EXPECT_EQ(read("cgroup.subtree_control"), "cpu memory pids io\n");
  // Only what is missing is requested.
  put(at("agentbox/cgroup.subtree_control"), "memory\n");
  ASSERT_TRUE(driver_->create("s2", kLimits));
  EXPECT_EQ(read("agentbox/cgroup.subtree_control"), "+cpu +pids");
}

TEST_F(V2Fake, MissingControllerIsUnavailableAndNamed) {
  init(FakeOptions{.v2_controllers = "cpuset cpu io pids\n"});
  auto box = driver_->create("s1", kLimits);
  ASSERT_FALSE(box);
  EXPECT_EQ(box.error().code, Code::kUnavailable);
  EXPECT_NE(box.error().message.find("memory"), std::string::npos) << box.error().message;
}

TEST_F(V2Fake, NoSwapAccountingSkipsSwapMax) {
  init(FakeOptions{.v2_swap_max = false});
  ASSERT_TRUE(driver_->create("s1", kLimits));
  EXPECT_FALSE(fs::exists(at("agentbox/s1/memory.swap.max")));
  EXPECT_EQ(read("agentbox/s1/memory.max"), std::to_string(64ull << 20));
}

TEST_F(V2Fake, ProcessesGoToLeavesAndChildrenAreOomGroups) {
  init();
  auto box = driver_->create("s1", kLimits);
  ASSERT_TRUE(box) << box.error().message;
  ASSERT_TRUE((*box)->add_process(1234));
  EXPECT_EQ(read("agentbox/s1/init/cgroup.procs"), "1234");
  EXPECT_EQ(read("agentbox/s1/cgroup.procs"), "");  // never the box itself
  auto exec = (*box)->make_child("exec-1");
  ASSERT_TRUE(exec) << exec.error().message;
  EXPECT_EQ(read("agentbox/s1/exec-1/memory.oom.group"), "1");
  ASSERT_TRUE((*exec)->add_process(55));
  EXPECT_EQ(read("agentbox/s1/exec-1/cgroup.procs"), "55");
  EXPECT_EQ((*exec)->procs_path(), at("agentbox/s1/exec-1/cgroup.procs"));
  for (const char* bad : {"init", "", ".", "..", "../x", "a/b", "x y"}) {
    auto c = (*box)->make_child(bad);
    ASSERT_FALSE(c) << bad;
    EXPECT_EQ(c.error().code, Code::kInvalid) << bad;
  }
  // A child of a child is a plain leaf too ("init" is reserved only in a box).
  EXPECT_TRUE((*exec)->make_child("init"));
}

TEST_F(V2Fake, DestroyRemovesTheTreeAndIsIdempotent) {
  init();
  auto box = driver_->create("s1", kLimits);
  ASSERT_TRUE(box);
  ASSERT_TRUE((*box)->make_child("exec-1"));
  ASSERT_TRUE((*box)->destroy());
  EXPECT_FALSE(fs::exists(at("agentbox/s1")));
  EXPECT_TRUE(fs::exists(at("agentbox")));
  EXPECT_TRUE((*box)->destroy());
}

TEST_F(V2Fake, LeftoversAreReplacedAndRemoved) {
  init();
  ASSERT_TRUE(driver_->create("s1", kLimits));
  ASSERT_TRUE(driver_->create("s2", kLimits));
  put(at("agentbox/s1/init/stale-marker"), "x");  // proves the old directory went away
  auto again = driver_->create("s1", CgroupLimits{1 << 20, 10, 5});
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_FALSE(fs::exists(at("agentbox/s1/init/stale-marker")));
  EXPECT_EQ(read("agentbox/s1/pids.max"), "5");
  auto n = make_cgroup_v2_driver(tmp_.path(), "agentbox", fake_)->remove_stale();
  ASSERT_TRUE(n) << n.error().message;
  EXPECT_EQ(*n, 2u);
  EXPECT_TRUE(fs::is_empty(at("agentbox")) ||
              std::none_of(fs::directory_iterator(at("agentbox")), fs::directory_iterator{},
                           [](const auto& e) { return e.is_directory(); }));
}

TEST_F(V2Fake, NestedParentHandsControllersDownAtEveryLevel) {
  init({}, "system.slice/agentboxd.service/boxes");
  ASSERT_TRUE(driver_->create("s1", kLimits));
  for (const char* d : {"", "system.slice/", "system.slice/agentboxd.service/",
                        "system.slice/agentboxd.service/boxes/"}) {
    EXPECT_EQ(read(std::string(d) + "cgroup.subtree_control"), "+memory +cpu +pids") << d;
  }
  EXPECT_TRUE(fs::is_directory(at("system.slice/agentboxd.service/boxes/s1/init")));
}

TEST_F(V2Fake, InvalidNamesRejected) {
  init();
  for (const char* bad : {"", ".", "..", "a/b", "../../etc", "x\n"}) {
    auto b = driver_->create(bad, kLimits);
    ASSERT_FALSE(b) << bad;
    EXPECT_EQ(b.error().code, Code::kInvalid);
  }
}

TEST_F(V2Fake, KillWithoutCgroupKillFreezesAndKillsRealProcesses) {
  // A kernel before 5.14 has no cgroup.kill: the driver freezes, SIGKILLs what cgroup.procs
  // lists (through pidfds), and waits for the cgroup to empty. The fake's "kernel" empties
  // cgroup.procs when the process is gone.
  init();
  auto box = driver_->create("s1", kLimits);
  ASSERT_TRUE(box);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGTERM, SIG_IGN);
    for (;;) ::pause();
  }
  ASSERT_GT(pid, 0);
  ASSERT_TRUE((*box)->add_process(pid));
  int status = 0;
  std::thread kernel([&] {
    ::waitpid(pid, &status, 0);
    put(at("agentbox/s1/init/cgroup.procs"), "");
  });
  auto pids = (*box)->pids();
  ASSERT_TRUE(pids);
  EXPECT_EQ(*pids, std::vector<pid_t>{pid});
  auto st = (*box)->kill_all();
  kernel.join();
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_EQ(trim(read("agentbox/s1/cgroup.freeze")), "0");  // thawed again
}

// ---------------------------------------------------------------------------------------------
// v1 on a fake layout.

class V1Fake : public ::testing::Test {
 protected:
  void init(FakeOptions opt = {}) {
    fake_ = std::make_shared<FakeCgroupFs>(tmp_.path(), false, std::move(opt));
    fake_->make_roots();
    driver_ = make_cgroup_v1_driver(tmp_.path(), "agentbox", fake_);
  }
  std::string at(const std::string& rel) const { return tmp_.path() + "/" + rel; }
  std::string read(const std::string& rel) const { return slurp(at(rel)); }

  TempDir tmp_;
  std::shared_ptr<FakeCgroupFs> fake_;
  std::unique_ptr<CgroupDriver> driver_;
};

TEST_F(V2Fake, EventsReadTheOomKillAndPidsMaxCounters) {
  init();
  auto box = driver_->create("s1", kLimits);
  ASSERT_TRUE(box);
  auto exec = (*box)->make_child("x1");
  ASSERT_TRUE(exec);
  // A child of a child has no memory or pids files: nothing counted, not an error.
  auto fresh = (*exec)->events();
  ASSERT_TRUE(fresh) << fresh.error().message;
  EXPECT_EQ(fresh->oom_kills, 0u);
  EXPECT_EQ(fresh->pids_max, 0u);
  put(at("agentbox/s1/x1/memory.events"), "low 0\nhigh 0\nmax 7\noom 3\noom_kill 2\n");
  put(at("agentbox/s1/x1/pids.events"), "max 5\n");
  auto ev = (*exec)->events();
  ASSERT_TRUE(ev) << ev.error().message;
  EXPECT_EQ(ev->oom_kills, 2u);  // oom_kill, not max or oom
  EXPECT_EQ(ev->pids_max, 5u);
  put(at("agentbox/s1/x1/pids.events"), "max x\n");
  EXPECT_FALSE((*exec)->events());  // a garbled counter is an error, not a silent 0
}

TEST_F(V1Fake, CreateWritesLimitsInEveryHierarchy) {
  init();
  EXPECT_EQ(driver_->version(), "v1");
  auto box = driver_->create("s1", kLimits);
  ASSERT_TRUE(box) << box.error().message;
  const std::string bytes = std::to_string(64ull << 20);
  EXPECT_EQ(read("memory/agentbox/s1/memory.limit_in_bytes"), bytes);
  EXPECT_EQ(read("memory/agentbox/s1/memory.memsw.limit_in_bytes"), bytes);  // no swap on top
  EXPECT_EQ(read("memory/agentbox/s1/memory.swappiness"), "60\n");           // memsw does the job
  EXPECT_EQ(read("memory/agentbox/memory.use_hierarchy"), "1");
  EXPECT_EQ(read("cpu/agentbox/s1/cpu.cfs_period_us"), "100000");
  EXPECT_EQ(read("cpu/agentbox/s1/cpu.cfs_quota_us"), "50000");
  EXPECT_EQ(read("pids/agentbox/s1/pids.max"), "32");
  EXPECT_TRUE(fs::is_directory(at("freezer/agentbox/s1")));
  EXPECT_EQ((*box)->procs_path(), at("memory/agentbox/s1/cgroup.procs"));
  EXPECT_EQ(driver_->parent_path(), at("memory/agentbox"));
}

TEST_F(V1Fake, WithoutSwapAccountingSwappinessIsZero) {
  init(FakeOptions{.v1_memsw = false});
  ASSERT_TRUE(driver_->create("s1", kLimits));
  EXPECT_FALSE(fs::exists(at("memory/agentbox/s1/memory.memsw.limit_in_bytes")));
  EXPECT_EQ(read("memory/agentbox/s1/memory.swappiness"), "0");
}

TEST_F(V1Fake, ZeroMeansUnlimited) {
  init();
  ASSERT_TRUE(driver_->create("s1", CgroupLimits{0, 0, 0}));
  EXPECT_EQ(read("memory/agentbox/s1/memory.limit_in_bytes"), "-1");
  EXPECT_EQ(read("cpu/agentbox/s1/cpu.cfs_quota_us"), "-1");
  EXPECT_EQ(read("pids/agentbox/s1/pids.max"), "max");
}

TEST_F(V1Fake, ProcessesAndChildrenAreMirroredInEveryHierarchy) {
  init();
  auto box = driver_->create("s1", kLimits);
  ASSERT_TRUE(box);
  ASSERT_TRUE((*box)->add_process(4321));
  auto exec = (*box)->make_child("exec-1");
  ASSERT_TRUE(exec) << exec.error().message;
  ASSERT_TRUE((*exec)->add_process(99));
  for (const char* h : {"memory", "cpu", "pids", "freezer"}) {
    EXPECT_EQ(read(std::string(h) + "/agentbox/s1/cgroup.procs"), "4321") << h;
    EXPECT_EQ(read(std::string(h) + "/agentbox/s1/exec-1/cgroup.procs"), "99") << h;
  }
  // init is only reserved on v2 boxes; v1 has no leaf rule.
  EXPECT_TRUE((*box)->make_child("init"));
  EXPECT_FALSE((*box)->make_child("../x"));
}

TEST_F(V1Fake, RemoveStaleFindsBoxesLeftInSomeHierarchiesOnly) {
  init();
  ASSERT_TRUE(driver_->create("s1", kLimits));
  // A daemon killed half way through create(): the box exists in pids/ only.
  ASSERT_EQ(fake_->make_dir(at("pids/agentbox/half")), 0);
  auto n = driver_->remove_stale();
  ASSERT_TRUE(n) << n.error().message;
  EXPECT_EQ(*n, 2u);
  for (const char* h : {"memory", "cpu", "pids", "freezer"}) {
    EXPECT_FALSE(fs::exists(at(std::string(h) + "/agentbox/s1"))) << h;
  }
  EXPECT_FALSE(fs::exists(at("pids/agentbox/half")));
}

TEST_F(V1Fake, KillAllThawsAfterwards) {
  init();
  auto box = driver_->create("s1", kLimits);
  ASSERT_TRUE(box);
  ASSERT_TRUE((*box)->kill_all());
  EXPECT_EQ(trim(read("freezer/agentbox/s1/freezer.state")), "THAWED");
  ASSERT_TRUE((*box)->destroy());
  EXPECT_FALSE(fs::exists(at("memory/agentbox/s1")));
}

// ---------------------------------------------------------------------------------------------
// Detection (reads files only, so fake layouts work).

TEST_F(V1Fake, EventsReadOomControlOrFallBackToFailcnt) {
  init();
  auto box = driver_->create("s1", kLimits);
  ASSERT_TRUE(box);
  auto exec = (*box)->make_child("x1");
  ASSERT_TRUE(exec);
  put(at("memory/agentbox/s1/x1/memory.oom_control"),
      "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
  put(at("memory/agentbox/s1/x1/memory.failcnt"), "40\n");
  put(at("pids/agentbox/s1/x1/pids.events"), "max 1\n");
  auto ev = (*exec)->events();
  ASSERT_TRUE(ev) << ev.error().message;
  EXPECT_EQ(ev->oom_kills, 3u);
  EXPECT_EQ(ev->pids_max, 1u);
  // A kernel before 4.13 has no oom_kill line: how often the limit was hit stands in.
  put(at("memory/agentbox/s1/x1/memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\n");
  ev = (*exec)->events();
  ASSERT_TRUE(ev) << ev.error().message;
  EXPECT_EQ(ev->oom_kills, 40u);
}

TEST(CgroupDetect, PureV2AtTheRoot) {
  TempDir t;
  put(t.path() + "/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n");
  auto d = detect_cgroup_driver(t.path());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ((*d)->version(), "v2");
  EXPECT_EQ((*d)->parent_path(), t.path() + "/agentbox");
}

TEST(CgroupDetect, HybridWithEmptyUnifiedPicksV1) {
  TempDir t;
  ::mkdir((t.path() + "/unified").c_str(), 0755);
  put(t.path() + "/unified/cgroup.controllers", "");
  for (const char* h : {"memory", "cpu", "pids", "freezer", "blkio"}) {
    ::mkdir((t.path() + "/" + h).c_str(), 0755);
    put(t.path() + "/" + h + "/cgroup.procs", "");
  }
  auto d = detect_cgroup_driver(t.path(), "boxes");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ((*d)->version(), "v1");
  EXPECT_EQ((*d)->parent_path(), t.path() + "/memory/boxes");
}

TEST(CgroupDetect, HybridWithControllersInUnifiedPicksV2There) {
  TempDir t;
  ::mkdir((t.path() + "/unified").c_str(), 0755);
  put(t.path() + "/unified/cgroup.controllers", "memory pids cpu\n");
  auto d = detect_cgroup_driver(t.path());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ((*d)->version(), "v2");
  EXPECT_EQ((*d)->parent_path(), t.path() + "/unified/agentbox");
}

TEST(CgroupDetect, NothingUsableNamesWhatIsMissing) {
  TempDir t;
  put(t.path() + "/cgroup.controllers", "cpu memory\n");  // v2 without pids
  ::mkdir((t.path() + "/memory").c_str(), 0755);
  put(t.path() + "/memory/cgroup.procs", "");
  auto d = detect_cgroup_driver(t.path());
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, Code::kUnavailable);
  EXPECT_NE(d.error().message.find("lacks controllers pids"), std::string::npos)
      << d.error().message;
  EXPECT_NE(d.error().message.find("cpu,pids,freezer"), std::string::npos) << d.error().message;
}

TEST(CgroupDetect, InvalidParentRejected) {
  for (const char* bad : {"", "../x", "/abs", "a//b", "a/./b", "a/"}) {
    auto d = detect_cgroup_driver("/sys/fs/cgroup", bad);
    ASSERT_FALSE(d) << bad;
    EXPECT_EQ(d.error().code, Code::kInvalid) << bad;
  }
}

// ---------------------------------------------------------------------------------------------
// The real kernel.

bool is_fs(const std::string& path, long magic) {
  struct statfs sfs;
  return ::statfs(path.c_str(), &sfs) == 0 && static_cast<long>(sfs.f_type) == magic;
}

bool has_controllers(const std::string& dir) {
  std::string c = " " + slurp(dir + "/cgroup.controllers");
  std::replace(c.begin(), c.end(), '\n', ' ');
  return c.find(" memory ") != std::string::npos && c.find(" cpu ") != std::string::npos &&
         c.find(" pids ") != std::string::npos;
}

// Where this host has a real cgroup2 hierarchy with the controllers we need ("" if none).
std::string real_v2_root() {
  for (std::string r : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    if (is_fs(r, CGROUP2_SUPER_MAGIC) && has_controllers(r)) return r;
  }
  return "";
}

bool real_v1_available() {
  for (const char* h : {"memory", "cpu", "pids", "freezer"}) {
    if (!is_fs(std::string("/sys/fs/cgroup/") + h, CGROUP_SUPER_MAGIC)) return false;
  }
  return true;
}

// What a real-kernel test gets: a driver on a parent of its own (so a daemon or another test
// run on this machine is never touched), cleaned up afterwards.
class RealCgroup : public ::testing::Test {
 public:
  RealCgroup(std::string version, std::function<void(RealCgroup&)> body)
      : version_(std::move(version)), body_(std::move(body)) {}

  void SetUp() override {
    ASSERT_EQ(::geteuid(), 0u) << "privileged test: run as root";
    parent_ = "agentbox-test-" + std::to_string(::getpid());
    driver_ = make();
  }

  void TearDown() override {
    if (!driver_) return;
    auto n = driver_->remove_stale();
    EXPECT_TRUE(n) << n.error().message;
    for (const auto& d : parent_dirs()) ::rmdir(d.c_str());
  }

  void TestBody() override { body_(*this); }

  std::unique_ptr<CgroupDriver> make() const {
    return version_ == "v1" ? make_cgroup_v1_driver("/sys/fs/cgroup", parent_)
                            : make_cgroup_v2_driver(real_v2_root(), parent_);
  }

  std::vector<std::string> parent_dirs() const {
    if (version_ == "v2") return {real_v2_root() + "/" + parent_};
    std::vector<std::string> out;
    for (const char* h : {"memory", "cpu", "pids", "freezer"}) {
      out.push_back(std::string("/sys/fs/cgroup/") + h + "/" + parent_);
    }
    return out;
  }

  // Directory of the box in every hierarchy (one on v2).
  std::vector<std::string> box_dirs(const std::string& box) const {
    std::vector<std::string> out;
    for (const auto& p : parent_dirs()) out.push_back(p + "/" + box);
    return out;
  }

  // A limit file of the box, read back: v1 reads the hierarchy that holds it.
  std::string limit(const std::string& box, const std::string& file) const {
    if (version_ == "v2")
      return trim(slurp(real_v2_root() + "/" + parent_ + "/" + box + "/" + file));
    std::string h = file.substr(0, file.find('.'));
    return trim(slurp("/sys/fs/cgroup/" + h + "/" + parent_ + "/" + box + "/" + file));
  }

  const std::string& version() const { return version_; }
  const std::string& parent() const { return parent_; }
  CgroupDriver& driver() { return *driver_; }

 private:
  std::string version_;
  std::function<void(RealCgroup&)> body_;
  std::string parent_;
  std::unique_ptr<CgroupDriver> driver_;
};

// A forked process that waits (blocked on a pipe) until released, then runs fn and exits with
// its result, so the test can move it into a cgroup before it does anything.
class Held {
 public:
  explicit Held(std::function<int()> fn) {
    int p[2];
    AB_CHECK(::pipe2(p, O_CLOEXEC) == 0);
    UniqueFd rd(p[0]);
    go_ = UniqueFd(p[1]);
    pid_ = ::fork();
    AB_CHECK(pid_ >= 0);
    if (pid_ == 0) {
      char c;
      if (::read(rd.get(), &c, 1) != 1) ::_exit(120);
      ::_exit(fn());
    }
  }
  ~Held() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  void release() { AB_CHECK(::write(go_.get(), "g", 1) == 1); }
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }

 private:
  UniqueFd go_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

[[noreturn]] int sleep_forever() {
  for (;;) ::pause();
}

bool contains(const std::vector<pid_t>& v, pid_t p) {
  return std::find(v.begin(), v.end(), p) != v.end();
}

// Waits until a (not necessarily child) process has exited, through a pidfd.
bool exits_within(const UniqueFd& pidfd, std::chrono::milliseconds timeout) {
  struct pollfd pfd {
    pidfd.get(), POLLIN, 0
  };
  return ::poll(&pfd, 1, static_cast<int>(timeout.count())) == 1;
}

UniqueFd pidfd_of(pid_t pid) {
  return UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
}

void real_create_applies_limits(RealCgroup& t) {
  auto box = t.driver().create("limits", kLimits);
  ASSERT_TRUE(box) << box.error().message;
  if (t.version() == "v1") {
    EXPECT_EQ(t.limit("limits", "memory.limit_in_bytes"), std::to_string(64ull << 20));
    if (fs::exists(t.box_dirs("limits")[0] + "/memory.memsw.limit_in_bytes")) {
      EXPECT_EQ(t.limit("limits", "memory.memsw.limit_in_bytes"), std::to_string(64ull << 20));
    } else {
      EXPECT_EQ(t.limit("limits", "memory.swappiness"), "0");
    }
    EXPECT_EQ(t.limit("limits", "cpu.cfs_period_us"), "100000");
    EXPECT_EQ(t.limit("limits", "cpu.cfs_quota_us"), "50000");
    EXPECT_EQ(t.limit("limits", "pids.max"), "32");
  } else {
    EXPECT_EQ(t.limit("limits", "memory.max"), std::to_string(64ull << 20));
    EXPECT_EQ(t.limit("limits", "cpu.max"), "50000 100000");
    EXPECT_EQ(t.limit("limits", "pids.max"), "32");
    EXPECT_TRUE(fs::is_directory(t.box_dirs("limits")[0] + "/init"));
  }
  auto usage = (*box)->memory_usage();
  ASSERT_TRUE(usage) << usage.error().message;
}

// Live changes (set_limits): up and down again; on v1 raising must write memsw before the limit
// and lowering after it, or the kernel refuses the step (EINVAL).
void real_set_limits_raises_and_lowers(RealCgroup& t) {
  auto box = t.driver().create("live", kLimits);
  ASSERT_TRUE(box) << box.error().message;
  const bool v1 = t.version() == "v1";
  const std::string mem = v1 ? "memory.limit_in_bytes" : "memory.max";
  for (std::uint64_t mb : {256, 32, 128}) {
    auto st = (*box)->set_limits(CgroupLimits{mb << 20, 150, 48});
    ASSERT_TRUE(st) << mb << ": " << st.error().message;
    EXPECT_EQ(t.limit("live", mem), std::to_string(mb << 20));
    if (v1 && fs::exists(t.box_dirs("live")[0] + "/memory.memsw.limit_in_bytes")) {
      EXPECT_EQ(t.limit("live", "memory.memsw.limit_in_bytes"), std::to_string(mb << 20));
    }
    EXPECT_EQ(t.limit("live", v1 ? "cpu.cfs_quota_us" : "cpu.max"),
              v1 ? "150000" : "150000 100000");
    EXPECT_EQ(t.limit("live", "pids.max"), "48");
  }
}

void real_tracks_processes_in_box_and_child(RealCgroup& t) {
  auto box = t.driver().create("track", kLimits);
  ASSERT_TRUE(box) << box.error().message;
  Held init(sleep_forever);
  ASSERT_TRUE((*box)->add_process(init.pid()));
  auto exec = (*box)->make_child("exec-1");
  ASSERT_TRUE(exec) << exec.error().message;
  Held cmd(sleep_forever);
  ASSERT_TRUE((*exec)->add_process(cmd.pid()));
  // The kernel agrees about where they are.
  const std::string where = "/" + t.parent() + "/track";
  EXPECT_NE(slurp("/proc/" + std::to_string(init.pid()) + "/cgroup").find(where),
            std::string::npos);
  EXPECT_NE(slurp("/proc/" + std::to_string(cmd.pid()) + "/cgroup").find(where + "/exec-1"),
            std::string::npos);
  auto all = (*box)->pids();
  ASSERT_TRUE(all) << all.error().message;
  EXPECT_EQ(all->size(), 2u);
  EXPECT_TRUE(contains(*all, init.pid()) && contains(*all, cmd.pid()));
  auto mine = (*exec)->pids();
  ASSERT_TRUE(mine);
  EXPECT_EQ(*mine, std::vector<pid_t>{cmd.pid()});
}

void real_kill_all_reaches_setsid_sigterm_ignorers(RealCgroup& t) {
  auto box = t.driver().create("kill", kLimits);
  ASSERT_TRUE(box) << box.error().message;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd rd(p[0]), wr(p[1]);
  const int report = wr.get();
  // The leader detaches (setsid), ignores SIGTERM, double-forks a grandchild that does the same,
  // and reports its pid: what a process-group kill would miss.
  Held leader([report] {
    ::setsid();
    ::signal(SIGTERM, SIG_IGN);
    pid_t g = ::fork();
    if (g == 0) {
      ::setsid();
      ::signal(SIGTERM, SIG_IGN);
      pid_t me = ::getpid();
      (void)!::write(report, &me, sizeof me);
      for (;;) ::pause();
    }
    for (;;) ::pause();
    return 0;
  });
  ASSERT_TRUE((*box)->add_process(leader.pid()));
  leader.release();
  wr.reset();
  pid_t grandchild = 0;
  ASSERT_EQ(::read(rd.get(), &grandchild, sizeof grandchild),
            static_cast<ssize_t>(sizeof grandchild));
  UniqueFd gfd = pidfd_of(grandchild);
  ASSERT_TRUE(gfd.valid());
  ::kill(leader.pid(), SIGTERM);
  ::kill(grandchild, SIGTERM);
  auto before = (*box)->pids();
  ASSERT_TRUE(before);
  EXPECT_TRUE(contains(*before, leader.pid()) && contains(*before, grandchild));
  auto st = (*box)->kill_all();
  ASSERT_TRUE(st) << st.error().message;
  int status = leader.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_TRUE(exits_within(gfd, std::chrono::seconds(5))) << "grandchild survived";
  auto after = (*box)->pids();
  ASSERT_TRUE(after);
  EXPECT_TRUE(after->empty());
}

void real_exec_kill_is_scoped_to_the_exec(RealCgroup& t) {
  auto box = t.driver().create("scoped", kLimits);
  ASSERT_TRUE(box) << box.error().message;
  Held init(sleep_forever);
  ASSERT_TRUE((*box)->add_process(init.pid()));
  auto exec = (*box)->make_child("exec-7");
  ASSERT_TRUE(exec);
  Held cmd(sleep_forever);
  ASSERT_TRUE((*exec)->add_process(cmd.pid()));
  ASSERT_TRUE((*exec)->destroy());
  int status = cmd.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  for (const auto& d : t.box_dirs("scoped")) EXPECT_FALSE(fs::exists(d + "/exec-7")) << d;
  auto left = (*box)->pids();
  ASSERT_TRUE(left);
  EXPECT_EQ(*left, std::vector<pid_t>{init.pid()});  // the box's init lives on
}

void real_destroy_removes_dirs_and_is_idempotent(RealCgroup& t) {
  auto box = t.driver().create("gone", kLimits);
  ASSERT_TRUE(box) << box.error().message;
  Held p(sleep_forever);
  ASSERT_TRUE((*box)->add_process(p.pid()));
  ASSERT_TRUE((*box)->make_child("exec-1"));
  ASSERT_TRUE((*box)->destroy());
  int status = p.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  for (const auto& d : t.box_dirs("gone")) EXPECT_FALSE(fs::exists(d)) << d;
  EXPECT_TRUE((*box)->destroy());
}

void real_remove_stale_cleans_a_dead_daemons_boxes(RealCgroup& t) {
  Held p(sleep_forever);
  {
    // A "daemon" that made a box, put a process in it, and died without cleaning up.
    auto old = t.make();
    auto box = old->create("stale", kLimits);
    ASSERT_TRUE(box) << box.error().message;
    ASSERT_TRUE((*box)->add_process(p.pid()));
    ASSERT_TRUE((*box)->make_child("exec-3"));
  }
  auto n = t.make()->remove_stale();
  ASSERT_TRUE(n) << n.error().message;
  EXPECT_EQ(*n, 1u);
  int status = p.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  for (const auto& d : t.box_dirs("stale")) EXPECT_FALSE(fs::exists(d)) << d;
}

void real_create_replaces_a_leftover(RealCgroup& t) {
  auto first = t.driver().create("same", kLimits);
  ASSERT_TRUE(first);
  Held p(sleep_forever);
  ASSERT_TRUE((*first)->add_process(p.pid()));
  auto second = t.driver().create("same", CgroupLimits{32ull << 20, 20, 7});
  ASSERT_TRUE(second) << second.error().message;
  int status = p.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(t.limit("same", "pids.max"), "7");
  auto pids = (*second)->pids();
  ASSERT_TRUE(pids);
  EXPECT_TRUE(pids->empty());
}

void real_memory_limit_oom_kills_inside_only(RealCgroup& t) {
  constexpr std::uint64_t kLimit = 32ull << 20;
  auto box = t.driver().create("oom", CgroupLimits{kLimit, 100, 32});
  ASSERT_TRUE(box) << box.error().message;
  // Allocates and touches 10x the limit; must be OOM-killed, never reach the exit.
  Held hog([] {
    constexpr std::size_t kChunk = 1 << 20;
    for (std::size_t i = 0; i < 10 * (kLimit / kChunk); ++i) {
      void* m = ::mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) return 2;
      std::memset(m, 0xab, kChunk);
    }
    return 0;
  });
  ASSERT_TRUE((*box)->add_process(hog.pid()));
  hog.release();
  int status = hog.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "allocating 10x memory limit: status " << status;
  // This (the test) process lives on, and so does the box.
  auto usage = (*box)->memory_usage();
  ASSERT_TRUE(usage) << usage.error().message;
  EXPECT_LE(*usage, kLimit);
}

void real_memory_usage_counts_the_box(RealCgroup& t) {
  auto box = t.driver().create("usage", kLimits);
  ASSERT_TRUE(box) << box.error().message;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd rd(p[0]), wr(p[1]);
  const int ready = wr.get();
  Held user([ready] {
    constexpr std::size_t kSize = 16 << 20;
    void* m = ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 2;
    std::memset(m, 1, kSize);
    (void)!::write(ready, "r", 1);
    for (;;) ::pause();
  });
  ASSERT_TRUE((*box)->add_process(user.pid()));
  user.release();
  wr.reset();
  char c;
  ASSERT_EQ(::read(rd.get(), &c, 1), 1);
  auto usage = (*box)->memory_usage();
  ASSERT_TRUE(usage) << usage.error().message;
  EXPECT_GE(*usage, 16ull << 20);
}

void real_pids_limit_caps_forks(RealCgroup& t) {
  auto box = t.driver().create("forks", CgroupLimits{64ull << 20, 100, 8});
  ASSERT_TRUE(box) << box.error().message;
  // Forks sleepers until fork fails; exits with how many it made, or 200 on an unexpected errno.
  Held bomb([] {
    int made = 0;
    for (int i = 0; i < 50; ++i) {
      pid_t c = ::fork();
      if (c == 0) {
        for (;;) ::pause();
      }
      if (c < 0) return errno == EAGAIN ? made : 200;
      ++made;
    }
    return 100;
  });
  ASSERT_TRUE((*box)->add_process(bomb.pid()));
  bomb.release();
  int status = bomb.wait();
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 7) << "pids.max 8 = the forker + 7 children";
  auto left = (*box)->pids();
  ASSERT_TRUE(left);
  EXPECT_EQ(left->size(), 7u);     // orphans stay in the box...
  ASSERT_TRUE((*box)->destroy());  // ...until it goes
}

void real_add_dead_process_is_not_found(RealCgroup& t) {
  auto box = t.driver().create("dead", kLimits);
  ASSERT_TRUE(box);
  Held p([] { return 0; });
  p.release();
  p.wait();
  auto st = (*box)->add_process(p.pid());
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Code::kNotFound) << st.error().message;
  EXPECT_EQ(st.error().sys_errno, ESRCH) << st.error().message;
}

// The counters the daemon reads to say why a command died (killed_by): an OOM kill inside one
// exec's child cgroup, and a fork refused by the box's pids.max, each move a counter that the
// exec's cgroup or the box's shows.
void real_events_count_oom_kills_in_the_exec(RealCgroup& t) {
  constexpr std::uint64_t kLimit = 32ull << 20;
  auto box = t.driver().create("oomev", CgroupLimits{kLimit, 100, 32});
  ASSERT_TRUE(box) << box.error().message;
  auto exec = (*box)->make_child("x1");
  ASSERT_TRUE(exec) << exec.error().message;
  auto before = (*exec)->events();
  ASSERT_TRUE(before) << before.error().message;
  Held hog([] {
    constexpr std::size_t kChunk = 1 << 20;
    for (std::size_t i = 0; i < 10 * (kLimit / kChunk); ++i) {
      void* m = ::mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) return 2;
      std::memset(m, 0xab, kChunk);
    }
    return 0;
  });
  ASSERT_TRUE((*exec)->add_process(hog.pid()));
  hog.release();
  int status = hog.wait();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  auto after = (*exec)->events();
  ASSERT_TRUE(after) << after.error().message;
  EXPECT_GT(after->oom_kills, before->oom_kills);
  EXPECT_EQ(after->pids_max, before->pids_max);
}

void real_events_count_refused_forks(RealCgroup& t) {
  auto box = t.driver().create("pidsev", CgroupLimits{64ull << 20, 100, 8});
  ASSERT_TRUE(box) << box.error().message;
  auto exec = (*box)->make_child("x1");
  ASSERT_TRUE(exec) << exec.error().message;
  auto box_before = (*box)->events();
  auto exec_before = (*exec)->events();
  ASSERT_TRUE(box_before && exec_before);
  Held bomb([] {
    for (int i = 0; i < 50; ++i) {
      pid_t c = ::fork();
      if (c == 0) {
        for (;;) ::pause();
      }
      if (c < 0) return errno == EAGAIN ? 0 : 200;
    }
    return 100;
  });
  ASSERT_TRUE((*exec)->add_process(bomb.pid()));
  bomb.release();
  int status = bomb.wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  auto box_after = (*box)->events();
  auto exec_after = (*exec)->events();
  ASSERT_TRUE(box_after && exec_after);
  // Which of the two counts depends on the kernel (CgroupEvents); one of them must.
  EXPECT_TRUE(box_after->pids_max > box_before->pids_max ||
              exec_after->pids_max > exec_before->pids_max)
      << "box " << box_after->pids_max << ", exec " << exec_after->pids_max;
  EXPECT_EQ(exec_after->oom_kills, exec_before->oom_kills);
  ASSERT_TRUE((*box)->destroy());
}

struct RealCase {
  const char* name;
  void (*fn)(RealCgroup&);
};
constexpr RealCase kRealCases[] = {
    {"CreateAppliesLimits", real_create_applies_limits},
    {"SetLimitsRaisesAndLowers", real_set_limits_raises_and_lowers},
    {"TracksProcessesInBoxAndChild", real_tracks_processes_in_box_and_child},
    {"KillAllReachesSetsidSigtermIgnorers", real_kill_all_reaches_setsid_sigterm_ignorers},
    {"ExecKillIsScopedToTheExec", real_exec_kill_is_scoped_to_the_exec},
    {"DestroyRemovesDirsAndIsIdempotent", real_destroy_removes_dirs_and_is_idempotent},
    {"RemoveStaleCleansADeadDaemonsBoxes", real_remove_stale_cleans_a_dead_daemons_boxes},
    {"CreateReplacesALeftover", real_create_replaces_a_leftover},
    {"MemoryLimitOomKillsInsideOnly", real_memory_limit_oom_kills_inside_only},
    {"MemoryUsageCountsTheBox", real_memory_usage_counts_the_box},
    {"PidsLimitCapsForks", real_pids_limit_caps_forks},
    {"AddDeadProcessFails", real_add_dead_process_is_not_found},
    {"EventsCountOomKillsInTheExec", real_events_count_oom_kills_in_the_exec},
    {"EventsCountRefusedForks", real_events_count_refused_forks},
};

// Registers CgroupRealV1.* / CgroupRealV2.* for the hierarchies this host really has.
const bool kRegistered = [] {
  std::vector<std::string> versions;
  if (real_v1_available()) versions.push_back("v1");
  if (!real_v2_root().empty()) versions.push_back("v2");
  for (const auto& v : versions) {
    const std::string suite = v == "v1" ? "CgroupRealV1" : "CgroupRealV2";
    for (const RealCase& c : kRealCases) {
      ::testing::RegisterTest(
          suite.c_str(), c.name, nullptr, nullptr, __FILE__, __LINE__,
          [v, fn = c.fn]() -> ::testing::Test* { return new RealCgroup(v, fn); });
    }
  }
  return true;
}();

TEST(CgroupHost, DetectFindsAUsableHierarchyAndItsSuiteRuns) {
  auto d = detect_cgroup_driver("/sys/fs/cgroup");
  ASSERT_TRUE(d) << d.error().message;
  const bool v1 = real_v1_available();
  const std::string v2 = real_v2_root();
  // The detected driver is one whose real-kernel suite is registered in this binary.
  EXPECT_TRUE(((*d)->version() == "v1" && v1) || ((*d)->version() == "v2" && !v2.empty()))
      << (*d)->version();
  std::printf("[ host     ] detect picked %s; real suites: %s%s\n",
              std::string((*d)->version()).c_str(), v1 ? "CgroupRealV1 " : "",
              v2.empty() ? "" : "CgroupRealV2");
  if (v2.empty()) {
    std::printf(
        "[ host     ] CgroupRealV2 not registered: no cgroup2 hierarchy with memory, cpu "
        "and pids controllers at /sys/fs/cgroup or /sys/fs/cgroup/unified (controllers "
        "bound to v1); v2 is covered by the V2Fake tests here\n");
  }
  if (!v1) std::printf("[ host     ] CgroupRealV1 not registered: no v1 memory/cpu/pids/freezer\n");
}

}  // namespace
}  // namespace agentbox::linux
