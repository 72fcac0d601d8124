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

// RLIMIT_CPU for one command (API.md limits.cpu_time_sec): soft `seconds` (SIGXCPU, which ends
// a process that does not handle it) and hard `seconds` + 1 (SIGKILL, for one that does). Each
// process the command starts inherits the limit and counts its own CPU time. 0 leaves the
// limit as it is. Returns 0 or errno. async-signal-safe: called in the box init's forked child.
int apply_cpu_time_limit(std::uint64_t seconds) noexcept;

}  // namespace agentbox::linux
