// SECURITY.md T1: processes, namespaces, terminal.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>
#include <vector>

#include "security/box_fixture.h"

namespace agentbox::security {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(ProcessTest, OnlyTheBoxPidsAreVisibleAndPid1IsAgentboxInit) {
  Box a(shared_daemon(), "t1-pids");
  auto r = a.sh("cat /proc/1/comm; ls -d /proc/[0-9]* | wc -l");
  std::string out = r.value("stdout", "");
  EXPECT_THAT(out, StartsWith("agentbox-init\n"));
  int visible = std::stoi(out.substr(out.find('\n') + 1));
  EXPECT_LE(visible, 5) << "only init, sh, cat/ls, wc should be visible: " << out;
}

TEST(ProcessTest, DaemonAndOtherBoxesCannotBeSignalled) {
  Box a(shared_daemon(), "t1-kill-a");
  Box b(shared_daemon(), "t1-kill-b");
  ASSERT_EQ(b.sh("sleep 600 >/dev/null 2>&1 &").value("exit_code", -1), 0);
  std::vector<pid_t> b_pids = host_pids_of_uid(b.uid());
  ASSERT_FALSE(b_pids.empty());
  EXPECT_EQ(a.probe("kill", {std::to_string(shared_daemon().pid())}), "DENIED ESRCH");
  EXPECT_EQ(a.probe("kill", {std::to_string(b_pids[0])}), "DENIED ESRCH");
  // kill -9 -1 inside kills only inside: B's sleeper and the daemon live on.
  a.probe("kill_all");
  usleep(200000);
  EXPECT_EQ(kill(b_pids[0], 0), 0) << "B's process died";
  EXPECT_EQ(kill(shared_daemon().pid(), 0), 0);
  EXPECT_EQ(b.sh("echo alive").value("stdout", ""), "alive\n");
  EXPECT_EQ(a.sh("echo alive").value("stdout", ""), "alive\n") << "box A unusable after kill -1";
}

TEST(ProcessTest, PtraceProcessVmAndProcMemAreDenied) {
  Box a(shared_daemon(), "t1-ptrace");
  EXPECT_THAT(a.probe("ptrace", {"1"}), StartsWith("DENIED"));
  EXPECT_THAT(a.probe("process_vm_writev", {"1"}), StartsWith("DENIED"));
  EXPECT_THAT(a.probe("proc_mem_write"), StartsWith("DENIED"));
}

TEST(ProcessTest, TiocstiAndTioclinuxAreDeniedAlsoWithHighBits) {
  Box a(shared_daemon(), "t1-tty");
  EXPECT_EQ(a.probe("tiocsti"), "DENIED EPERM");
  EXPECT_EQ(a.probe("tiocsti_high"), "DENIED EPERM");
  EXPECT_EQ(a.probe("tioclinux"), "DENIED EPERM");
}

TEST(ProcessTest, SethostnameDeniedAndIpcNotSharedAcrossBoxes) {
  Box a(shared_daemon(), "t1-ipc-a");
  Box b(shared_daemon(), "t1-ipc-b");
  EXPECT_THAT(a.probe("sethostname"), StartsWith("DENIED"));
  auto mk = a.sh("ipcmk -M 4096 && ipcs -m | grep -c 4096");
  EXPECT_EQ(mk.value("exit_code", -1), 0) << mk.dump();
  EXPECT_EQ(b.sh("ipcs -m | grep -c 4096").value("stdout", ""), "0\n");
  ASSERT_EQ(a.sh("echo x > /dev/shm/posix-a").value("exit_code", -1), 0);
  EXPECT_NE(b.sh("cat /dev/shm/posix-a").value("exit_code", 0), 0);
}

TEST(ProcessTest, HostAbstractUnixSocketIsUnreachable) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::string name = "agentbox-canary-" + std::to_string(getpid());
  memcpy(sa.sun_path + 1, name.data(), name.size());
  socklen_t len = static_cast<socklen_t>(sizeof(sa_family_t) + 1 + name.size());
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&sa), len), 0);
  ASSERT_EQ(listen(s, 1), 0);
  Box a(shared_daemon(), "t1-abstract");
  EXPECT_EQ(a.probe("abstract_connect", {name}), "DENIED ECONNREFUSED");
  close(s);
}

TEST(ProcessTest, SetsidDoubleForkIgnoringSigtermDiesAtTimeout) {
  Box a(shared_daemon(), "t1-orphan");
  auto r = a.exec({"/workspace/.probe", "orphan", "/workspace/orphan.pid"}, 2);
  EXPECT_TRUE(r.value("timed_out", false)) << r.dump();
  EXPECT_EQ(r.value("exit_code", 0), -1);
  // Nothing of the command is left on the host: only the box's init (root) remains, and no
  // process of the session uid.
  EXPECT_TRUE(wait_no_pids_of_uid(a.uid(), 5)) << "processes of uid " << a.uid() << " survived";
}

TEST(ProcessTest, SessionEndKillsEverythingOfTheSession) {
  Box a(shared_daemon(), "t1-end");
  ASSERT_EQ(
      a.sh("setsid sh -c 'trap \"\" TERM; sleep 600' >/dev/null 2>&1 &").value("exit_code", -1), 0);
  usleep(100000);
  ASSERT_FALSE(host_pids_of_uid(a.uid()).empty());
  auto d = a.client().request("DELETE", "/v1/sessions/t1-end");
  ASSERT_TRUE(d && d->status == 200);
  EXPECT_TRUE(wait_no_pids_of_uid(a.uid(), 5));
}

TEST(ProcessTest, SigkillOfTheDaemonKillsItsBoxes) {
  testing::TempDir data("agentbox-t1-data");
  Daemon d({"--backend", "ns", "--data-dir", data.path()});
  Box a(d, "t1-orphaned-box");
  pid_t sleeper = start_sleeper(a);
  ASSERT_GT(sleeper, 0);
  // The box's cgroup as the host sees it (v1 pids hierarchy, else the unified one), and the
  // daemon's own cgroup above it.
  std::string root = "/sys/fs/cgroup/pids";
  std::string box_cg = cgroup_of(sleeper, "pids");
  if (box_cg.empty()) {
    root = "/sys/fs/cgroup";
    box_cg = cgroup_of(sleeper, "");
  }
  ASSERT_THAT(box_cg, StartsWith("/agentbox-"));
  const std::string daemon_cg = root + box_cg.substr(0, box_cg.find('/', 1));
  d.stop(SIGKILL);
  EXPECT_TRUE(wait_no_pids_of_uid(a.uid(), 5)) << "box processes outlived a SIGKILLed daemon";
  // What the SIGKILLed daemon could not clean up, its next start on the data dir removes, and
  // that daemon's SIGTERM takes its own cgroup with it.
  {
    // No pool on the restart: its first pooled box would take the name pool-1 again.
    Daemon again({"--backend", "ns", "--data-dir", data.path(), "--pool", "0"});
    EXPECT_FALSE(std::filesystem::exists(root + box_cg)) << root + box_cg << " outlived a restart";
  }
  EXPECT_FALSE(std::filesystem::exists(daemon_cg)) << daemon_cg << " outlived a clean stop";
}

// The pids of every cgroup.procs at or below `dir` (a box cgroup and its leaves).
std::vector<pid_t> procs_under(const std::filesystem::path& dir) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->path().filename() != "cgroup.procs") continue;
    std::istringstream in(slurp(it->path().string()));
    for (pid_t p; in >> p;) out.push_back(p);
  }
  return out;
}

// The pool's boxes of the daemon whose cgroup is `daemon_cg` (their cgroups are "pool-<n>"),
// but for `except` (a session's box, which may have come from the pool): each one's pids.
std::vector<std::vector<pid_t>> pooled_boxes(const std::string& daemon_cg,
                                             const std::string& except = "") {
  std::vector<std::vector<pid_t>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(daemon_cg, ec)) {
    if (!e.is_directory() || !e.path().filename().string().starts_with("pool-")) continue;
    if (e.path().string() == except) continue;
    out.push_back(procs_under(e.path()));
  }
  return out;
}

// Waits up to 20 s for `n` pooled boxes with a running init each; their pids.
std::vector<pid_t> wait_pooled(const std::string& daemon_cg, std::size_t n,
                               const std::string& except = "") {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    auto boxes = pooled_boxes(daemon_cg, except);
    std::vector<pid_t> pids;
    std::size_t running = 0;
    for (const auto& b : boxes) {
      running += b.empty() ? 0 : 1;
      pids.insert(pids.end(), b.begin(), b.end());
    }
    if (running >= n || std::chrono::steady_clock::now() >= deadline) return pids;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TEST(ProcessTest, PooledBoxesDieWithTheirDaemonAndItsNextStartReapsThem) {
  testing::TempDir data("agentbox-t1-pool");
  const std::vector<std::string> args = {"--backend", "ns", "--data-dir", data.path()};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> all = args;
    all.insert(all.end(), more.begin(), more.end());
    return all;
  };
  std::string root = "/sys/fs/cgroup/pids";
  std::string box_cg, daemon_cg;
  {
    Daemon d(with({"--pool", "2"}));
    Box a(d, "t1-pool-owner");
    pid_t sleeper = start_sleeper(a);
    ASSERT_GT(sleeper, 0);
    box_cg = cgroup_of(sleeper, "pids");
    if (box_cg.empty()) {
      root = "/sys/fs/cgroup";
      box_cg = cgroup_of(sleeper, "");
    }
    ASSERT_THAT(box_cg, StartsWith("/agentbox-"));
    daemon_cg = root + box_cg.substr(0, box_cg.find('/', 1));
    // The session's box is not counted (it may be a pooled one, bound): two more wait.
    const std::string session_cg =
        root + box_cg.substr(0, box_cg.find('/', box_cg.find('/', 1) + 1));
    std::vector<pid_t> pooled = wait_pooled(daemon_cg, 2, session_cg);
    ASSERT_GE(pooled.size(), 2u) << "the pool did not fill";
    d.stop(SIGKILL);
    for (pid_t p : pooled) {
      EXPECT_TRUE(testing::wait_dead(p, std::chrono::seconds(5))) << "pooled box pid " << p;
    }
    EXPECT_TRUE(wait_no_pids_of_uid(a.uid(), 5));
  }
  {
    // The next start (without a pool of its own) removes the dead daemon's pooled boxes'
    // cgroups with the session's.
    Daemon again(with({"--pool", "0"}));
    EXPECT_TRUE(pooled_boxes(daemon_cg).empty()) << "a dead daemon's pooled box outlived a restart";
    EXPECT_FALSE(std::filesystem::exists(root + box_cg)) << root + box_cg;
  }
  EXPECT_FALSE(std::filesystem::exists(daemon_cg)) << daemon_cg << " outlived a clean stop";
  {
    // A clean stop takes the pool's boxes with it.
    Daemon d(with({"--pool", "2"}));
    std::vector<pid_t> pooled = wait_pooled(daemon_cg, 2);
    ASSERT_GE(pooled.size(), 2u) << "the pool did not fill";
    d.stop(SIGTERM);
    for (pid_t p : pooled) {
      EXPECT_TRUE(testing::wait_dead(p, std::chrono::seconds(5))) << "pooled box pid " << p;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(daemon_cg)) << daemon_cg << " outlived a clean stop";
}

TEST(ProcessTest, CgroupsCannotBeWrittenOrMounted) {
  Box a(shared_daemon(), "t1-cgroup");
  EXPECT_THAT(a.probe("cgroup_procs_write", {"/sys/fs/cgroup/cgroup.procs"}), StartsWith("DENIED"));
  EXPECT_THAT(a.probe("cgroup_procs_write", {"/sys/fs/cgroup/memory/cgroup.procs"}),
              StartsWith("DENIED"));
  EXPECT_THAT(a.probe("mount_cgroup"), StartsWith("DENIED"));
}

}  // namespace
}  // namespace agentbox::security
