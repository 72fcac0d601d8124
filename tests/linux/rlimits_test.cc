#include "linux/rlimits.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "linux/caps.h"

namespace agentbox::linux {
namespace {

// Runs fn in a forked child; returns its exit code (0 = every check passed, else the failing
// check's number).
int in_child(int (*fn)()) {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(fn());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

TEST(Rlimits, AppliedAsSoftAndHardAndEnforced) {
  EXPECT_EQ(in_child([]() -> int {
              BoxRlimits lim;
              lim.nofile = 32;
              lim.fsize_bytes = 4096;
              lim.core = 0;
              lim.nproc = 500;
              if (apply_rlimits(lim) != 0) return 1;
              struct rlimit r;
              ::getrlimit(RLIMIT_NOFILE, &r);
              if (r.rlim_cur != 32 || r.rlim_max != 32) return 2;
              ::getrlimit(RLIMIT_FSIZE, &r);
              if (r.rlim_cur != 4096 || r.rlim_max != 4096) return 3;
              ::getrlimit(RLIMIT_CORE, &r);
              if (r.rlim_cur != 0 || r.rlim_max != 0) return 4;
              ::getrlimit(RLIMIT_NPROC, &r);
              if (r.rlim_cur != 500 || r.rlim_max != 500) return 5;
              // Open files until EMFILE: never more than the limit.
              int opened = 0;
              for (;;) {
                int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
                if (fd < 0) {
                  if (errno != EMFILE) return 6;
                  break;
                }
                ++opened;
                if (opened > 32) return 7;
              }
              for (int fd = 3; fd < 32; ++fd) ::close(fd);
              // A write past RLIMIT_FSIZE: EFBIG once SIGXFSZ is ignored.
              ::signal(SIGXFSZ, SIG_IGN);
              char path[] = "/tmp/agentbox-rlimit-XXXXXX";
              int fd = ::mkstemp(path);
              if (fd < 0) return 8;
              ::unlink(path);
              std::vector<char> buf(8192, 'x');
              ssize_t n = ::write(fd, buf.data(), buf.size());
              if (n != 4096) return 9;
              if (::write(fd, buf.data(), 1) != -1 || errno != EFBIG) return 10;
              // Without CAP_SYS_RESOURCE the box cannot raise them back.
              if (drop_all_capabilities() != 0) return 11;
              r.rlim_cur = r.rlim_max = 1 << 20;
              if (::setrlimit(RLIMIT_FSIZE, &r) != -1 || errno != EPERM) return 12;
              return 0;
            }),
            0);
}

TEST(Rlimits, NprocZeroLeavesItAlone) {
  EXPECT_EQ(in_child([]() -> int {
              struct rlimit before, after;
              ::getrlimit(RLIMIT_NPROC, &before);
              BoxRlimits lim;  // defaults: nproc = 0
              if (apply_rlimits(lim) != 0) return 1;
              ::getrlimit(RLIMIT_NPROC, &after);
              if (before.rlim_cur != after.rlim_cur || before.rlim_max != after.rlim_max) return 2;
              ::getrlimit(RLIMIT_CORE, &after);
              return after.rlim_max == 0 ? 0 : 3;
            }),
            0);
}

[[noreturn]] void spin_forever() {
  volatile unsigned long n = 0;
  for (;;) n = n + 1U;
}

TEST(Rlimits, CpuTimeLimitEndsABusyLoopWithSigxcpu) {
  // A process that spins past its CPU seconds dies of SIGXCPU (the soft limit); the hard limit
  // is one second later, for a process that handles SIGXCPU.
  EXPECT_EQ(in_child([]() -> int {
              if (apply_cpu_time_limit(1) != 0) return 1;
              struct rlimit r;
              ::getrlimit(RLIMIT_CPU, &r);
              if (r.rlim_cur != 1 || r.rlim_max != 2) return 2;
              spin_forever();
            }),
            100 + SIGXCPU);
  EXPECT_EQ(in_child([]() -> int {
              ::signal(SIGXCPU, SIG_IGN);
              if (apply_cpu_time_limit(1) != 0) return 1;
              spin_forever();
            }),
            100 + SIGKILL);
  // 0: the limit is left as it was.
  EXPECT_EQ(in_child([]() -> int {
              struct rlimit before;
              ::getrlimit(RLIMIT_CPU, &before);
              if (apply_cpu_time_limit(0) != 0) return 1;
              struct rlimit after;
              ::getrlimit(RLIMIT_CPU, &after);
              return after.rlim_cur == before.rlim_cur && after.rlim_max == before.rlim_max ? 0 : 2;
            }),
            0);
}

}  // namespace
}  // namespace agentbox::linux
