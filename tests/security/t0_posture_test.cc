// SECURITY.md T0: posture, checked from the host on a process running inside a box.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "security/box_fixture.h"

namespace agentbox::security {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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
    ASSERT_GT(pa_, 0) << "sleeper not found on the host";
    ASSERT_GT(pb_, 0) << "sleeper not found on the host";
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

// The five capability sets, no_new_privs and the filter, read from the host on every thread of
// a multi-threaded command (a thread could in principle hold other credentials than its leader).
TEST_F(PostureTest, NoNewPrivsSeccompAndNoCapabilitiesOnEveryThread) {
  ASSERT_GT(pa_, 0);
  // A python3 with 4 extra threads, left running in the background so the host can look at it.
  auto r = a_->exec({"/bin/sh", "-c",
                     "python3 -c 'import threading,time\n"
                     "for i in range(4): threading.Thread(target=time.sleep,args=(600,)).start()\n"
                     "' >/dev/null 2>&1 &"});
  ASSERT_EQ(r.value("exit_code", -2), 0) << r.dump();
  pid_t py = -1;
  for (int i = 0; i < 200 && py < 0; ++i) {
    for (pid_t p : host_pids_of_uid(a_->uid())) {
      if (slurp("/proc/" + std::to_string(p) + "/comm") == "python3\n" &&
          std::distance(std::filesystem::directory_iterator("/proc/" + std::to_string(p) + "/task"),
                        std::filesystem::directory_iterator{}) == 5) {
        py = p;
      }
    }
    if (py < 0) usleep(20000);
  }
  ASSERT_GT(py, 0) << "the 5-thread python3 did not show up on the host";
  std::vector<std::string> tasks;
  for (pid_t p : {pa_, py}) {
    for (const auto& t :
         std::filesystem::directory_iterator("/proc/" + std::to_string(p) + "/task")) {
      tasks.push_back(t.path().string());
    }
  }
  ASSERT_EQ(tasks.size(), 6u);  // the sleeper's one thread and python's five
  for (const auto& t : tasks) {
    std::istringstream in(slurp(t + "/status"));
    std::map<std::string, std::string> f;
    for (std::string line; std::getline(in, line);) {
      auto c = line.find(':');
      if (c == std::string::npos) continue;
      auto v = line.find_first_not_of(" \t", c + 1);
      f[line.substr(0, c)] = v == std::string::npos ? "" : line.substr(v);
    }
    EXPECT_EQ(f["NoNewPrivs"], "1") << t;
    EXPECT_EQ(f["Seccomp"], "2") << t;
    for (const char* cap : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}) {
      EXPECT_EQ(f[cap], "0000000000000000") << t << " " << cap;
    }
  }
  ::kill(py, SIGKILL);
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

// The mount table, mountpoint by mountpoint with its ro/nosuid/nodev/noexec flags, against the
// design (shared/DESIGN.md "The ns backend", linux/mounts.cc): nothing more, nothing less.
std::map<std::string, std::string> designed_mounts() {
  namespace fs = std::filesystem;
  const std::string sys = "ro,nosuid,nodev";
  std::map<std::string, std::string> m = {
      {"/", sys},
      {"/workspace", "rw,nosuid,nodev"},
      {"/tmp", "rw,nosuid,nodev"},
      {"/cache", "rw,nosuid,nodev"},  // seed 004: package caches, a capped tmpfs
      {"/mnt", "rw,nosuid,nodev,noexec"},  // mountpoints for mounts added live; root's, 0755
      {"/proc", "rw,nosuid,nodev,noexec"},
      {"/dev", "rw,nosuid,nodev,noexec"},
      {"/dev/pts", "rw,nosuid,noexec"},
      {"/dev/shm", "rw,nosuid,nodev"},
  };
  // The host's system dirs that are real directories (a symlink, e.g. /bin -> usr/bin, is
  // recreated as a symlink, not mounted).
  for (const char* d : {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    if (fs::is_directory(fs::symlink_status(d))) m[d] = sys;
  }
  // readonly_dirs (daemon config; default /opt when the host has it): the host's toolchains,
  // read-only like the system dirs, at the same path.
  if (fs::is_directory("/opt")) m["/opt"] = sys;
  // procfs entries made read-only on top of the box's /proc.
  for (const char* p : {"sys", "sysrq-trigger", "bus", "irq", "fs"}) {
    if (fs::exists(std::string("/proc/") + p)) m[std::string("/proc/") + p] = "ro,nosuid,nodev";
  }
  // The real device nodes: bind mounts that keep device access (no nodev), never exec/setuid.
  for (const char* n : {"null", "zero", "full", "random", "urandom", "tty"}) {
    if (fs::is_character_file(std::string("/dev/") + n)) {
      m[std::string("/dev/") + n] = "rw,nosuid,noexec";
    }
  }
  // The curated /etc entries present on the host (a symlink into /usr stays a symlink).
  std::vector<std::string> etc = {"ld.so.cache",     "ld.so.conf",
                                  "ld.so.conf.d",    "resolv.conf",
                                  "host.conf",       "gai.conf",
                                  "localtime",       "timezone",
                                  "protocols",       "services",
                                  "ssl/certs",       "ssl/openssl.cnf",
                                  "ca-certificates", "ca-certificates.conf",
                                  "alternatives",    "os-release",
                                  "debian_version",  "mime.types",
                                  "bash.bashrc",     "inputrc",
                                  "profile",         "perl"};
  for (const auto& e : fs::directory_iterator("/etc")) {
    if (e.path().filename().string().rfind("python3", 0) == 0) {
      etc.push_back(e.path().filename());
    }
  }
  for (const auto& name : etc) {
    const fs::path host = "/etc/" + name;
    std::error_code ec;
    auto st = fs::symlink_status(host, ec);
    if (ec || !fs::exists(st)) continue;
    if (fs::is_symlink(st)) {
      auto real = fs::canonical(host, ec);
      if (ec || real.string().rfind("/usr/", 0) == 0) continue;
      st = fs::status(real, ec);
    }
    if (fs::is_directory(st) || fs::is_regular_file(st)) m["/etc/" + name] = sys;
  }
  return m;
}

// "ro,nosuid,nodev,relatime" -> "ro,nosuid,nodev": the flags the design is about, in order.
std::string security_flags(const std::string& opts) {
  std::set<std::string> have;
  std::istringstream in(opts);
  for (std::string o; std::getline(in, o, ',');) have.insert(o);
  std::string out = have.count("ro") ? "ro" : "rw";
  for (const char* f : {"nosuid", "nodev", "noexec"}) {
    if (have.count(f)) out += std::string(",") + f;
  }
  return out;
}

TEST_F(PostureTest, MountTableIsExactlyTheDesignedList) {
  ASSERT_GT(pa_, 0);
  std::map<std::string, std::string> seen;
  std::istringstream in(slurp("/proc/" + std::to_string(pa_) + "/mountinfo"));
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string id, parent, devno, root, mnt, opts;
    f >> id >> parent >> devno >> root >> mnt >> opts;
    EXPECT_TRUE(seen.emplace(mnt, security_flags(opts)).second) << "mounted twice: " << line;
  }
  const auto designed = designed_mounts();
  // The list itself first (a readable diff), then each mount's flags.
  std::set<std::string> seen_points, designed_points;
  for (const auto& [p, f] : seen) seen_points.insert(p);
  for (const auto& [p, f] : designed) designed_points.insert(p);
  EXPECT_EQ(seen_points, designed_points);
  for (const auto& [p, flags] : designed) {
    auto it = seen.find(p);
    if (it == seen.end()) continue;
    std::string got = it->second;
    // The read-only /proc entries are binds out of the box's noexec /proc: the kernel may carry
    // noexec over onto them (harmless, and no file there is executable anyway).
    if (p.rfind("/proc/", 0) == 0 && got.size() > 7 && got.ends_with(",noexec")) {
      got.resize(got.size() - 7);
    }
    EXPECT_EQ(got, flags) << p;
  }
}

// Limits from the session's `limits`, read from the host in the box's own cgroup (the parent of
// the init's v2 leaf, or the init's v1 cgroup): memory with no swap on top, cpu quota, pids.
TEST_F(PostureTest, CgroupLimitsAreTheSessionLimits) {
  Box c(shared_daemon(), "posture-limits",
        json{{"limits", {{"memory_mb", 200}, {"cpu_percent", 50}, {"max_pids", 77}}}});
  pid_t p = start_sleeper(c);
  ASSERT_GT(p, 0);
  pid_t init = box_init_pid(p);
  ASSERT_GT(init, 0);
  const std::string mem = cgroup_of(init, "memory");
  auto trim = [](std::string v) {
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
    return v;
  };
  if (!mem.empty()) {  // cgroup v1: the init sits in the box cgroup itself
    EXPECT_THAT(mem, HasSubstr("/agentbox-"));
    const std::string m = "/sys/fs/cgroup/memory" + mem;
    EXPECT_EQ(trim(slurp(m + "/memory.limit_in_bytes")), std::to_string(200ll << 20));
    // SECURITY: no swap escape: RAM + swap together are capped at the RAM limit.
    ASSERT_TRUE(std::filesystem::exists(m + "/memory.memsw.limit_in_bytes"))
        << "no swap accounting on this host: memsw cannot be checked";
    EXPECT_EQ(trim(slurp(m + "/memory.memsw.limit_in_bytes")), std::to_string(200ll << 20));
    EXPECT_EQ(trim(slurp("/sys/fs/cgroup/pids" + cgroup_of(init, "pids") + "/pids.max")), "77");
    const std::string cpu = "/sys/fs/cgroup/cpu" + cgroup_of(init, "cpu");
    EXPECT_EQ(trim(slurp(cpu + "/cpu.cfs_quota_us")), "50000");
    EXPECT_EQ(trim(slurp(cpu + "/cpu.cfs_period_us")), "100000");
    // The sleeper (moved there from its exec's cgroup) is in the same box cgroup.
    EXPECT_EQ(cgroup_of(p, "memory"), mem);
  } else {  // cgroup v2: the init is in <box>/init; limits are on <box>
    std::string leaf = cgroup_of(init, "");
    ASSERT_FALSE(leaf.empty());
    ASSERT_EQ(leaf.substr(leaf.rfind('/')), "/init") << leaf;
    std::string root = std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers") &&
                               !std::filesystem::exists("/sys/fs/cgroup/memory")
                           ? "/sys/fs/cgroup"
                           : "/sys/fs/cgroup/unified";
    const std::string box = root + leaf.substr(0, leaf.rfind('/'));
    EXPECT_EQ(trim(slurp(box + "/memory.max")), std::to_string(200ll << 20));
    EXPECT_EQ(trim(slurp(box + "/memory.swap.max")), "0");
    EXPECT_EQ(trim(slurp(box + "/pids.max")), "77");
    EXPECT_EQ(trim(slurp(box + "/cpu.max")), "50000 100000");
  }
}

// SECURITY: the daemon outlives any box under memory pressure: -1000 for agentboxd, positive for
// a box's init and more so for its commands (the OOM killer picks the command first).
TEST_F(PostureTest, OomScoreAdjProtectsTheDaemonNotTheBoxes) {
  ASSERT_GT(pa_, 0);
  auto adj = [](pid_t pid) {
    std::string v = slurp("/proc/" + std::to_string(pid) + "/oom_score_adj");
    return v.empty() ? -9999 : std::stoi(v);
  };
  // Lowering below 0 takes CAP_SYS_RESOURCE. A host that withholds it even from root (some
  // container runtimes) leaves the daemon at its inherited value, with a warning in its log; the
  // boxes must then still rank above it.
  const bool can = (std::stoull(proc_status(shared_daemon().pid(), "CapEff"), nullptr, 16) >>
                    24 /* CAP_SYS_RESOURCE */) &
                   1;
  if (can) {
    EXPECT_EQ(adj(shared_daemon().pid()), -1000);
  } else {
    std::printf("[   NOTE   ] agentboxd has no CAP_SYS_RESOURCE here: it cannot go below %d\n",
                adj(shared_daemon().pid()));
    EXPECT_LE(adj(shared_daemon().pid()), 0);
    EXPECT_THAT(shared_daemon().log(), HasSubstr("could not set the daemon's oom_score_adj"));
  }
  pid_t init = box_init_pid(pa_);
  ASSERT_GT(init, 0);
  EXPECT_EQ(adj(init), 100);
  EXPECT_EQ(adj(pa_), 500);
  // What a command reads about itself agrees with the host.
  EXPECT_EQ(a_->sh("cat /proc/self/oom_score_adj").value("stdout", ""), "500\n");
}

TEST_F(PostureTest, EnvironmentIsOnlyWhatTheSessionSet) {
  // The daemon really holds its token in its environment (else this test proves nothing).
  ASSERT_THAT(slurp("/proc/" + std::to_string(shared_daemon().pid()) + "/environ"),
              HasSubstr(std::string("AGENTBOX_TOKEN=") + kSuiteToken));
  Box c(shared_daemon(), "posture-env", json{{"env", {{"FOO", "bar"}}}});
  auto r = c.exec({"env"});
  std::string env = r.value("stdout", "");
  // Exactly the defaults plus what the session set, nothing of the daemon's.
  std::set<std::string> names;
  std::istringstream in(env);
  for (std::string line; std::getline(in, line);) names.insert(line.substr(0, line.find('=')));
  EXPECT_EQ(names,
            (std::set<std::string>{"FOO", "HOME", "LANG", "LOGNAME", "PATH", "TERM", "USER",
                                   // seed 004: the package caches on the box's /cache tmpfs
                                   "XDG_CACHE_HOME", "PIP_CACHE_DIR", "UV_CACHE_DIR",
                                   "npm_config_cache", "BUN_INSTALL_CACHE_DIR"}))
      << env;
  EXPECT_THAT(env, HasSubstr("FOO=bar\n"));
  EXPECT_THAT(env, HasSubstr("HOME=/workspace\n"));
  // From the host: a command, the box's init, its command line: no token anywhere.
  pid_t p = start_sleeper(c);
  ASSERT_GT(p, 0);
  pid_t init = box_init_pid(p);
  ASSERT_GT(init, 0);
  for (pid_t pid : {p, init, pa_}) {
    for (const char* file : {"environ", "cmdline"}) {
      std::string v = slurp("/proc/" + std::to_string(pid) + "/" + file);
      EXPECT_THAT(v, Not(HasSubstr(kSuiteToken))) << pid << " " << file;
      EXPECT_THAT(v, Not(HasSubstr("AGENTBOX_TOKEN"))) << pid << " " << file;
      EXPECT_THAT(v, Not(HasSubstr("AGENTBOX_BIN_DIR"))) << pid << " " << file;
    }
  }
  // Nor anywhere a command can read (the box's /etc, /proc of its own processes).
  auto g = c.sh(std::string("grep -rsl ") + kSuiteToken + " /etc /proc/[0-9]*/environ; true");
  EXPECT_EQ(g.value("stdout", ""), "") << g.dump();
}

}  // namespace
}  // namespace agentbox::security
