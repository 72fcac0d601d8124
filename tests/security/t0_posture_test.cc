// SECURITY.md T0: posture, checked from the host on a process running inside a box.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <set>
#include <sstream>

#include "security/box_fixture.h"

namespace agentbox::security {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Starts a long sleep in the box (it outlives the exec, by design) and returns its host pid.
pid_t start_sleeper(Box& b) {
  auto r = b.sh("sleep 600 >/dev/null 2>&1 &");
  EXPECT_EQ(r.value("exit_code", -2), 0) << r.dump();
  for (int i = 0; i < 100; ++i) {
    for (pid_t p : host_pids_of_uid(b.uid())) {
      if (slurp("/proc/" + std::to_string(p) + "/comm") == "sleep\n") return p;
    }
    usleep(20000);
  }
  ADD_FAILURE() << "sleeper not found on the host";
  return -1;
}

std::string ns_of(pid_t pid, const char* ns) {
  char buf[128] = {0};
  std::string link = (pid ? "/proc/" + std::to_string(pid) : std::string("/proc/self")) + "/ns/" + ns;
  ssize_t n = readlink(link.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
}

class PostureTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    a_ = new Box(shared_daemon(), "posture-a");
    b_ = new Box(shared_daemon(), "posture-b");
    pa_ = start_sleeper(*a_);
    pb_ = start_sleeper(*b_);
  }
  static Box* a_;
  static Box* b_;
  static pid_t pa_, pb_;
};
Box* PostureTest::a_;
Box* PostureTest::b_;
pid_t PostureTest::pa_;
pid_t PostureTest::pb_;

TEST_F(PostureTest, NamespacesDifferFromTheDaemonAndBetweenBoxes) {
  ASSERT_GT(pa_, 0);
  ASSERT_GT(pb_, 0);
  for (const char* ns : {"mnt", "pid", "ipc", "uts", "net", "cgroup"}) {
    std::string host = ns_of(shared_daemon().pid(), ns);
    ASSERT_FALSE(host.empty()) << ns;
    EXPECT_NE(ns_of(pa_, ns), host) << ns << " shared with the daemon";
    EXPECT_NE(ns_of(pa_, ns), ns_of(pb_, ns)) << ns << " shared between boxes";
  }
}

TEST_F(PostureTest, NoNewPrivsSeccompAndNoCapabilitiesOnEveryThread) {
  ASSERT_GT(pa_, 0);
  EXPECT_EQ(proc_status(pa_, "NoNewPrivs"), "1");
  EXPECT_EQ(proc_status(pa_, "Seccomp"), "2");
  for (const char* cap : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}) {
    EXPECT_EQ(proc_status(pa_, cap), "0000000000000000") << cap;
  }
  // A multi-threaded command (python3 with a thread) shows the same on each of its threads.
  auto r = a_->exec({"python3", "-c",
                     "import threading,time,glob\n"
                     "t=threading.Thread(target=time.sleep,args=(1,));t.start()\n"
                     "for p in glob.glob('/proc/self/task/*/status'):\n"
                     "  s=open(p).read()\n"
                     "  print('NoNewPrivs:\\t1' in s, 'Seccomp:\\t2' in s, 'CapEff:\\t0000000000000000' in s)\n"});
  EXPECT_EQ(r.value("exit_code", -2), 0) << r.dump();
  EXPECT_THAT(r.value("stdout", ""), HasSubstr("True True True\nTrue True True"));
  EXPECT_THAT(r.value("stdout", ""), Not(HasSubstr("False")));
}

TEST_F(PostureTest, RunsAsTheSessionUidWithNoSupplementaryGroups) {
  ASSERT_GT(pa_, 0);
  ASSERT_GE(a_->uid(), 10000u);
  std::string u = std::to_string(a_->uid());
  EXPECT_EQ(proc_status(pa_, "Uid"), u + "\t" + u + "\t" + u + "\t" + u);
  EXPECT_EQ(proc_status(pa_, "Gid"), u + "\t" + u + "\t" + u + "\t" + u);
  EXPECT_EQ(proc_status(pa_, "Groups"), "");
  EXPECT_NE(a_->uid(), b_->uid());
}

TEST_F(PostureTest, CommandsHoldOnlyStdioFds) {
  auto r = a_->sh("ls /proc/self/fd");  // ls itself opens the dir: 0 1 2 and that one
  std::istringstream in(r.value("stdout", ""));
  std::set<std::string> fds;
  for (std::string fd; in >> fd;) fds.insert(fd);
  EXPECT_TRUE(fds.count("0") && fds.count("1") && fds.count("2")) << r.dump();
  EXPECT_LE(fds.size(), 4u) << r.dump();
  // From the host: the sleeper holds nothing but 0, 1, 2.
  std::set<std::string> host_fds;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pa_) + "/fd")) {
    host_fds.insert(e.path().filename());
  }
  EXPECT_EQ(host_fds, (std::set<std::string>{"0", "1", "2"}));
}

TEST_F(PostureTest, MountTableIsTheDesignedListSystemReadOnly) {
  std::istringstream in(slurp("/proc/" + std::to_string(pa_) + "/mountinfo"));
  std::set<std::string> allowed_prefixes = {"/", "/usr", "/bin", "/sbin", "/lib", "/lib64",
                                            "/lib32", "/libx32", "/etc", "/workspace", "/tmp",
                                            "/proc", "/dev", "/shared"};
  bool saw_root = false, saw_ws = false;
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string id, parent, devno, root, mnt, opts;
    f >> id >> parent >> devno >> root >> mnt >> opts;
    std::string top = "/" + mnt.substr(1, mnt.find('/', 1) == std::string::npos
                                               ? std::string::npos
                                               : mnt.find('/', 1) - 1);
    EXPECT_TRUE(allowed_prefixes.count(top)) << "unexpected mount " << mnt;
    if (mnt == "/") {
      saw_root = true;
      EXPECT_EQ(opts.substr(0, 3), "ro,") << line;
    }
    if (mnt == "/usr" || mnt == "/etc") {
      EXPECT_EQ(opts.substr(0, 3), "ro,") << line;
    }
    if (mnt == "/workspace") {
      saw_ws = true;
      EXPECT_THAT(opts, HasSubstr("nosuid")) << line;
      EXPECT_THAT(opts, HasSubstr("nodev")) << line;
    }
  }
  EXPECT_TRUE(saw_root);
  EXPECT_TRUE(saw_ws);
}

TEST_F(PostureTest, CgroupLimitsAreTheSessionLimits) {
  Box c(shared_daemon(), "posture-limits",
        json{{"limits", {{"memory_mb", 200}, {"cpu_percent", 50}, {"max_pids", 77}}}});
  pid_t p = start_sleeper(c);
  ASSERT_GT(p, 0);
  std::istringstream in(slurp("/proc/" + std::to_string(p) + "/cgroup"));
  std::string mem, pids, cpu, unified;
  for (std::string line; std::getline(in, line);) {
    auto a = line.find(':'), b = line.find(':', a + 1);
    std::string ctl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (ctl == "memory") mem = path;
    if (ctl == "pids") pids = path;
    if (ctl == "cpu" || ctl == "cpu,cpuacct") cpu = path;
    if (ctl.empty()) unified = path;
  }
  // The command sits in a per-exec child cgroup; the box's limits are on an ancestor under
  // agentbox/. Walk up until the file that holds the limit is found.
  auto find_up = [&](const std::string& mount, std::string p, const std::string& file) {
    for (; p.find("/agentbox") != std::string::npos; p = p.substr(0, p.rfind('/'))) {
      std::string v = slurp("/sys/fs/cgroup/" + mount + p + "/" + file);
      if (!v.empty() && v != "max\n" && v != "-1\n" && v != "9223372036854771712\n") return v;
    }
    return std::string();
  };
  if (!mem.empty()) {  // cgroup v1
    EXPECT_THAT(mem, HasSubstr("agentbox"));
    EXPECT_EQ(std::stoll("0" + find_up("memory", mem, "memory.limit_in_bytes")), 200ll << 20);
    EXPECT_EQ(find_up("pids", pids, "pids.max"), "77\n");
    EXPECT_EQ(std::stoll("0" + find_up("cpu", cpu, "cpu.cfs_quota_us")), 50000);
  } else {
    ASSERT_FALSE(unified.empty());
    EXPECT_THAT(unified, HasSubstr("agentbox"));
  }
}

TEST_F(PostureTest, EnvironmentIsOnlyWhatTheSessionSet) {
  Box c(shared_daemon(), "posture-env", json{{"env", {{"FOO", "bar"}}}});
  auto r = c.exec({"env"});
  std::string env = r.value("stdout", "");
  EXPECT_THAT(env, HasSubstr("FOO=bar"));
  EXPECT_THAT(env, HasSubstr("HOME=/workspace"));
  for (const char* leak : {"AGENTBOX_BIN_DIR", "GTEST", "LD_PRELOAD", "token", "TOKEN", "SSH_"}) {
    EXPECT_THAT(env, Not(HasSubstr(leak))) << env;
  }
  std::string host_env = slurp("/proc/" + std::to_string(pa_) + "/environ");
  EXPECT_THAT(host_env, Not(HasSubstr("AGENTBOX_BIN_DIR")));
}

}  // namespace
}  // namespace agentbox::security
