// The ns backend's warm pool (sandbox/internal/ns_pool.h) on real boxes: a box taken from the
// pool and bound to a session is the same as a box started for that session, field by field as
// its commands and the host see it (ids, /etc identity files, mounts in /proc/self/mountinfo,
// /tmp's size, cgroup limits, rlimits, nice, capabilities and seccomp, env, network namespace);
// the pool refills; a bad bind fails the create as it does without the pool. Runs as root.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "sandbox/ns_backend.h"
#include "support/support.h"

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

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string status_field(const std::string& pid, const std::string& key) {
  std::istringstream in(slurp("/proc/" + pid + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return line.substr(key.size() + 2);
  }
  return "";
}

// Host pids of the box inits this test process started (alive, not zombies).
std::vector<pid_t> our_inits() {
  std::vector<pid_t> out;
  const std::string me = std::to_string(::getpid());
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.empty() || pid[0] < '0' || pid[0] > '9') continue;
    if (trim(slurp("/proc/" + pid + "/comm")) != "agentbox-init") continue;
    if (trim(status_field(pid, "PPid")) != me) continue;
    if (status_field(pid, "State").rfind("Z", 0) == 0) continue;
    out.push_back(std::stoi(pid));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The host pid of the agentbox-init whose pid namespace is `pidns` ("pid:[...]"), -1 if none.
pid_t init_of_pidns(const std::string& pidns) {
  for (pid_t p : our_inits()) {
    std::error_code ec;
    if (fs::read_symlink("/proc/" + std::to_string(p) + "/ns/pid", ec).string() == pidns) return p;
  }
  return -1;
}

bool wait_for(const std::function<bool()>& cond, std::chrono::milliseconds limit = 20s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// /proc/self/mountinfo as comparable lines: mount and parent ids (and anonymous device
// numbers, new per superblock) replaced by what they name, the session's own path part made
// neutral, sorted (a pooled box attaches its workspace and binds after the rest).
std::vector<std::string> normalized_mountinfo(const std::string& text, const std::string& key) {
  std::map<std::string, std::string> point_of;  // mount id -> mount point
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<std::string> f;
    for (std::string w; ls >> w;) f.push_back(w);
    if (f.size() < 10) continue;
    point_of[f[0]] = f[4];
    rows.push_back(std::move(f));
  }
  std::vector<std::string> out;
  for (auto& f : rows) {
    auto it = point_of.find(f[1]);
    f[1] = it == point_of.end() ? "(outside)" : it->second;
    if (f[2].rfind("0:", 0) == 0) f[2] = "0:anon";
    std::string s;
    for (std::size_t i = 1; i < f.size(); ++i) s += f[i] + " ";
    for (std::size_t p; (p = s.find(key)) != std::string::npos;) s.replace(p, key.size(), "KEY");
    out.push_back(s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The box cgroup's limits, read on the host from the init's cgroup (v1: each controller's dir;
// v2: the box dir above the init's "init" leaf).
std::map<std::string, std::string> cgroup_limits(pid_t init) {
  std::map<std::string, std::string> out;
  std::istringstream in(slurp("/proc/" + std::to_string(init) + "/cgroup"));
  std::string line;
  while (std::getline(in, line)) {
    const auto c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    const std::string ctrls = line.substr(c1 + 1, c2 - c1 - 1), path = line.substr(c2 + 1);
    auto read = [&](const std::string& dir, const char* file) {
      out[file] = trim(slurp(dir + "/" + file));
    };
    if (ctrls == "memory") {
      read("/sys/fs/cgroup/memory" + path, "memory.limit_in_bytes");
      read("/sys/fs/cgroup/memory" + path, "memory.memsw.limit_in_bytes");
    } else if (ctrls.find("cpu") != std::string::npos &&
               ctrls.find("cpuset") == std::string::npos &&
               ctrls.find("cpuacct") != std::string::npos) {
      read("/sys/fs/cgroup/cpu" + path, "cpu.cfs_quota_us");
      read("/sys/fs/cgroup/cpu" + path, "cpu.cfs_period_us");
    } else if (ctrls == "pids") {
      read("/sys/fs/cgroup/pids" + path, "pids.max");
    } else if (ctrls.empty() && fs::exists("/sys/fs/cgroup" + path + "/../memory.max")) {
      const std::string box = "/sys/fs/cgroup" + path + "/..";
      for (const char* f : {"memory.max", "memory.swap.max", "cpu.max", "pids.max"}) read(box, f);
    }
  }
  return out;
}

class NsPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/agentbox-pooltest-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    ASSERT_EQ(::chmod(dir, 0755), 0);
    fresh_ = make_backend("fresh", 0);
    pooled_ = make_backend("pooled", 1);
    ASSERT_TRUE(fresh_ && pooled_);
  }

  void TearDown() override {
    for (auto& s : boxes_) s->shutdown();
    boxes_.clear();
    fresh_.reset();
    pooled_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::unique_ptr<Backend> make_backend(const std::string& name, std::size_t pool) {
    NsBackendOptions o;
    o.runtime_dir = dir_ + "/run-" + name;
    o.init_path = bin_dir() + "/agentbox-init";
    o.cgroup_parent = "agentbox-pooltest-" + name + "-" + std::to_string(::getpid());
    o.pool_size = pool;
    auto b = make_ns_backend(o);
    EXPECT_TRUE(b) << b.error().message;
    if (!b) return nullptr;
    auto usable = (*b)->check_usable();
    EXPECT_TRUE(usable) << usable.error().message;
    return std::move(*b);
  }

  // The same session config, with `key`'s own workspace: limits, env, a read-only skill under
  // /workspace, a read-write bind at a new top-level dir.
  BoxConfig config(const std::string& key) {
    const std::string ws = dir_ + "/ws-" + key;
    fs::create_directories(ws);
    EXPECT_EQ(::chown(ws.c_str(), kUid, kUid), 0);
    fs::create_directories(dir_ + "/skill");
    std::ofstream(dir_ + "/skill/SKILL.md") << "a skill\n";
    fs::create_directories(dir_ + "/data-" + key);
    EXPECT_EQ(::chown((dir_ + "/data-" + key).c_str(), kUid, kUid), 0);
    BoxConfig c;
    c.key = key;
    c.workspace_dir = ws;
    c.uid = kUid;
    c.gid = kUid;
    c.limits.memory_mb = 300;
    c.limits.cpu_percent = 50;
    c.limits.max_pids = 99;
    c.limits.max_open_files = 777;
    c.limits.tmp_mb = 48;
    c.limits.disk_mb = 1000;
    c.env = {{"POOL_TEST", "same"}, {"LANG", "C.UTF-8"}};
    c.mounts.push_back({dir_ + "/skill", "/workspace/.skills/s1", true, "skills.s1"});
    c.mounts.push_back({dir_ + "/data-" + key, "/data", false, "mounts[0]"});
    return c;
  }

  Sandbox& create(Backend& b, BoxConfig c) {
    auto s = b.create(std::move(c));
    EXPECT_TRUE(s) << s.error().message;
    if (!s) throw std::runtime_error(s.error().message);
    boxes_.push_back(std::move(*s));
    return *boxes_.back();
  }

  ExecResult sh(Sandbox& s, std::string command) {
    ExecSpec spec;
    spec.command = std::move(command);
    spec.timeout = 30s;
    std::optional<Result<ExecResult>> out;
    asio::co_spawn(io_, s.exec(std::move(spec), nullptr),
                   [&out](std::exception_ptr e, Result<ExecResult> r) {
                     if (e) std::rethrow_exception(e);
                     out = std::move(r);
                   });
    io_.restart();
    io_.run();
    EXPECT_TRUE(*out) << out->error().message;
    return *out ? **out : ExecResult{};
  }

  static constexpr uid_t kUid = 43017;
  std::string dir_;
  std::unique_ptr<Backend> fresh_;
  std::unique_ptr<Backend> pooled_;
  std::vector<std::unique_ptr<Sandbox>> boxes_;
  asio::io_context io_;
};

// What a box looks like from inside, one labelled section per field.
constexpr char kProbe[] = R"(
echo "== id"; id
echo "== etc"; cat /etc/passwd /etc/group /etc/hosts /etc/hostname; hostname
echo "== env"; env | grep -v '^_=' | sort
echo "== limits"; cat /proc/self/limits
echo "== init limits"; cat /proc/1/limits
echo "== status"; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status /proc/1/status
echo "== nice"; cut -d' ' -f19 /proc/self/stat /proc/1/stat
echo "== oom"; cat /proc/self/oom_score_adj /proc/1/oom_score_adj
echo "== files"; stat -c '%n %a %U %G %F' / /etc /etc/passwd /workspace /workspace/.skills \
  /workspace/.skills/s1 /workspace/.skills/s1/SKILL.md /data /tmp /cache /mnt /dev/shm
echo "== tmp size"; stat -f -c '%b %S %c' /tmp /cache /dev/shm
echo "== writable"; for d in / /etc /workspace /data /tmp /workspace/.skills/s1; do
  touch $d/.w 2>/dev/null && echo "$d yes" && rm -f $d/.w || echo "$d no"; done
echo "== net"; cut -d: -f1 /proc/net/dev | tail -n +3 | sort; cat /proc/net/route | wc -l
echo "== pid1"; cat /proc/1/cmdline | tr '\0' ' '; echo; ls /proc | grep -c '^[0-9]'
)";

TEST_F(NsPoolTest, APooledBoxIsTheSameAsAFreshOneFieldByField) {
  // The pool has its box (and it is not the fresh backend's: none exists yet).
  ASSERT_TRUE(wait_for([] { return our_inits().size() == 1; })) << "the pool never filled";
  const pid_t pooled_init = our_inits()[0];

  Sandbox& fresh = create(*fresh_, config("fresh"));
  Sandbox& pooled = create(*pooled_, config("pooled"));

  // The pooled session runs in the box the pool had started ahead.
  const std::string pooled_ns = trim(sh(pooled, "readlink /proc/self/ns/pid").stdout_data);
  EXPECT_EQ(init_of_pidns(pooled_ns), pooled_init);
  const std::string fresh_ns = trim(sh(fresh, "readlink /proc/self/ns/pid").stdout_data);
  const pid_t fresh_init = init_of_pidns(fresh_ns);
  ASSERT_GT(fresh_init, 0);
  EXPECT_NE(fresh_init, pooled_init);

  // Inside: every field the same.
  ExecResult a = sh(fresh, kProbe), b = sh(pooled, kProbe);
  EXPECT_EQ(a.exit_code, 0) << a.stderr_data;
  EXPECT_EQ(b.exit_code, 0) << b.stderr_data;
  EXPECT_EQ(a.stdout_data, b.stdout_data);
  EXPECT_EQ(a.stderr_data, b.stderr_data);
  // Some of what that compared, stated (so the comparison cannot pass on two empty outputs).
  EXPECT_NE(b.stdout_data.find("uid=43017(agent) gid=43017(agent)"), std::string::npos)
      << b.stdout_data;
  EXPECT_NE(b.stdout_data.find("POOL_TEST=same"), std::string::npos);
  EXPECT_NE(b.stdout_data.find("Max open files            777"), std::string::npos);
  EXPECT_NE(b.stdout_data.find("/workspace/.skills/s1/SKILL.md 644"), std::string::npos);
  EXPECT_NE(b.stdout_data.find("/ no\n"), std::string::npos);
  EXPECT_NE(b.stdout_data.find("/data yes\n"), std::string::npos);
  EXPECT_NE(b.stdout_data.find("/workspace yes\n"), std::string::npos);
  // 48 MiB of /tmp in 4 KiB blocks.
  EXPECT_NE(b.stdout_data.find("12288 4096"), std::string::npos) << b.stdout_data;

  // The mounts, as the box sees them (ids and order aside: a pooled box attaches its
  // workspace and binds last).
  auto ma = normalized_mountinfo(sh(fresh, "cat /proc/self/mountinfo").stdout_data, "fresh");
  auto mb = normalized_mountinfo(sh(pooled, "cat /proc/self/mountinfo").stdout_data, "pooled");
  EXPECT_GT(ma.size(), 10u);
  EXPECT_EQ(ma, mb);

  // Outside: the cgroup's limits, the init's rlimits, nice and oom score, its network namespace
  // (its own, not the host's).
  auto ca = cgroup_limits(fresh_init), cb = cgroup_limits(pooled_init);
  EXPECT_GE(ca.size(), 3u);
  EXPECT_EQ(ca, cb);
  EXPECT_EQ(slurp("/proc/" + std::to_string(fresh_init) + "/limits"),
            slurp("/proc/" + std::to_string(pooled_init) + "/limits"));
  EXPECT_EQ(trim(slurp("/proc/" + std::to_string(pooled_init) + "/oom_score_adj")),
            trim(slurp("/proc/" + std::to_string(fresh_init) + "/oom_score_adj")));
  std::error_code ec;
  const auto net = [&](pid_t p) {
    return fs::read_symlink("/proc/" + std::to_string(p) + "/ns/net", ec).string();
  };
  EXPECT_NE(net(pooled_init), fs::read_symlink("/proc/self/ns/net", ec).string());
  EXPECT_NE(net(pooled_init), net(fresh_init));

  // The pool refills in the background.
  EXPECT_TRUE(wait_for([] { return our_inits().size() == 3; })) << our_inits().size();
}

TEST_F(NsPoolTest, ABadBindFailsTheCreateAsWithoutThePoolAndKeepsThePooledBox) {
  ASSERT_TRUE(wait_for([] { return our_inits().size() == 1; }));
  const pid_t pooled_init = our_inits()[0];
  BoxConfig c = config("bad");
  c.mounts.push_back({dir_ + "/missing", "/workspace/m", true, "mounts[1]"});
  BoxConfig f = config("bad2");
  f.mounts = c.mounts;
  auto a = fresh_->create(std::move(f));
  auto b = pooled_->create(std::move(c));
  ASSERT_FALSE(a);
  ASSERT_FALSE(b);
  EXPECT_EQ(a.error().code, b.error().code);
  EXPECT_NE(b.error().message.find("mounts[1]"), std::string::npos) << b.error().message;
  // Nothing of the pool was spent on it.
  EXPECT_EQ(our_inits(), std::vector<pid_t>{pooled_init});
  // And the next good session gets it.
  Sandbox& s = create(*pooled_, config("good"));
  EXPECT_EQ(init_of_pidns(trim(sh(s, "readlink /proc/self/ns/pid").stdout_data)), pooled_init);
}

}  // namespace
}  // namespace agentbox::sandbox
