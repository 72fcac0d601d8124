#include "common/validate.h"

#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace agentbox::validate {
namespace {

// The message of a refusal (kInvalid), or "" when accepted.
std::string refusal(const Status& st) {
  if (st) return "";
  EXPECT_EQ(st.error().code, Code::kInvalid) << st.error().message;
  return st.error().message;
}

TEST(ValidateTest, SessionIds) {
  EXPECT_TRUE(session_id("group_123"));
  EXPECT_TRUE(session_id("a.b-C_9"));
  EXPECT_TRUE(session_id(std::string(kMaxIdBytes, 'a')));
  EXPECT_NE(refusal(session_id("")).find("empty"), std::string::npos);
  EXPECT_NE(refusal(session_id(std::string(kMaxIdBytes + 1, 'a'))).find("longer than 128"),
            std::string::npos);
  EXPECT_NE(refusal(session_id("a/b")).find("invalid session id \"a/b\""), std::string::npos);
  EXPECT_NE(refusal(session_id("..")).find("reserved"), std::string::npos);
  EXPECT_NE(refusal(session_id(".")).find("reserved"), std::string::npos);
  // Control bytes are shown escaped, never raw.
  EXPECT_NE(refusal(session_id(std::string("a\n", 2))).find("\"a\\x0a\""), std::string::npos);
}

TEST(ValidateTest, EnvNamesAndValues) {
  EXPECT_TRUE(env_var("PATH", "/bin", "env"));
  EXPECT_TRUE(env_var("lower.and-dash", "", "env"));  // representable, so allowed
  EXPECT_TRUE(env_var("K", "any bytes \xff but NUL", "env"));
  const std::string empty = refusal(env_var("", "v", "env"));
  EXPECT_NE(empty.find("field 'env' has an invalid variable name \"\""), std::string::npos) << empty;
  EXPECT_NE(refusal(env_var("A=B", "v", "exec.env")).find("'exec.env'"), std::string::npos);
  EXPECT_NE(refusal(env_var(std::string("A\0B", 3), "v", "env")).find("\"A\\x00B\""),
            std::string::npos);
  const std::string nul_value = refusal(env_var("K", std::string("a\0b", 3), "env"));
  EXPECT_NE(nul_value.find("field 'env.K' must not contain NUL"), std::string::npos) << nul_value;
  EXPECT_TRUE(env({{"A", "1"}, {"B", "2"}}, "env"));
  EXPECT_NE(refusal(env({{"A", "1"}, {"=", "2"}}, "env")).find("\"=\""), std::string::npos);
}

TEST(ValidateTest, MountTargetsAllowed) {
  for (const char* p : {"/data", "/scratch", "/workspace/x", "/workspace/.skills/web", "/tmp/x",
                        "/mnt/x", "/opt/tool", "/srv/a/b", "/home/agent", "/shared/docs",
                        "/usrdata", "/etcetera", "/device", "/system"}) {
    EXPECT_TRUE(mount_target(p, "mounts[0].mount_path")) << p;
  }
}

TEST(ValidateTest, MountTargetsRefusedNameFieldAndPath) {
  for (const char* p :
       {"/", "/workspace", "/tmp", "/usr", "/usr/local", "/bin", "/bin/sh", "/sbin", "/lib",
        "/lib64", "/lib32", "/libx32", "/lib/x86_64-linux-gnu", "/etc", "/etc/ssl", "/proc",
        "/proc/1", "/sys", "/sys/fs/cgroup", "/dev", "/dev/shm"}) {
    const std::string m = refusal(mount_target(p, "mounts[2].mount_path"));
    EXPECT_NE(m.find("field 'mounts[2].mount_path'"), std::string::npos) << p << ": " << m;
    EXPECT_NE(m.find("\"" + std::string(p) + "\""), std::string::npos) << p << ": " << m;
  }
}

TEST(ValidateTest, MountTargetsMustBeAbsoluteAndNormalised) {
  EXPECT_NE(refusal(mount_target("data", "f")).find("absolute"), std::string::npos);
  EXPECT_NE(refusal(mount_target("", "f")).find("absolute"), std::string::npos);
  for (const char* p : {"/data/../etc", "/data/./x", "/a//b", "/data/", "/.."}) {
    EXPECT_NE(refusal(mount_target(p, "f")).find("normalised"), std::string::npos) << p;
  }
  EXPECT_NE(refusal(mount_target(std::string("/a\0b", 4), "f")).find("NUL"), std::string::npos);
  EXPECT_NE(refusal(mount_target("/" + std::string(kMaxMountPathBytes, 'a'), "f"))
                .find("longer than"),
            std::string::npos);
}

struct FakeLimits {
  std::optional<std::uint64_t> memory_mb;
  std::optional<std::uint32_t> cpu_percent;
  std::optional<std::uint32_t> max_pids;
  std::optional<std::uint64_t> disk_mb;
  std::optional<std::uint32_t> max_open_files;
  std::optional<std::uint32_t> cpu_time_sec;
  std::optional<std::uint64_t> tmp_mb;
};

TEST(ValidateTest, LimitsFloorsAndCeilings) {
  EXPECT_TRUE(limits(FakeLimits{}, "limits"));  // unset is fine: defaults apply
  EXPECT_TRUE(limits(FakeLimits{16, 1, 8, 16, 16}, "limits"));
  EXPECT_TRUE(limits(FakeLimits{kMaxMiB, 0xffffffffu, 0xffffffffu, kMaxMiB, 1u << 20}, "limits"));
  // 0 would mean "no limit" to the cgroup drivers: refused, never a lifted cap.
  const std::string zero = refusal(limits(FakeLimits{.memory_mb = 0}, "limits"));
  EXPECT_NE(zero.find("field 'limits.memory_mb' must be between 16 and"), std::string::npos)
      << zero;
  EXPECT_NE(zero.find("(got 0)"), std::string::npos) << zero;
  EXPECT_NE(refusal(limits(FakeLimits{.cpu_percent = 0}, "limits")).find("'limits.cpu_percent'"),
            std::string::npos);
  EXPECT_NE(refusal(limits(FakeLimits{.max_pids = 7}, "limits")).find("'limits.max_pids'"),
            std::string::npos);
  EXPECT_NE(refusal(limits(FakeLimits{.disk_mb = kMaxMiB + 1}, "limits")).find("'limits.disk_mb'"),
            std::string::npos);
  EXPECT_NE(refusal(limits(FakeLimits{.cpu_time_sec = 0}, "limits")).find("'limits.cpu_time_sec'"),
            std::string::npos);
  EXPECT_NE(refusal(limits(FakeLimits{.cpu_time_sec = 7 * 24 * 3600 + 1}, "limits"))
                .find("'limits.cpu_time_sec'"),
            std::string::npos);
  EXPECT_NE(refusal(limits(FakeLimits{.tmp_mb = 0}, "limits")).find("'limits.tmp_mb'"),
            std::string::npos);
  EXPECT_NE(refusal(limits(FakeLimits{.max_open_files = (1u << 20) + 1}, "l"))
                .find("'l.max_open_files'"),
            std::string::npos);
  EXPECT_NE(refusal(limit(kMaxPids, 1, "")).find("field 'max_pids'"), std::string::npos);
}

}  // namespace
}  // namespace agentbox::validate
