// SECURITY.md T4: resource exhaustion. The daemon and the other sessions keep serving throughout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "security/box_fixture.h"

namespace agentbox::security {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

long daemon_rss_kib() {
  return std::stol("0" + proc_status(shared_daemon().pid(), "VmRSS"));
}

void expect_others_serving() {
  Box other(shared_daemon(), "t4-bystander");
  EXPECT_EQ(other.sh("echo fine").value("stdout", ""), "fine\n");
}

TEST(ResourceTest, ForkBombIsCappedAtPidsMaxAndCleanedUp) {
  Box a(shared_daemon(), "t4-forkbomb", json{{"limits", {{"max_pids", 64}}}});
  std::string out = a.probe("fork_bomb");
  ASSERT_THAT(out, StartsWith("FORKED")) << out;
  int made = std::stoi(out.substr(7));
  EXPECT_LT(made, 64);
  EXPECT_THAT(out, HasSubstr("EAGAIN"));
  // The probe SIGTERMs its children before it exits: none of them is left.
  EXPECT_TRUE(wait_no_pids_of_uid(a.uid(), 10))
      << host_pids_of_uid(a.uid()).size() << " processes of the bomb left";
  // The shell form, killed at its timeout while it is still forking: every process it made dies
  // with the exec, detached (`&`) ones included.
  auto r = a.sh("bomb() { bomb | bomb & }; bomb; sleep 100", 3);
  EXPECT_TRUE(r.value("timed_out", false)) << r.dump();
  EXPECT_TRUE(wait_no_pids_of_uid(a.uid(), 10))
      << host_pids_of_uid(a.uid()).size() << " processes of the bomb left after the timeout";
  // The box is usable again at once: its pids are free.
  EXPECT_EQ(a.sh("echo after").value("stdout", ""), "after\n");
  EXPECT_TRUE(wait_no_pids_of_uid(a.uid(), 5));
  expect_others_serving();
}

TEST(ResourceTest, ThreadBombIsCapped) {
  Box a(shared_daemon(), "t4-threads", json{{"limits", {{"max_pids", 64}}}});
  auto r = a.exec({"python3", "-c",
                   "import threading,time\n"
                   "n=0\n"
                   "try:\n"
                   "  while n<10000:\n"
                   "    threading.Thread(target=time.sleep,args=(5,),daemon=True).start(); n+=1\n"
                   "except RuntimeError as e: print('CAPPED',n)\n"},
                  30);
  EXPECT_THAT(r.value("stdout", ""), StartsWith("CAPPED")) << r.dump();
  expect_others_serving();
}

TEST(ResourceTest, MemoryBombIsOomKilledInsideOnlyWithoutSwap) {
  Box a(shared_daemon(), "t4-oom", json{{"limits", {{"memory_mb", 64}}}});
  pid_t sleeper = start_sleeper(a);
  ASSERT_GT(sleeper, 0);
  pid_t init = box_init_pid(sleeper);
  ASSERT_GT(init, 0);
  std::string out = a.probe("alloc", {"640"});
  EXPECT_EQ(out, "KILLED 9") << out;
  EXPECT_EQ(kill(shared_daemon().pid(), 0), 0);
  EXPECT_EQ(a.sh("echo alive").value("stdout", ""), "alive\n");
  // SECURITY: no swap escape: not one page of the box went to swap, and RAM + swap never
  // exceeded the limit (the killed probe peaked at it).
  auto trim = [](std::string v) {
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
    return v;
  };
  const std::string mem = cgroup_of(init, "memory");
  if (!mem.empty()) {  // v1
    const std::string m = "/sys/fs/cgroup/memory" + mem;
    ASSERT_TRUE(std::filesystem::exists(m + "/memory.memsw.max_usage_in_bytes"))
        << "no swap accounting on this host";
    EXPECT_LE(std::stoll(slurp(m + "/memory.memsw.max_usage_in_bytes")), 64ll << 20);
    EXPECT_GT(std::stoll(slurp(m + "/memory.max_usage_in_bytes")), 32ll << 20)
        << "the bomb never reached the limit";
    std::istringstream stat(slurp(m + "/memory.stat"));
    bool saw_swap = false;
    for (std::string line; std::getline(stat, line);) {
      if (line.rfind("total_swap ", 0) == 0) {
        saw_swap = true;
        EXPECT_EQ(line, "total_swap 0");
      }
    }
    EXPECT_TRUE(saw_swap) << "memory.stat has no total_swap line";
  } else {  // v2: the init sits in <box>/init
    std::string leaf = cgroup_of(init, "");
    std::string root = std::filesystem::exists("/sys/fs/cgroup/memory") ? "/sys/fs/cgroup/unified"
                                                                        : "/sys/fs/cgroup";
    const std::string box = root + leaf.substr(0, leaf.rfind('/'));
    EXPECT_EQ(trim(slurp(box + "/memory.swap.max")), "0");
    EXPECT_EQ(trim(slurp(box + "/memory.swap.current")), "0");
  }
  expect_others_serving();
}

TEST(ResourceTest, CpuHogIsThrottledToTheQuota) {
  Box a(shared_daemon(), "t4-cpu", json{{"limits", {{"cpu_percent", 50}}}});
  // Two busy loops for 3 s of wall time; `times` prints the children's user and system time.
  auto r = a.exec({"bash", "-c",
                   "for i in 1 2; do timeout 3 sh -c 'while :; do :; done' & done; wait; times"},
                  30);
  std::istringstream in(r.value("stdout", ""));
  std::string self_line, child_line;
  std::getline(in, self_line);
  std::getline(in, child_line);
  auto secs = [](const std::string& field) {
    auto m = field.find('m');
    return std::stod(field.substr(0, m)) * 60 + std::stod(field.substr(m + 1));
  };
  std::istringstream c(child_line);
  std::string user, sys;
  c >> user >> sys;
  ASSERT_FALSE(user.empty()) << r.dump();
  double cpu = secs(user) + secs(sys);
  // Unthrottled this is ~6 s on two cores; at 50% of one CPU it is ~1.5 s.
  EXPECT_LT(cpu, 2.5) << r.dump();
}

TEST(ResourceTest, SleepingForeverIgnoringTermIsKilledAtTimeout) {
  Box a(shared_daemon(), "t4-sleep");
  auto r = a.sh("trap '' TERM; sleep 1000", 1);
  EXPECT_TRUE(r.value("timed_out", false));
  EXPECT_TRUE(wait_no_pids_of_uid(a.uid(), 5));
}

TEST(ResourceTest, TmpIsSizeAndInodeCapped) {
  Box a(shared_daemon(), "t4-tmp");
  auto r = a.sh("dd if=/dev/zero of=/tmp/fill bs=1M count=100000 2>&1; du -sm /tmp | cut -f1", 60);
  EXPECT_THAT(r.value("stdout", ""), HasSubstr("No space left on device"));
  std::string out = r.value("stdout", "");
  long mb = std::stol(out.substr(out.rfind('\n', out.size() - 2) + 1));
  EXPECT_LE(mb, 1024);
  a.sh("rm -f /tmp/fill");
  std::string files = a.probe("files", {"/tmp"});
  ASSERT_THAT(files, StartsWith("CREATED")) << files;
  EXPECT_THAT(files, HasSubstr("ENOSPC"));
  EXPECT_LT(std::stol(files.substr(8)), 1000000);
  expect_others_serving();
}

TEST(ResourceTest, WorkspaceIsCappedAtDiskMbAndTheHostDiskUntouched) {
  Box a(shared_daemon(), "t4-disk", json{{"limits", {{"disk_mb", 32}}}});
  Box other(shared_daemon(), "t4-disk-other", json{{"limits", {{"disk_mb", 32}}}});
  struct statvfs host_before {};
  ASSERT_EQ(::statvfs(shared_daemon().data_dir().c_str(), &host_before), 0);
  auto r = a.sh("dd if=/dev/zero of=/workspace/fill bs=1M count=1000 2>&1; du -sm /workspace", 60);
  EXPECT_THAT(r.value("stdout", ""), HasSubstr("No space left on device")) << r.dump();
  std::string out = r.value("stdout", "");
  long mb = std::stol(out.substr(out.rfind('\n', out.size() - 2) + 1));
  EXPECT_LE(mb, 32);
  // Through the file API too: the quota is EQUOTA (429), and nothing half-written is left.
  auto put = a.client().request("PUT", "/v1/sessions/t4-disk/files?path=/workspace/more",
                                std::string(4 << 20, 'x'), "application/octet-stream");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->status, 429) << put->body;
  EXPECT_THAT(put->body, HasSubstr("EQUOTA"));
  EXPECT_EQ(a.sh("ls -A /workspace").value("stdout", ""), ".probe\nfill\n");  // no temp file
  // Another session's workspace has all of its own space.
  auto o = other.sh("dd if=/dev/zero of=/workspace/f bs=1M count=16 2>&1 && echo written", 60);
  EXPECT_THAT(o.value("stdout", ""), HasSubstr("written"));
  // The host's disk lost at most what the two images hold (the sparse images grew by what was
  // written into them), not the 1000 MiB the command asked for.
  struct statvfs host_after {};
  ASSERT_EQ(::statvfs(shared_daemon().data_dir().c_str(), &host_after), 0);
  double used_mb = (static_cast<double>(host_before.f_bavail) - host_after.f_bavail) *
                   host_before.f_frsize / (1 << 20);
  EXPECT_LT(used_mb, 200) << "host disk shrank by " << used_mb << " MiB";
  expect_others_serving();
}

TEST(ResourceTest, FdsAndFileSizeAreLimited) {
  // disk_mb also sets RLIMIT_FSIZE: no single file outgrows the workspace cap.
  Box a(shared_daemon(), "t4-rlimits",
        json{{"limits", {{"max_open_files", 100}, {"disk_mb", 64}}}});
  std::string fds = a.probe("fds");
  ASSERT_THAT(fds, StartsWith("OPENED")) << fds;
  EXPECT_LE(std::stol(fds.substr(7)), 100);
  EXPECT_THAT(fds, HasSubstr("EMFILE"));
  // RLIMIT_FSIZE is set; a write past it fails with EFBIG instead of filling the disk.
  auto lim = a.sh("ulimit -f");
  std::string v = lim.value("stdout", "");
  ASSERT_NE(v, "unlimited\n") << "no RLIMIT_FSIZE in the box";
  long blocks = std::stol(v);  // 512-byte blocks (POSIX sh)
  EXPECT_EQ(blocks, 64 * 2048);
  // /tmp (256 MiB) has room: the write stops at the 64 MiB RLIMIT_FSIZE, not at ENOSPC.
  EXPECT_EQ(a.probe("fsize", {"/tmp/big", "65"}), "DENIED EFBIG");
}

TEST(ResourceTest, StdoutFloodIsTruncatedAndDaemonMemoryBounded) {
  Box a(shared_daemon(), "t4-flood");
  auto r = a.exec({"/workspace/.probe", "flood", std::to_string(300L << 20)}, 60,
                  json{{"max_output_bytes", 1 << 20}});
  EXPECT_TRUE(r.value("stdout_truncated", false));
  EXPECT_EQ(r.value("stdout", "").size(), 1u << 20);
  EXPECT_LT(daemon_rss_kib(), kDaemonRssCapKib);
}

TEST(ResourceTest, CrashLeavesNoCoreFile) {
  Box a(shared_daemon(), "t4-core");
  auto r = a.exec({"/workspace/.probe", "core"});
  EXPECT_EQ(r.value("stdout", ""), "core_limit=0\n");
  EXPECT_EQ(r["signal"], 6) << r.dump();
  EXPECT_EQ(a.sh("ls /workspace | grep -c core").value("stdout", ""), "0\n");
}

}  // namespace
}  // namespace agentbox::security
