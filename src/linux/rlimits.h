#pragma once
// Resource limits of a box's processes (set in the box's init, inherited by every command).

#include <cstdint>

namespace agentbox::linux {

struct BoxRlimits {
  std::uint64_t nofile = 1024;             // RLIMIT_NOFILE: open files (API: limits.max_open_files)
  std::uint64_t fsize_bytes = 4ull << 30;  // RLIMIT_FSIZE: largest file a write may create
  std::uint64_t core = 0;                  // RLIMIT_CORE: no core files (SECURITY.md T4)
  std::uint64_t nproc = 0;                 // RLIMIT_NPROC for the session uid; 0 = leave as is
};

// Sets each limit as both soft and hard, so the box cannot raise it again. Values may be
// RLIM_INFINITY. Returns 0 or the errno of the first failing setrlimit.
// async-signal-safe: may be called in a clone child.
int apply_rlimits(const BoxRlimits& limits) noexcept;

}  // namespace agentbox::linux
