#include "linux/rlimits.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace agentbox::linux {
namespace {

int set_limit(int resource, std::uint64_t value) noexcept {
  // prlimit64 directly: a plain syscall on the calling process, with 64-bit values.
  struct rlimit lim;
  lim.rlim_cur = value;
  lim.rlim_max = value;
  return ::syscall(SYS_prlimit64, 0, resource, &lim, nullptr) == 0 ? 0 : errno;
}

}  // namespace

int apply_rlimits(const BoxRlimits& limits) noexcept {
  if (int err = set_limit(RLIMIT_NOFILE, limits.nofile); err != 0) return err;
  if (int err = set_limit(RLIMIT_FSIZE, limits.fsize_bytes); err != 0) return err;
  if (int err = set_limit(RLIMIT_CORE, limits.core); err != 0) return err;
  if (limits.nproc != 0) {
    if (int err = set_limit(RLIMIT_NPROC, limits.nproc); err != 0) return err;
  }
  return 0;
}

int apply_cpu_time_limit(std::uint64_t seconds) noexcept {
  if (seconds == 0) return 0;
  struct rlimit lim;
  lim.rlim_cur = seconds;
  lim.rlim_max = seconds + 1;
  return ::syscall(SYS_prlimit64, 0, RLIMIT_CPU, &lim, nullptr) == 0 ? 0 : errno;
}

}  // namespace agentbox::linux
