// The ns backend through the Sandbox interface, on real boxes: identity, isolation, the file API,
// timeouts and kills, background jobs, limits, death with the daemon. Runs as root; never skips.
#include "sandbox/ns_backend.h"


#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>
#include "support/support.h"

#include "sandbox/process_table.h"

namespace agentbox::sandbox {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string bin_dir() {
  if (const char* dir = std::getenv("AGENTBOX_BIN_DIR")) return dir;
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "bin").string();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// "Key:" value of /proc/<pid>/status, "" if absent.
std::string status_field(const std::string& pid, const std::string& key) {
  std::istringstream in(slurp("/proc/" + pid + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return line.substr(key.size() + 2);
  }
  return "";
}

// Host pids (not zombies) whose real uid is `uid`.
std::vector<pid_t> host_pids_of_uid(uid_t uid) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string uids = status_field(e->d_name, "Uid");
    std::string state = status_field(e->d_name, "State");
    if (uids.empty() || state.rfind("Z", 0) == 0) continue;
    if (static_cast<uid_t>(std::stoul(uids)) == uid) out.push_back(std::atoi(e->d_name));
  }
  ::closedir(d);
  return out;
}

bool wait_no_pids_of_uid(uid_t uid, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!host_pids_of_uid(uid).empty()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

bool pid_alive(pid_t pid) {
  std::string state = status_field(std::to_string(pid), "State");
  return !state.empty() && state[0] != 'Z';
}

class NsBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/agentbox-nstest-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    ASSERT_EQ(::chmod(dir, 0755), 0);
    NsBackendOptions o;
    o.runtime_dir = dir_ + "/run";
    o.init_path = bin_dir() + "/agentbox-init";
    o.cgroup_parent = "agentbox-nstest-" + std::to_string(::getpid());
    auto b = make_ns_backend(o);
    ASSERT_TRUE(b) << b.error().message;
    backend_ = std::move(*b);
    auto usable = backend_->check_usable();
    ASSERT_TRUE(usable) << usable.error().message;
  }

  void TearDown() override {
    for (auto& s : boxes_) s->shutdown();
    boxes_.clear();
    backend_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A box for session `key` with a fresh workspace owned by `uid`.
  Sandbox& make_box(const std::string& key, uid_t uid, BoxConfig extra = {}) {
    std::string ws = dir_ + "/ws-" + key;
    fs::create_directories(ws);
    EXPECT_EQ(::chown(ws.c_str(), uid, uid), 0);
    BoxConfig c = std::move(extra);
    c.key = key;
    c.workspace_dir = ws;
    c.uid = uid;
    c.gid = uid;
    auto s = backend_->create(std::move(c));
    EXPECT_TRUE(s) << s.error().message;
    if (!s) throw std::runtime_error(s.error().message);
    boxes_.push_back(std::move(*s));
    return *boxes_.back();
  }

  Result<ExecResult> exec(Sandbox& s, ExecSpec spec) {
    std::optional<Result<ExecResult>> out;
    asio::co_spawn(io_, s.exec(std::move(spec), nullptr),
                   [&out](std::exception_ptr e, Result<ExecResult> r) {
                     if (e) std::rethrow_exception(e);
                     out = std::move(r);
                   });
    io_.restart();
    io_.run();
    return std::move(*out);
  }
  ExecResult sh(Sandbox& s, std::string command, std::chrono::milliseconds timeout = 30s) {
    ExecSpec spec;
    spec.command = std::move(command);
    spec.timeout = timeout;
    auto r = exec(s, std::move(spec));
    EXPECT_TRUE(r) << r.error().message;
    return r ? *r : ExecResult{};
  }

  // A backend with `parent` as its cgroup parent, made and dropped: removes stale box cgroups.
  void o_cleanup(const std::string& parent) {
    NsBackendOptions o;
    o.runtime_dir = dir_ + "/run-cleanup";
    o.init_path = bin_dir() + "/agentbox-init";
    o.cgroup_parent = parent;
    EXPECT_TRUE(make_ns_backend(o));
  }

  std::string dir_;
  std::unique_ptr<Backend> backend_;
  std::vector<std::unique_ptr<Sandbox>> boxes_;
  asio::io_context io_;
};

TEST_F(NsBackendTest, RunsCommandsAsTheSessionUser) {
  Sandbox& s = make_box("ident", 42001);
  EXPECT_EQ(s.name(), "ns");
  EXPECT_EQ(s.workspace(), "/workspace");
  EXPECT_EQ(s.uid(), 42001u);
  ExecResult r = sh(s, "id -u; id -g; id -G; whoami; pwd; echo $HOME");
  EXPECT_EQ(r.stdout_data, "42001\n42001\n42001\nagent\n/workspace\n/workspace\n") << r.stderr_data;
  EXPECT_EQ(r.exit_code, 0);
  ExecSpec argv;
  argv.argv = {"cat", "/proc/1/cmdline"};
  auto a = exec(s, argv);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->stdout_data, std::string("agentbox-init") + '\0');
}

TEST_F(NsBackendTest, EnvironmentIsTheBoxesNotTheDaemons) {
  ::setenv("AGENTBOX_TEST_CANARY", "daemon-secret", 1);
  BoxConfig c;
  c.env = {{"FROM_BOX", "b"}, {"LANG", "C"}};
  Sandbox& s = make_box("env", 42002, c);
  ExecSpec spec;
  spec.argv = {"env"};
  spec.env = {{"FROM_EXEC", "e"}, {"FROM_BOX", "overridden"}};
  auto r = exec(s, spec);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stdout_data.find("daemon-secret"), std::string::npos) << r->stdout_data;
  for (const char* want : {"FROM_BOX=overridden\n", "FROM_EXEC=e\n", "LANG=C\n", "HOME=/workspace\n",
                           "USER=agent\n",
                           "PATH=/workspace/.venv/bin:/workspace/node_modules/.bin:/usr/local/sbin:",
                           "XDG_CACHE_HOME=/cache\n", "npm_config_cache=/cache/npm\n"}) {
    EXPECT_NE(r->stdout_data.find(want), std::string::npos) << want << " in " << r->stdout_data;
  }
}

TEST_F(NsBackendTest, ProcessPostureAndIsolation) {
  Sandbox& s = make_box("posture", 42003);
  ExecResult r = sh(s, "grep -E '^(NoNewPrivs|Seccomp|Cap(Inh|Prm|Eff|Bnd|Amb)):' /proc/self/status");
  EXPECT_EQ(r.stdout_data,
            "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"
            "CapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n");
  // Only the box's processes, the box's hostname, only lo.
  r = sh(s, "cat /proc/[0-9]*/comm > /tmp/c; sort /tmp/c | tr '\\n' ' '; hostname; "
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
  EXPECT_EQ(r.stdout_data, "agentbox-init sh agentbox\nlo\n") << r.stderr_data;
  // Open fds of a command: 0, 1, 2 (ls's own listing fd aside).
  r = sh(s, "ls -l /proc/self/fd/ | grep -v '/fd$' | grep -o '[0-9]* ->' | tr -d '\\n'");
  EXPECT_EQ(r.stdout_data, "0 ->1 ->2 ->") << r.stderr_data;
}

TEST_F(NsBackendTest, FilesystemIsCuratedAndReadOnly) {
  Sandbox& s = make_box("fsview", 42004);
  ExecResult r = sh(s, "for p in /home /root /var /run /sys " + dir_ +
                           " /etc/shadow; do test -e $p && echo visible: $p; done; true");
  EXPECT_EQ(r.stdout_data, "");
  for (const char* p : {"/x", "/usr/x", "/etc/passwd"}) {
    r = sh(s, std::string("echo x > ") + p);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.stderr_data.find("Read-only file system"), std::string::npos) << p << r.stderr_data;
  }
  r = sh(s, "echo w > /workspace/w && echo t > /tmp/t && cat /workspace/w /tmp/t");
  EXPECT_EQ(r.stdout_data, "w\nt\n") << r.stderr_data;
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/ws-fsview/w").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 42004u);
}

TEST_F(NsBackendTest, FileApiResolvesInsideTheBoxAsTheSessionUser) {
  char ro[] = "/tmp/agentbox-nstest-ro-XXXXXX";
  ASSERT_NE(::mkdtemp(ro), nullptr);
  ASSERT_EQ(::chmod(ro, 0755), 0);
  std::ofstream(std::string(ro) + "/shared.txt") << "shared";
  BoxConfig c;
  c.mounts.push_back({ro, "/shared", true});
  Sandbox& s = make_box("files", 42005, c);

  // Workspace files: written through the API, owned by the session user, seen by commands.
  auto w = s.write_file("notes/a.txt", "hello", WriteOptions{.mkdirs = true});
  ASSERT_TRUE(w) << w.error().message;
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/ws-files/notes/a.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 42005u);
  ASSERT_EQ(::stat((dir_ + "/ws-files/notes").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 42005u);
  EXPECT_EQ(sh(s, "cat /workspace/notes/a.txt").stdout_data, "hello");

  // Any in-box path: /tmp is the box's own tmpfs.
  ASSERT_TRUE(s.write_file("/tmp/x", "in tmp", {}));
  EXPECT_EQ(sh(s, "cat /tmp/x").stdout_data, "in tmp");
  auto back = s.read_file("/tmp/x", 1024);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, "in tmp");
  EXPECT_FALSE(fs::exists("/tmp/x") && slurp("/tmp/x") == "in tmp");

  // Read-only mounts stay read-only; host files stay invisible.
  auto passwd = s.write_file("/etc/passwd", "root::0:0::/:/bin/sh\n", {});
  ASSERT_FALSE(passwd);
  EXPECT_EQ(passwd.error().code, Code::kAccess) << passwd.error().message;
  auto shared = s.write_file("/shared/new.txt", "x", {});
  ASSERT_FALSE(shared);
  EXPECT_EQ(shared.error().code, Code::kAccess);
  EXPECT_EQ(*s.read_file("/shared/shared.txt", 100), "shared");
  auto shadow = s.read_file("/etc/shadow", 100);
  ASSERT_FALSE(shadow);
  EXPECT_EQ(shadow.error().code, Code::kNotFound);
  // Escapes clamp to the box root.
  auto up = s.read_file("/workspace/../../../../etc/passwd", 4096);
  ASSERT_TRUE(up);
  EXPECT_NE(up->find("agent:x:42005"), std::string::npos);

  // The session user's permissions, not the daemon's: the init's files are root's.
  auto environ = s.read_file("/proc/1/environ", 4096);
  ASSERT_FALSE(environ);
  EXPECT_EQ(environ.error().code, Code::kAccess) << environ.error().message;

  // The workspace itself cannot go.
  auto rm = s.remove_all("/workspace");
  ASSERT_FALSE(rm);
  EXPECT_EQ(rm.error().code, Code::kAccess);
  ASSERT_TRUE(s.remove_all("/workspace/notes"));
  EXPECT_FALSE(fs::exists(dir_ + "/ws-files/notes"));
  fs::remove_all(ro);
}

TEST_F(NsBackendTest, ExtraMountReadOnlyForCommands) {
  char ro[] = "/tmp/agentbox-nstest-ro-XXXXXX";
  ASSERT_NE(::mkdtemp(ro), nullptr);
  ASSERT_EQ(::chmod(ro, 0755), 0);
  BoxConfig c;
  c.mounts.push_back({ro, "/workspace/.skills/demo", true});
  Sandbox& s = make_box("skills", 42006, c);
  ExecResult r = sh(s, "touch /workspace/.skills/demo/x");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.stderr_data.find("Read-only file system"), std::string::npos) << r.stderr_data;
  fs::remove_all(ro);
}

// Seed 002: a skill added to a running box is seen by the next command and by the file API,
// and, mounted rw, is written as the host dir's owner.
TEST_F(NsBackendTest, MountsAddedToARunningBoxAreSeenByTheNextExec) {
  testing::TempDir skill("agentbox-nstest-live");
  ASSERT_TRUE(testing::spit(skill / "SKILL.md", "# live\n"));
  Sandbox& s = make_box("live", 42010);
  std::vector<BindMount> add = {{skill.path(), "/workspace/.skills/live", false, "skills.live"}};
  ASSERT_TRUE(backend_->check_mounts(add, 42010, 42010));
  auto live = s.add_mounts(add);
  ASSERT_TRUE(live) << live.error().message;
  EXPECT_TRUE(*live);
  ExecResult r = sh(s, "cat /workspace/.skills/live/SKILL.md && echo w > /workspace/.skills/live/o");
  EXPECT_EQ(r.stdout_data, "# live\n") << r.stderr_data;
  EXPECT_EQ(r.exit_code, 0) << r.stderr_data;
  auto read = s.read_file("/workspace/.skills/live/o", 64);
  ASSERT_TRUE(read) << read.error().message;
  EXPECT_EQ(*read, "w\n");
  struct stat st;
  ASSERT_EQ(::stat((skill / "o").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);  // the dir's owner (root), not the session user

  // Outside a writable place the mountpoint cannot be made now: for the next start.
  auto later = s.add_mounts({{skill.path(), "/opt2", true}});
  ASSERT_TRUE(later) << later.error().message;
  EXPECT_FALSE(*later);
  EXPECT_NE(sh(s, "test -e /opt2 || echo absent").stdout_data, "");
  // A bad one is an error naming it, before anything happens.
  auto bad = backend_->check_mounts({{"/no/such/dir", "/data/x", true, "mounts[3]"}}, 42010, 42010);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Code::kNotFound);
  EXPECT_NE(bad.error().message.find("mounts[3]"), std::string::npos) << bad.error().message;
}

TEST_F(NsBackendTest, CwdMustExistInTheBox) {
  Sandbox& s = make_box("cwd", 42007);
  ExecSpec spec;
  spec.argv = {"pwd"};
  spec.cwd = "/tmp";
  auto r = exec(s, spec);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stdout_data, "/tmp\n");
  spec.cwd = "/workspace/missing";
  r = exec(s, spec);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kNotFound);
  EXPECT_NE(r.error().message.find("/workspace/missing"), std::string::npos) << r.error().message;
}

TEST_F(NsBackendTest, StdinAndArtifacts) {
  Sandbox& s = make_box("io", 42008);
  ExecSpec spec;
  spec.argv = {"sh", "-c", "mkdir -p out && cat > out/copy.txt && wc -c < out/copy.txt"};
  spec.stdin_data = "twelve bytes";
  spec.artifact_dir = "/workspace/out";
  auto r = exec(s, spec);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->stdout_data, "12\n") << r->stderr_data;
  ASSERT_EQ(r->artifacts.size(), 1u);
  EXPECT_EQ(r->artifacts[0].path, "/workspace/out/copy.txt");
  EXPECT_EQ(r->artifacts[0].size, 12u);
}

TEST_F(NsBackendTest, TimeoutKillsEverythingTheCommandStarted) {
  const uid_t uid = 42009;
  Sandbox& s = make_box("timeout", uid);
  // A setsid'd, double-forked, SIGTERM-ignoring grandchild: a process group kill would miss it.
  ExecResult r = sh(s,
                    "(setsid sh -c 'trap \"\" TERM; sleep 1000' >/dev/null 2>&1 &); "
                    "sleep 1000",
                    500ms);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_TRUE(wait_no_pids_of_uid(uid, 3s)) << "left: " << host_pids_of_uid(uid).size();
  // The box itself is fine.
  EXPECT_EQ(sh(s, "echo alive").stdout_data, "alive\n");
}

TEST_F(NsBackendTest, BackgroundJobsSurviveTheirExecUntilShutdown) {
  const uid_t uid = 42010;
  Sandbox& s = make_box("bg", uid);
  ExecResult r = sh(s, "sleep 100 & echo started");
  EXPECT_EQ(r.stdout_data, "started\n");
  EXPECT_FALSE(r.timed_out);
  // (The background child may still be a forked shell that has not exec'd sleep yet.)
  r = sh(s, "for i in $(seq 100); do grep -qx sleep /proc/[0-9]*/comm && break; sleep 0.05; done; "
            "cat /proc/[0-9]*/comm | grep -c '^sleep$'");
  EXPECT_EQ(r.stdout_data, "1\n");
  EXPECT_EQ(host_pids_of_uid(uid).size(), 1u);
  s.shutdown();
  EXPECT_TRUE(wait_no_pids_of_uid(uid, 3s));
  s.shutdown();  // idempotent
  ExecSpec spec;
  spec.argv = {"true"};
  auto after = exec(s, spec);
  ASSERT_FALSE(after);
  EXPECT_EQ(after.error().code, Code::kUnavailable);
}

// A background job that forks all the time survives the end of the exec that started it: the
// daemon moves it out of the exec's cgroup with that cgroup frozen. Moving from a listing while
// it runs misses what it forks meanwhile, and removing the exec cgroup then kills that. Two
// shapes: a relay whose every generation forks the next and exits (the job lives only in its
// newest process, so one missed child ends it), and a loop that forks sleeps.
TEST_F(NsBackendTest, ForkingBackgroundJobSurvivesTheEndOfItsExec) {
  const uid_t uid = 42012;
  Sandbox& s = make_box("forky", uid);
  for (int round = 0; round < 5; ++round) {
    const std::string hb = "/workspace/hb" + std::to_string(round);
    const std::string stop = "/workspace/stop" + std::to_string(round);
    const std::string hbl = "/workspace/hbl" + std::to_string(round);
    // Bounded: each job ends by itself after 60 s or when the stop file appears.
    ExecResult r = sh(s, "relay() { echo $1 > " + hb + "; [ -e " + stop +
                             " ] && exit; [ $(( $(date +%s) - $2 )) -gt 60 ] && exit; "
                             "relay $(( $1 + 1 )) $2 & }; "
                             "relay 0 $(date +%s) >/dev/null 2>&1; "
                             "(i=0; end=$(( $(date +%s) + 60 )); while [ ! -e " +
                             stop +
                             " ] && [ $(date +%s) -lt $end ]; do sleep 0.01 & i=$((i+1)); "
                             "echo $i > " +
                             hbl +
                             "; sleep 0.002; done) >/dev/null 2>&1 & "
                             "echo started");
    ASSERT_EQ(r.stdout_data, "started\n") << r.stderr_data;
    ASSERT_FALSE(r.timed_out);
    // Both keep counting after their exec is over.
    std::this_thread::sleep_for(300ms);
    auto count = [&](const std::string& file) {
      // The writers truncate before they write: retry a read that lands in between.
      std::string v = sh(s, "for i in $(seq 100); do v=$(cat " + file +
                                "); [ -n \"$v\" ] && break; done; "
                                "echo $v")
                          .stdout_data;
      if (v == "\n") v.clear();
      return v.empty() ? -1L : std::stol(v);
    };
    long a = count(hb), la = count(hbl);
    std::this_thread::sleep_for(300ms);
    long b = count(hb), lb = count(hbl);
    EXPECT_GE(a, 0) << "round " << round;
    EXPECT_GT(b, a) << "round " << round << ": the relay died with its exec";
    EXPECT_GE(la, 0) << "round " << round;
    EXPECT_GT(lb, la) << "round " << round << ": the fork loop died with its exec";
    sh(s, "touch " + stop);
  }
  // Everything ends when asked, and nothing is left in the exec cgroups.
  EXPECT_EQ(sh(s, "sleep 0.5; echo ok").stdout_data, "ok\n");
  s.shutdown();
  EXPECT_TRUE(wait_no_pids_of_uid(uid, 3s));
}

TEST_F(NsBackendTest, MemoryLimitOomKillsInsideTheBoxOnly) {
  BoxConfig c;
  c.limits.memory_mb = 64;
  Sandbox& s = make_box("oom", 42011, c);
  ExecSpec hog;
  hog.argv = {"python3", "-c", "x = bytearray(512 << 20); print(len(x))"};
  auto h = exec(s, hog);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->exit_code, 128 + SIGKILL) << h->stdout_data << h->stderr_data;
  EXPECT_EQ(h->signal, SIGKILL);
  EXPECT_FALSE(h->timed_out);
  // And under a shell: the shell survives its child's OOM kill and reports it.
  ExecResult r = sh(s, "python3 -c 'x = bytearray(512 << 20)'; echo status $?");
  EXPECT_EQ(r.stdout_data, "status 137\n") << r.stderr_data;
  EXPECT_FALSE(r.timed_out);
  // The box (its init) survives and serves the next command; we are obviously alive.
  EXPECT_EQ(sh(s, "echo still here").stdout_data, "still here\n");
}

TEST_F(NsBackendTest, ConcurrentExecsAcrossSessions) {
  std::vector<Sandbox*> boxes;
  for (int i = 0; i < 4; ++i) boxes.push_back(&make_box("many" + std::to_string(i), 42020 + i));
  constexpr int kPerBox = 10;
  std::vector<std::optional<Result<ExecResult>>> results(boxes.size() * kPerBox);
  for (std::size_t b = 0; b < boxes.size(); ++b) {
    for (int i = 0; i < kPerBox; ++i) {
      ExecSpec spec;
      spec.command = "echo $(id -u) " + std::to_string(i);
      auto& slot = results[b * kPerBox + i];
      asio::co_spawn(io_, boxes[b]->exec(spec, nullptr),
                     [&slot](std::exception_ptr e, Result<ExecResult> r) {
                       if (e) std::rethrow_exception(e);
                       slot = std::move(r);
                     });
    }
  }
  io_.run();
  for (std::size_t b = 0; b < boxes.size(); ++b) {
    for (int i = 0; i < kPerBox; ++i) {
      auto& r = results[b * kPerBox + i];
      ASSERT_TRUE(r && *r);
      EXPECT_EQ((*r)->stdout_data, std::to_string(42020 + b) + " " + std::to_string(i) + "\n");
    }
  }
}

// As in the daemon: the boxes' control sockets are read on the io_context the execs and
// processes run on (NsBackendOptions::control), with the blocking steps on a pool. Commands
// start, report their exits and are killed at their timeout as on the backend's own io thread,
// and a shut-down box leaves nothing on that io_context (run() returns: its reader ended).
TEST_F(NsBackendTest, ControlSocketsReadOnTheCallersIoContext) {
  asio::io_context io;
  asio::thread_pool pool(2);
  NsBackendOptions o;
  o.runtime_dir = dir_ + "/run-ctl";
  o.init_path = bin_dir() + "/agentbox-init";
  o.cgroup_parent = "agentbox-nstest-ctl-" + std::to_string(::getpid());
  o.control = io.get_executor();
  o.blocking = pool.get_executor();
  auto b = make_ns_backend(o);
  ASSERT_TRUE(b) << b.error().message;
  const uid_t uid = 42040;
  std::string ws = dir_ + "/ws-ctl";
  fs::create_directories(ws);
  ASSERT_EQ(::chown(ws.c_str(), uid, uid), 0);
  BoxConfig c;
  c.key = "ctl";
  c.workspace_dir = ws;
  c.uid = uid;
  auto made = (*b)->create(c);
  ASSERT_TRUE(made) << made.error().message;
  std::unique_ptr<Sandbox> s = std::move(*made);

  // Runs `io` until `done` holds (10 s: a safety net against a hang, not a timing).
  auto run_until = [&io](const std::function<bool()>& done) {
    const auto limit = std::chrono::steady_clock::now() + 10s;
    while (!done() && std::chrono::steady_clock::now() < limit) io.run_one_for(100ms);
    return done();
  };
  constexpr int kExecs = 8;
  std::vector<std::optional<Result<ExecResult>>> results(kExecs + 1);
  for (int i = 0; i < kExecs; ++i) {
    ExecSpec spec;
    spec.command = "echo " + std::to_string(i) + "; exit " + std::to_string(i);
    asio::co_spawn(io, s->exec(spec, nullptr),
                   [&slot = results[i]](std::exception_ptr e, Result<ExecResult> r) {
                     if (e) std::rethrow_exception(e);
                     slot = std::move(r);
                   });
  }
  ExecSpec slow;
  slow.command = "sleep 30";
  slow.timeout = 300ms;
  asio::co_spawn(io, s->exec(slow, nullptr),
                 [&slot = results[kExecs]](std::exception_ptr e, Result<ExecResult> r) {
                   if (e) std::rethrow_exception(e);
                   slot = std::move(r);
                 });
  // A process: started (its ChildReady), then its end (Exited) read on the same context.
  std::optional<Result<ProcessInfo>> started;
  ProcessSpec ps;
  ps.command = "echo hi";
  asio::co_spawn(io, s->processes()->start(ps),
                 [&started](std::exception_ptr e, Result<ProcessInfo> r) {
                   if (e) std::rethrow_exception(e);
                   started = std::move(r);
                 });
  ASSERT_TRUE(run_until([&] {
    for (const auto& r : results) {
      if (!r) return false;
    }
    return started.has_value();
  }));
  for (int i = 0; i < kExecs; ++i) {
    ASSERT_TRUE(*results[i]) << results[i]->error().message;
    EXPECT_EQ((*results[i])->stdout_data, std::to_string(i) + "\n");
    EXPECT_EQ((*results[i])->exit_code, i);
  }
  ASSERT_TRUE(*results[kExecs]) << results[kExecs]->error().message;
  EXPECT_TRUE((*results[kExecs])->timed_out);
  EXPECT_EQ((*results[kExecs])->signal, SIGKILL);
  ASSERT_TRUE(*started) << started->error().message;
  const std::string pid = std::to_string((*started)->pid);
  ASSERT_TRUE(run_until([&] {
    auto info = s->processes()->get(pid);
    return info && info->state != ProcessState::kRunning;
  }));
  auto info = s->processes()->get(pid);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->state, ProcessState::kExited);
  EXPECT_EQ(info->exit_code, 0);

  s->shutdown();
  EXPECT_TRUE(wait_no_pids_of_uid(uid, 3s));
  // Nothing of the box is left on the io_context: run() returns once what is queued is done.
  io.restart();
  io.run_for(10s);
  EXPECT_TRUE(io.stopped()) << "the box's control reader is still waiting on the io_context";
  s.reset();
  b->reset();
  pool.join();
}

TEST_F(NsBackendTest, BoxesDieWithTheDaemon) {
  // A child process plays the daemon: it creates a box, starts a background job, then is
  // SIGKILLed. Its box's init and everything in the box must die with it.
  const uid_t uid = 42030;
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only this thread exists in the child: it builds its own backend (threads and all).
    char ok = 0;
    NsBackendOptions o;
    o.runtime_dir = dir_ + "/run-child";
    o.init_path = bin_dir() + "/agentbox-init";
    o.cgroup_parent = "agentbox-nstest-child-" + std::to_string(::getpid());
    auto b = make_ns_backend(o);
    std::string ws = dir_ + "/ws-orphan";
    fs::create_directories(ws);
    (void)!::chown(ws.c_str(), uid, uid);
    BoxConfig c;
    c.key = "orphan";
    c.workspace_dir = ws;
    c.uid = uid;
    auto s = b ? (*b)->create(c) : Result<std::unique_ptr<Sandbox>>(std::unexpected(b.error()));
    if (s) {
      asio::io_context io;
      ExecSpec spec;
      spec.command = "sleep 1000 >/dev/null 2>&1 & echo ok";
      asio::co_spawn(io, (*s)->exec(spec, nullptr),
                     [&ok](std::exception_ptr, Result<ExecResult> r) {
                       ok = r && r->stdout_data == "ok\n" ? 1 : 0;
                     });
      io.run();
    }
    (void)!::write(report[1], &ok, 1);
    ::pause();
    _exit(0);
  }
  ::close(report[1]);
  char ok = 0;
  ASSERT_EQ(::read(report[0], &ok, 1), 1);
  ::close(report[0]);
  ASSERT_EQ(ok, 1);
  // The child's box: an agentbox-init whose parent is the child.
  pid_t init = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name[0] < '0' || name[0] > '9') continue;
    if (status_field(name, "Name") == "agentbox-init" &&
        status_field(name, "PPid") == std::to_string(child)) {
      init = std::stoi(name);
    }
  }
  ASSERT_GT(init, 0);
  EXPECT_EQ(host_pids_of_uid(uid).size(), 1u);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(wait_no_pids_of_uid(uid, 3s));
  for (int i = 0; i < 300 && pid_alive(init); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(pid_alive(init));
  // What the killed "daemon" leaves: its cgroups (a restarted daemon removes them as stale).
  o_cleanup("agentbox-nstest-child-" + std::to_string(child));
}

TEST_F(NsBackendTest, UnusableHostIsNamed) {
  NsBackendOptions o;
  o.runtime_dir = dir_ + "/run2";
  o.init_path = "/nonexistent/agentbox-init";
  o.cgroup_parent = "agentbox-nstest-unusable-" + std::to_string(::getpid());
  auto b = make_ns_backend(o);
  ASSERT_TRUE(b);
  auto usable = (*b)->check_usable();
  ASSERT_FALSE(usable);
  EXPECT_NE(usable.error().message.find("/nonexistent/agentbox-init"), std::string::npos)
      << usable.error().message;
  BoxConfig c;
  c.key = "never";
  c.workspace_dir = dir_;
  EXPECT_FALSE((*b)->create(c));
}

}  // namespace
}  // namespace agentbox::sandbox
