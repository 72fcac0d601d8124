// agentbox-runner's per-box cgroups (runner/box_limits.h) on this host, as root: a child that
// joins its box is bound by memory_mb and max_pids; what the runner made is gone after close().
#include "runner/box_limits.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "runner/spawn.h"

namespace agentbox::runner {
namespace {

// The runner's cgroup dirs on this host (none once it has closed).
std::vector<std::string> own_dirs() {
  std::vector<std::string> out;
  const std::string name = "agentbox-runner-" + std::to_string(::getpid());
  for (const char* root : {"/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup"}) {
    std::error_code ec;
    if (std::filesystem::exists(std::string(root) + "/" + name, ec)) {
      out.push_back(std::string(root) + "/" + name);
    }
  }
  return out;
}

// Runs `sh -c cmd` in box `box` with `limits`; its exit status and stdout.
std::pair<int, std::string> run_in(BoxCgroups& c, const proto::BoxLimits& limits,
                                   const std::string& cmd) {
  auto fds = c.acquire(limits);
  EXPECT_TRUE(fds) << fds.error().message;
  if (!fds) return {-1, ""};
  int out[2];
  EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
  SpawnSpec spec;
  spec.argv = {"/bin/sh", "-c", cmd};
  spec.env = environment_with({});
  spec.stdout_fd = out[1];
  for (const UniqueFd& fd : *fds) spec.join_fds.push_back(fd.get());
  auto pid = spawn(spec);
  ::close(out[1]);
  fds->clear();
  EXPECT_TRUE(pid) << pid.error().message;
  std::string text, err;
  drain(out[0], -1, text, err, 1 << 20,
        std::chrono::steady_clock::now() + std::chrono::seconds(60));
  ::close(out[0]);
  int status = pid ? wait_for(*pid) : -1;
  c.release(limits.box);
  return {status, text};
}

TEST(RunnerBoxCgroups, MemoryAndPidsBindTheBoxAndCloseRemovesEverything) {
  ASSERT_EQ(::geteuid(), 0u) << "per-box cgroups need root";
  BoxCgroups c;
  const auto enforces = c.enforces();
  ASSERT_EQ(enforces, (std::vector<std::string>{"timeout", "output_cap", "memory_mb", "max_pids"}))
      << "this host has the memory and pids controllers: they must be used";
  // A limit it does not enforce is refused, naming it.
  auto refused = c.acquire(proto::BoxLimits{"b", {{"cpu_percent", 50}}});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::kNotSupported);
  EXPECT_NE(refused.error().message.find("limits.cpu_percent"), std::string::npos);
  // No limits: nothing made.
  EXPECT_TRUE(c.acquire(proto::BoxLimits{})->empty());
  EXPECT_TRUE(own_dirs().empty());

  // tail -n 1 holds a line until its end: 200 MB without a newline is past 48 MiB.
  const std::string hog = "head -c 200000000 /dev/zero | tail -n 1 | wc -c";
  auto [st, out] = run_in(c, proto::BoxLimits{"box-a", {{"memory_mb", 48}}}, hog);
  EXPECT_NE(out, "200000000\n") << "not bound by memory_mb (status " << st << ")";
  auto [st2, out2] = run_in(c, proto::BoxLimits{"box-b", {{"memory_mb", 512}}}, hog);
  EXPECT_EQ(out2, "200000000\n") << st2;
  // 10 tasks: 30 background sleeps cannot all start.
  auto [st3, out3] = run_in(c, proto::BoxLimits{"box-c", {{"max_pids", 10}}},
                            "n=0; for i in $(seq 30); do sleep 5 & n=$((n+1)); done 2>/dev/null; "
                            "echo $n");
  EXPECT_NE(out3, "30\n") << st3;
  EXPECT_FALSE(own_dirs().empty());
  // box-c's sleeps are still in its cgroup: close() kills them and removes it all.
  c.close();
  EXPECT_EQ(own_dirs(), std::vector<std::string>{});
}

}  // namespace
}  // namespace agentbox::runner
