// The box mechanics (linux/box.h, linux/mounts.h, agentbox-init) on real boxes: namespaces, the
// filesystem, identity, the init protocol, death with the creator. Runs as root; never skips.
#include "linux/box.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "linux/cgroup.h"
#include "linux/host_binds.h"
#include "linux/image_root.h"
#include "linux/mounts.h"
#include "linux/seccomp_policy.h"
#include "support/support.h"

namespace agentbox::linux {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr uid_t kUid = 61234;
constexpr gid_t kGid = 61234;

std::string init_path() {
  if (const char* dir = std::getenv("AGENTBOX_BIN_DIR")) return std::string(dir) + "/agentbox-init";
  // build/tests/<test> -> build/bin/agentbox-init
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "bin" / "agentbox-init")
      .string();
}

using testing::slurp;

bool pid_alive(pid_t pid) {
  // A zombie still has /proc/<pid>; look at its state too.
  std::string st = slurp("/proc/" + std::to_string(pid) + "/stat");
  if (st.empty()) return false;
  auto rp = st.rfind(')');
  return rp != std::string::npos && rp + 2 < st.size() && st[rp + 2] != 'Z';
}

struct CmdResult {
  int status = -1;
  std::string out;
  std::string err;
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
};

// Owns the pieces a box needs and talks to it synchronously: enough to test the mechanics
// without the Asio side (that is ns_backend_test's job).
class BoxTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto d = detect_cgroup_driver("/sys/fs/cgroup", "agentbox-boxtest-" + std::to_string(getpid()));
    ASSERT_TRUE(d) << d.error().message;
    driver_ = d->release();
  }
  static void TearDownTestSuite() {
    // The boxes' cgroups, then this process's parent in every hierarchy: nothing is left.
    EXPECT_TRUE(driver_->remove_parent());
    delete driver_;
    driver_ = nullptr;
  }

  void SetUp() override {
    char ws[] = "/tmp/agentbox-boxtest-ws-XXXXXX";
    ASSERT_NE(::mkdtemp(ws), nullptr);
    workspace_ = ws;
    ASSERT_EQ(::chown(ws, kUid, kGid), 0);
    char mp[] = "/tmp/agentbox-boxtest-root-XXXXXX";
    ASSERT_NE(::mkdtemp(mp), nullptr);
    mountpoint_ = mp;
    init_fd_ = UniqueFd(::open(init_path().c_str(), O_PATH | O_CLOEXEC));
    ASSERT_TRUE(init_fd_) << init_path();
    auto prog = build_box_seccomp_program();
    ASSERT_TRUE(prog) << prog.error().message;
    seccomp_ = std::move(*prog);
  }

  void TearDown() override {
    box_.reset();
    if (cgroup_) (void)cgroup_->destroy();
    std::error_code ec;
    fs::remove_all(workspace_, ec);
    fs::remove(mountpoint_, ec);
  }

  BoxFsSpec fs_spec() const {
    BoxFsSpec s;
    s.workspace_dir = workspace_;
    s.uid = kUid;
    s.gid = kGid;
    return s;
  }

  Result<std::unique_ptr<Box>> make_box(const BoxFsSpec& fs_spec, const std::string& key) {
    auto plan = plan_box_fs(fs_spec);
    if (!plan) return std::unexpected(plan.error());
    return make_planned_box(std::move(*plan), key);
  }

  // A box from a plan made earlier; `tweak` may change the spec before the clone.
  Result<std::unique_ptr<Box>> make_planned_box(
      MountPlan plan, const std::string& key,
      const std::function<void(BoxSpec&)>& tweak = nullptr) {
    plan_ = std::move(plan);
    auto cg = driver_->create(key, CgroupLimits{});
    if (!cg) return std::unexpected(cg.error());
    cgroup_ = std::move(*cg);
    BoxSpec spec;
    spec.key = key;
    spec.root_mountpoint = mountpoint_;
    spec.init_fd = init_fd_.get();
    spec.fs = &plan_;
    spec.seccomp = &seccomp_;
    spec.cgroup = cgroup_.get();
    if (tweak) tweak(spec);
    return Box::create(spec);
  }

  void start(const BoxFsSpec& s) {
    auto b = make_box(s, "b" + std::to_string(++boxes_));
    ASSERT_TRUE(b) << b.error().message;
    box_ = std::move(*b);
  }
  void start() { start(fs_spec()); }

  // One command through the init protocol, synchronously; output read once it exits.
  CmdResult run(std::vector<std::string> argv, std::string cwd = "/workspace") {
    CmdResult r;
    ExecCommand cmd;
    cmd.id = ++ids_;
    cmd.argv = std::move(argv);
    cmd.env = {"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/workspace"};
    cmd.cwd = std::move(cwd);
    cmd.uid = kUid;
    cmd.gid = kGid;
    cmd.oom_score_adj = 500;
    auto msg = encode_exec_request(cmd, false);
    if (!msg) {
      ADD_FAILURE() << msg.error().message;
      return r;
    }
    auto exec_cg = cgroup_->make_child("x" + std::to_string(cmd.id));
    if (!exec_cg) {
      ADD_FAILURE() << exec_cg.error().message;
      return r;
    }
    int out[2], err[2], go[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(go, O_CLOEXEC), 0);
    int fds[] = {out[1], err[1], go[0]};
    EXPECT_EQ(send_exec_request(box_->control_fd(), *msg, fds, 3, false), 0);
    ::close(out[1]);
    ::close(err[1]);
    ::close(go[0]);
    for (;;) {
      BoxMessage m;
      int n = recv_box_message(box_->control_fd(), false, &m);
      if (n <= 0) {
        ADD_FAILURE() << "control socket: " << (n == 0 ? "EOF" : strerror(errno));
        break;
      }
      if (m.type == initproto::MsgType::kChildReady && m.id == cmd.id) {
        EXPECT_GT(m.sender_pid, 0);
        last_host_pid_ = m.sender_pid;
        EXPECT_TRUE((*exec_cg)->add_process(m.sender_pid));
        EXPECT_EQ(::write(go[1], "g", 1), 1);
      } else if (m.type == initproto::MsgType::kExited && m.id == cmd.id) {
        r.status = m.status;
        break;
      }
    }
    ::close(go[1]);
    r.out = drain(out[0]);
    r.err = drain(err[0]);
    ::close(out[0]);
    ::close(err[0]);
    // Move survivors (background jobs) to the box cgroup and drop the exec's.
    EXPECT_TRUE((*exec_cg)->move_processes_to(*cgroup_));
    (void)(*exec_cg)->destroy();
    return r;
  }
  CmdResult sh(const std::string& script) { return run({"/bin/sh", "-c", script}); }

  // What is in the pipe now (the writer may be a background job that never closes it).
  static std::string drain(int fd) {
    std::string s;
    char buf[4096];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) break;
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      s.append(buf, static_cast<std::size_t>(n));
    }
    return s;
  }

  static CgroupDriver* driver_;
  std::string workspace_;
  std::string mountpoint_;
  UniqueFd init_fd_;
  SeccompProgram seccomp_;
  MountPlan plan_;
  std::unique_ptr<Cgroup> cgroup_;
  std::unique_ptr<Box> box_;
  std::uint64_t ids_ = 0;
  int boxes_ = 0;
  pid_t last_host_pid_ = 0;
};

CgroupDriver* BoxTest::driver_ = nullptr;

TEST_F(BoxTest, RunsACommandAsTheSessionUser) {
  start();
  CmdResult r = run({"/bin/true"});
  EXPECT_EQ(r.status, 0) << r.err;
  r = run({"id"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "uid=61234(agent) gid=61234(agent) groups=61234(agent)\n");
  r = sh("echo $HOME; pwd; echo err >&2; exit 3");
  EXPECT_EQ(r.exit_code(), 3);
  EXPECT_EQ(r.out, "/workspace\n/workspace\n");
  EXPECT_EQ(r.err, "err\n");
}

TEST_F(BoxTest, MissingCommandAndCwdExit127WithAMessage) {
  start();
  CmdResult r = run({"no-such-command-xyz"});
  EXPECT_EQ(r.exit_code(), 127);
  EXPECT_NE(r.err.find("no-such-command-xyz"), std::string::npos) << r.err;
  r = run({"/bin/true"}, "/no/such/dir");
  EXPECT_EQ(r.exit_code(), 127);
  EXPECT_NE(r.err.find("/no/such/dir"), std::string::npos) << r.err;
}

TEST_F(BoxTest, Pid1IsTheInitAndOnlyBoxPidsAreVisible) {
  start();
  CmdResult r = run({"cat", "/proc/1/cmdline"});
  EXPECT_EQ(r.out, std::string("agentbox-init") + '\0');
  // When the shell expands the glob, the box holds exactly the init and the shell.
  r = sh("cat /proc/[0-9]*/comm > /tmp/comm; sort /tmp/comm | tr '\\n' ' '");
  EXPECT_EQ(r.out, "agentbox-init sh ") << r.err;
  r = sh("echo $$");
  EXPECT_LT(std::stoi(r.out), 20);
  EXPECT_GT(last_host_pid_, 1);
  // The init's namespaces differ from ours.
  for (const char* ns : {"mnt", "pid", "ipc", "uts", "net", "cgroup"}) {
    auto mine = fs::read_symlink(std::string("/proc/self/ns/") + ns);
    auto box = fs::read_symlink("/proc/" + std::to_string(box_->init_pid()) + "/ns/" + ns);
    EXPECT_NE(mine, box) << ns;
  }
}

TEST_F(BoxTest, HostnameAndOnlyLoopback) {
  start();
  EXPECT_EQ(run({"cat", "/proc/sys/kernel/hostname"}).out, "agentbox\n");
  CmdResult r = sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
  EXPECT_EQ(r.out, "lo\n");
  // lo is up: a local TCP listener is reachable, the host's loopback is not this one.
  r = sh("cat /sys/class/net/lo/operstate 2>&1; grep -c . /proc/net/tcp");
  EXPECT_NE(r.out.find("No such file"), std::string::npos) << r.out;  // no /sys at all
}

TEST_F(BoxTest, HostFilesAreInvisible) {
  start();
  CmdResult r = sh("for p in /home /root /var /run /sys /srv /opt /boot " + workspace_ +
             " /etc/shadow /etc/ssh /etc/ssl/private; do test -e $p && echo $p; done; true");
  EXPECT_EQ(r.out, "");
  // /mnt is the box's own small tmpfs (mountpoints for live mounts), not the host's.
  r = sh("ls / | tr '\\n' ' '");
  EXPECT_EQ(r.out, "bin dev etc lib lib32 lib64 mnt proc sbin tmp usr workspace ");
  // Identity files are synthetic.
  r = run({"cat", "/etc/passwd"});
  EXPECT_NE(r.out.find("agent:x:61234:61234:agentbox:/workspace:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("daemon:"), std::string::npos) << r.out;
}

TEST_F(BoxTest, SystemIsReadOnlyWorkspaceAndTmpWritable) {
  start();
  for (const char* p : {"/x", "/usr/x", "/etc/passwd", "/etc/x", "/bin/x"}) {
    CmdResult r = sh(std::string("echo hi > ") + p);
    EXPECT_NE(r.exit_code(), 0) << p;
    EXPECT_NE(r.err.find("Read-only file system"), std::string::npos) << p << ": " << r.err;
  }
  CmdResult r = sh("echo ws > /workspace/a && echo tmp > /tmp/b && cat /workspace/a /tmp/b");
  EXPECT_EQ(r.out, "ws\ntmp\n") << r.err;
  struct stat st;
  ASSERT_EQ(::stat((workspace_ + "/a").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kUid);
  EXPECT_EQ(st.st_gid, kGid);
  // Mount options: nosuid/nodev on the workspace, caps on /tmp.
  r = sh("grep -E ' /(workspace|tmp|usr|proc/sys) ' /proc/self/mounts");
  EXPECT_NE(r.out.find("/workspace ext4 rw,nosuid,nodev"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tmpfs /tmp tmpfs rw,nosuid,nodev"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("size=262144k,nr_inodes=65536"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" /usr ext4 ro,nosuid,nodev"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" /proc/sys proc ro,"), std::string::npos) << r.out;
}

TEST_F(BoxTest, CommandsHaveNoPrivilegesAndOnlyStdioFds) {
  start();
  CmdResult r = run({"grep", "-E", "^(NoNewPrivs|Seccomp|Cap(Inh|Prm|Eff|Bnd|Amb)|Groups):", "/proc/self/status"});
  EXPECT_EQ(r.out,
            "Groups:\t \n"
            "CapInh:\t0000000000000000\n"
            "CapPrm:\t0000000000000000\n"
            "CapEff:\t0000000000000000\n"
            "CapBnd:\t0000000000000000\n"
            "CapAmb:\t0000000000000000\n"
            "NoNewPrivs:\t1\n"
            "Seccomp:\t2\n")
      << r.err;
  // ls's own fds, minus the one it lists them with.
  r = run({"ls", "-l", "/proc/self/fd/"});
  std::istringstream lines(r.out);
  std::string line, fds;
  while (std::getline(lines, line)) {
    auto arrow = line.find(" -> ");
    if (arrow == std::string::npos || line.find("/fd", arrow) != std::string::npos) continue;
    auto sp = line.rfind(' ', arrow - 1);
    fds += line.substr(sp + 1, arrow - sp - 1) + " ";
  }
  EXPECT_EQ(fds, "0 1 2 ") << r.out;
  // The init keeps only what it needs, and is not dumpable (its /proc files are root's).
  std::string init_status = slurp("/proc/" + std::to_string(box_->init_pid()) + "/status");
  EXPECT_NE(init_status.find("NoNewPrivs:\t1"), std::string::npos);
  EXPECT_NE(init_status.find("Seccomp:\t2"), std::string::npos);
  // Its bounding set is empty (emptied once at start, inherited by every command), and it keeps
  // only CAP_KILL, CAP_SETGID and CAP_SETUID (kInitRunCapabilities).
  EXPECT_NE(init_status.find("CapBnd:\t0000000000000000"), std::string::npos) << init_status;
  EXPECT_NE(init_status.find("CapPrm:\t00000000000000e0"), std::string::npos) << init_status;
  EXPECT_NE(init_status.find("CapEff:\t00000000000000e0"), std::string::npos) << init_status;
  r = sh("cat /proc/1/environ; ls /proc/1/fd");
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.err;
}

TEST_F(BoxTest, ExtraBindsReadOnlyAndReadWrite) {
  char ro[] = "/tmp/agentbox-boxtest-ro-XXXXXX";
  ASSERT_NE(::mkdtemp(ro), nullptr);
  ASSERT_EQ(::chmod(ro, 0755), 0);
  std::ofstream(std::string(ro) + "/f") << "shared\n";
  BoxFsSpec s = fs_spec();
  s.binds.push_back({ro, "/workspace/.skills/demo", true});
  s.binds.push_back({ro, "/data/ro", true});
  start(s);
  CmdResult r = run({"cat", "/workspace/.skills/demo/f", "/data/ro/f"});
  EXPECT_EQ(r.out, "shared\nshared\n") << r.err;
  r = sh("echo x > /data/ro/f");
  EXPECT_NE(r.err.find("Read-only file system"), std::string::npos) << r.err;
  r = sh("echo x > /workspace/.skills/demo/g");
  EXPECT_NE(r.err.find("Read-only file system"), std::string::npos) << r.err;
  fs::remove_all(ro);
}

TEST_F(BoxTest, PlantedSymlinkCannotRedirectAMountpoint) {
  // A workspace left with .skills -> a host dir: the mountpoint walk refuses the symlink, so the
  // box fails to start (naming the step) and nothing is created on the host.
  char target[] = "/tmp/agentbox-boxtest-victim-XXXXXX";
  ASSERT_NE(::mkdtemp(target), nullptr);
  fs::create_directory_symlink(target, workspace_ + "/.skills");
  BoxFsSpec s = fs_spec();
  s.binds.push_back({"/usr/share", "/workspace/.skills/demo", true});
  auto b = make_box(s, "symlink");
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("box filesystem"), std::string::npos) << b.error().message;
  EXPECT_NE(b.error().message.find("/workspace/.skills/demo"), std::string::npos)
      << b.error().message;
  EXPECT_TRUE(fs::is_empty(target));
  fs::remove_all(target);
}

// seed 002: a rw mount of a host dir the session user does not own is writable by it, without
// chowning anything on the host; what the agent creates belongs to the dir's owner there.
TEST_F(BoxTest, ReadWriteBindIsIdmappedNotChowned) {
  testing::TempDir root_owned("agentbox-boxtest-idmap");
  testing::TempDir other_owned("agentbox-boxtest-idmap");
  ASSERT_EQ(::chmod(root_owned.path().c_str(), 0755), 0);
  ASSERT_TRUE(testing::spit(root_owned / "host.txt", "host\n"));
  ASSERT_EQ(::chmod((root_owned / "host.txt").c_str(), 0644), 0);
  ASSERT_EQ(::chmod(other_owned.path().c_str(), 0700), 0);
  ASSERT_EQ(::chown(other_owned.path().c_str(), 4242, 4343), 0);
  BoxFsSpec s = fs_spec();
  s.binds.push_back({root_owned.path(), "/data/root", false});
  s.binds.push_back({other_owned.path(), "/workspace/.skills/mine", false});
  start(s);

  CmdResult r = sh(
      "echo agent > /data/root/new && echo more >> /data/root/host.txt && "
      "echo skill > /workspace/.skills/mine/s && mkdir /workspace/.skills/mine/d && "
      "stat -c '%u:%g' /data/root /data/root/new /workspace/.skills/mine/s");
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const std::string me = std::to_string(kUid) + ":" + std::to_string(kGid);
  // In the box the session user owns the dirs and what it made.
  EXPECT_EQ(r.out, me + "\n" + me + "\n" + me + "\n");
  r = sh("grep -c idmapped /proc/self/mountinfo");
  EXPECT_EQ(r.out, "2\n") << r.err;

  struct stat st;
  // On the host: the dirs and the old file keep their owners; new files are the dir owner's.
  ASSERT_EQ(::stat(root_owned.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  ASSERT_EQ(::stat((root_owned / "host.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(testing::slurp(root_owned / "host.txt"), "host\nmore\n");
  ASSERT_EQ(::stat((root_owned / "new").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_gid, 0u);
  ASSERT_EQ(::stat(other_owned.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 4242u);
  for (const char* f : {"s", "d"}) {
    ASSERT_EQ(::stat((other_owned / f).c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_uid, 4242u) << f;
    EXPECT_EQ(st.st_gid, 4343u) << f;
  }
  box_.reset();
}

TEST_F(BoxTest, ReadOnlyBindIsNotIdmapped) {
  testing::TempDir dir("agentbox-boxtest-idmap");
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  BoxFsSpec s = fs_spec();
  s.binds.push_back({dir.path(), "/data/ro", true});
  start(s);
  CmdResult r = sh("stat -c %u /data/ro; grep -c idmapped /proc/self/mountinfo");
  EXPECT_EQ(r.out, "0\n0\n") << r.err;
  box_.reset();
}

// Mounts added to a running box (host_binds.h attach_binds): visible to the next command, all
// or nothing, never through a symlink the agent planted.
class LiveBindTest : public BoxTest {
 protected:
  Result<AttachOutcome> attach(std::vector<BoxBind> binds) {
    std::vector<PreparedBind> prepared;
    for (const BoxBind& b : binds) {
      auto p = prepare_bind(b, kUid, kGid);
      if (!p) return std::unexpected(p.error());
      prepared.push_back(std::move(*p));
    }
    const std::string proc = "/proc/" + std::to_string(box_->init_pid());
    UniqueFd ns(::open((proc + "/ns/mnt").c_str(), O_RDONLY | O_CLOEXEC));
    UniqueFd root(::open((proc + "/root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!ns || !root) return fail_errno(errno, "open " + proc);
    return attach_binds(ns.get(), root.get(), prepared);
  }
  // The box's mount table, as its commands see it.
  std::string box_mounts() { return sh("cat /proc/self/mountinfo").out; }
};

TEST_F(LiveBindTest, AttachedMountIsSeenByTheNextCommand) {
  testing::TempDir skill("agentbox-boxtest-live");
  ASSERT_TRUE(testing::spit(skill / "SKILL.md", "# live\n"));
  start();
  const std::string host_mounts_before = testing::slurp("/proc/self/mountinfo");
  auto a = attach({{skill.path(), "/workspace/.skills/live", false}});
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_TRUE(a->attached) << a->not_now;
  CmdResult r = sh("cat /workspace/.skills/live/SKILL.md && echo w > /workspace/.skills/live/x");
  EXPECT_EQ(r.out, "# live\n") << r.err;
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(testing::slurp(skill / "x"), "w\n");
  // The daemon's own mount table did not change.
  EXPECT_EQ(testing::slurp("/proc/self/mountinfo"), host_mounts_before);
  box_.reset();
}

TEST_F(LiveBindTest, AMountpointOnTheReadOnlyRootIsForTheNextStart) {
  testing::TempDir a_dir("agentbox-boxtest-live");
  testing::TempDir b_dir("agentbox-boxtest-live");
  start();
  const std::string before = box_mounts();
  // The first could go live, the second cannot (its parent is the box's read-only root): neither.
  auto a = attach({{a_dir.path(), "/workspace/a", true}, {b_dir.path(), "/newtop", true}});
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_FALSE(a->attached);
  EXPECT_NE(a->not_now.find("/newtop"), std::string::npos) << a->not_now;
  EXPECT_EQ(box_mounts(), before);
  EXPECT_FALSE(fs::exists(workspace_ + "/a"));
  box_.reset();
}

TEST_F(LiveBindTest, APlantedSymlinkFailsTheWholeAttach) {
  testing::TempDir a_dir("agentbox-boxtest-live");
  testing::TempDir victim("agentbox-boxtest-live");
  start();
  fs::create_directory_symlink(victim.path(), workspace_ + "/z");
  const std::string before = box_mounts();
  // Parents first: /workspace/data/a is resolved (and its mountpoint made) before /workspace/z/x.
  auto a = attach({{a_dir.path(), "/workspace/data/a", true},
                   {a_dir.path(), "/workspace/z/x", true}});
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().message.find("/workspace/z/x"), std::string::npos)
      << a.error().message;
  EXPECT_EQ(box_mounts(), before);
  EXPECT_FALSE(fs::exists(workspace_ + "/data"));  // the first one's mountpoints are gone too
  EXPECT_TRUE(fs::is_empty(victim.path()));
  box_.reset();
}

// An image root (linux/image_root.h): an overlay of idmapped layer dirs, made in the daemon as a
// detached mount and attached by the box as "/". Layer files stored as kBase + i are i in the
// box; what the box writes lands in the upper dir as kBase + its uid; later layers win.
TEST_F(BoxTest, AnImageRootIsAnIdmappedOverlayOfItsLayers) {
  constexpr std::uint32_t kBase = 1u << 30;
  char tmp[] = "/tmp/agentbox-boxtest-image-XXXXXX";
  ASSERT_NE(::mkdtemp(tmp), nullptr);
  const std::string dir = tmp;
  auto file = [](const std::string& path, const std::string& text, uid_t owner) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path) << text;
    ASSERT_EQ(::chown(path.c_str(), owner, owner), 0);
  };
  for (const char* d : {"l0/bin", "l0/etc", "l0/data", "l1/etc", "rootfs/upper", "rootfs/work"}) {
    fs::create_directories(dir + "/" + d);
  }
  fs::copy_file("/bin/busybox", dir + "/l0/bin/busybox");
  fs::create_symlink("busybox", dir + "/l0/bin/sh");
  file(dir + "/l0/etc/os-release", "ID=lower\n", kBase);
  file(dir + "/l0/etc/kept-by-42", "x\n", kBase + 42);
  file(dir + "/l1/etc/os-release", "ID=upper-layer\n", kBase);
  ASSERT_EQ(::chmod((dir + "/l0/data").c_str(), 01777), 0);
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    struct stat st;
    ASSERT_EQ(::lstat(e.path().c_str(), &st), 0);
    if (st.st_uid == 0) {
      ASSERT_EQ(::lchown(e.path().c_str(), kBase, kBase), 0) << e.path();
    }
  }
  ASSERT_EQ(::chown(tmp, kBase, kBase), 0);
  auto root = make_image_root(
      {{dir + "/l0", dir + "/l1"}, dir + "/rootfs", "upper", "work", kBase, 1u << 17});
  ASSERT_TRUE(root) << root.error().message;
  BoxFsSpec s = fs_spec();
  s.image_root = true;
  auto plan = plan_box_fs(s);
  ASSERT_TRUE(plan) << plan.error().message;
  auto b = make_planned_box(std::move(*plan), "img", [&](BoxSpec& spec) {
    spec.root_tree = root->get();
    spec.root_writable = true;
  });
  ASSERT_TRUE(b) << b.error().message;
  box_ = std::move(*b);
  root->reset();  // the box has it attached

  auto r =
      sh("cat /etc/os-release; stat -c %u:%g /bin/busybox /etc/kept-by-42 /; id -u;"
         " echo w > /data/f && stat -c %u /data/f /data");
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "ID=upper-layer\n0:0\n42:42\n0:0\n" + std::to_string(kUid) + "\n" +
                       std::to_string(kUid) + "\n0\n");
  box_.reset();
  // On disk: the box's file as kBase + its uid, the copied-up /data as kBase (the box's root),
  // never a host id.
  struct stat st;
  ASSERT_EQ(::stat((dir + "/rootfs/upper/data/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kBase + kUid);
  ASSERT_EQ(::stat((dir + "/rootfs/upper/data").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kBase);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST_F(BoxTest, InvalidBindsAreRejectedBeforeCloning) {
  BoxFsSpec s = fs_spec();
  s.binds.push_back({"/usr", "/proc/x", true});
  auto p = plan_box_fs(s);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Code::kInvalid);
  s.binds = {{"/usr", "/a/../b", true}};
  EXPECT_FALSE(plan_box_fs(s));
  s.binds = {{"/no/such/host/dir", "/x", true}};
  p = plan_box_fs(s);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Code::kNotFound);
}

// The API error of a failed box names the setup step that failed (and for the filesystem, the
// mount operation), so an operator can tell a vanished host dir from a kernel without a feature.
TEST_F(BoxTest, SetupFailureNamesTheFailingStep) {
  // A bind whose host dir vanishes between planning (which checks it exists) and the clone.
  char gone[] = "/tmp/agentbox-boxtest-gone-XXXXXX";
  ASSERT_NE(::mkdtemp(gone), nullptr);
  BoxFsSpec s = fs_spec();
  s.binds.push_back({gone, "/data/gone", true});
  auto plan = plan_box_fs(s);
  ASSERT_TRUE(plan) << plan.error().message;
  ASSERT_EQ(::rmdir(gone), 0);
  auto b = make_planned_box(std::move(*plan), "vanished");
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code, Code::kNotFound) << b.error().message;
  EXPECT_EQ(b.error().sys_errno, ENOENT) << b.error().message;
  EXPECT_NE(b.error().message.find("box vanished setup step 'box filesystem: bind " +
                                   std::string(gone) + " on /data/gone (ro,"),
            std::string::npos)
      << b.error().message;
  // The half-made box is gone: nothing of it is left in its cgroup.
  auto left = cgroup_->pids();
  ASSERT_TRUE(left) << left.error().message;
  EXPECT_TRUE(left->empty()) << left->size() << " processes left";

  // A step after the filesystem: an oom_score_adj the kernel refuses (range -1000..1000).
  auto plan2 = plan_box_fs(fs_spec());
  ASSERT_TRUE(plan2) << plan2.error().message;
  b = make_planned_box(std::move(*plan2), "badoom",
                       [](BoxSpec& spec) { spec.init_oom_score_adj = 5000; });
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().sys_errno, EINVAL) << b.error().message;
  EXPECT_NE(b.error().message.find("box badoom setup step 'oom_score_adj'"), std::string::npos)
      << b.error().message;

  // A step before it: the root's mountpoint is gone.
  auto plan3 = plan_box_fs(fs_spec());
  ASSERT_TRUE(plan3) << plan3.error().message;
  b = make_planned_box(std::move(*plan3), "noroot",
                       [this](BoxSpec& spec) { spec.root_mountpoint = mountpoint_ + "/missing"; });
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().sys_errno, ENOENT) << b.error().message;
  EXPECT_NE(b.error().message.find("box noroot setup step 'root tmpfs'"), std::string::npos)
      << b.error().message;
}

TEST_F(BoxTest, BackgroundJobsOutliveTheirExecAndDieWithTheBox) {
  start();
  CmdResult r = sh("sleep 100 >/dev/null 2>&1 & echo started");
  EXPECT_EQ(r.out, "started\n");
  r = sh("for i in $(seq 100); do grep -qx sleep /proc/[0-9]*/comm && break; sleep 0.05; done; "
         "cat /proc/[0-9]*/comm | grep -c '^sleep$'");
  EXPECT_EQ(r.out, "1\n");
  pid_t init = box_->init_pid();
  std::vector<pid_t> pids = *cgroup_->pids();
  EXPECT_GE(pids.size(), 2u);  // the init and the sleep
  box_->kill_and_reap();
  EXPECT_FALSE(pid_alive(init));
  for (pid_t p : pids) EXPECT_FALSE(pid_alive(p)) << p;
}

TEST_F(BoxTest, ClosingTheControlSocketEndsTheBox) {
  start();
  pid_t init = box_->init_pid();
  ::shutdown(box_->control_fd(), SHUT_RDWR);
  for (int i = 0; i < 200 && pid_alive(init); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(pid_alive(init));
}

TEST_F(BoxTest, TheBoxDiesWithTheProcessThatCreatedIt) {
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto b = make_box(fs_spec(), "orphan");
    pid_t pid = b ? (*b)->init_pid() : -1;
    (void)!::write(report[1], &pid, sizeof pid);
    ::pause();
    _exit(0);
  }
  ::close(report[1]);
  pid_t init = -1;
  ASSERT_EQ(::read(report[0], &init, sizeof init), static_cast<ssize_t>(sizeof init));
  ::close(report[0]);
  ASSERT_GT(init, 0);
  EXPECT_TRUE(pid_alive(init));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  for (int i = 0; i < 300 && pid_alive(init); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(pid_alive(init));
  (void)driver_->create("orphan", CgroupLimits{});  // leftover of the child: cleaned in teardown
}

TEST_F(BoxTest, CreateToFirstExecIsFast) {
  // Not a benchmark (bench/ has that): a smoke check that setup does no work per file or
  // anything slow. Generous bound for a noisy 2-core machine.
  auto t0 = std::chrono::steady_clock::now();
  start();
  CmdResult r = run({"/bin/true"});
  auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0);
  EXPECT_EQ(r.status, 0);
  std::printf("create -> first exec: %.2f ms\n", ms.count());
  EXPECT_LT(ms.count(), 1000);
}

}  // namespace
}  // namespace agentbox::linux
