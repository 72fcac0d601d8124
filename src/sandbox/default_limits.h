#pragma once
// The built-in limits of an isolating backend, where neither the request nor the daemon's
// default_limits set one (disk_mb: none, the workspace is not capped; cpu_time_sec: none; tmp_mb:
// derived from the memory limit, default_tmp_mb()). The ns backend applies them; the session
// layer fills them into a session's spec, so a session shows what its box gets (API.md
// "Sessions": the effective limits).

#include <algorithm>
#include <cstdint>
#include <string>

#include "sandbox/sandbox.h"

namespace agentbox::sandbox {

inline constexpr std::uint64_t kDefaultMemoryMb = 512;
inline constexpr std::uint32_t kDefaultCpuPercent = 100;
inline constexpr std::uint32_t kDefaultMaxPids = 256;
inline constexpr std::uint32_t kDefaultOpenFiles = 1024;
// /tmp is a tmpfs: its pages are memory charged to the box. Its default size leaves at least
// three quarters of memory_mb to the commands, so a full /tmp means ENOSPC for the writer and
// never an OOM-killed session; 512 MiB at most.
inline constexpr std::uint64_t kMaxDefaultTmpMb = 512;

inline std::uint64_t default_tmp_mb(std::uint64_t memory_mb) {
  return std::max<std::uint64_t>(1, std::min(memory_mb / 4, kMaxDefaultTmpMb));
}

inline Limits builtin_default_limits() {
  Limits l;
  l.memory_mb = kDefaultMemoryMb;
  l.cpu_percent = kDefaultCpuPercent;
  l.max_pids = kDefaultMaxPids;
  l.max_open_files = kDefaultOpenFiles;
  return l;
}

// Every unset field of `l` takes the one of `defaults` (nothing derived: for layering defaults,
// e.g. the config's default_limits over the built-in ones).
inline void merge_unset_limits(Limits* l, const Limits& defaults) {
  if (!l->memory_mb) l->memory_mb = defaults.memory_mb;
  if (!l->cpu_percent) l->cpu_percent = defaults.cpu_percent;
  if (!l->max_pids) l->max_pids = defaults.max_pids;
  if (!l->disk_mb) l->disk_mb = defaults.disk_mb;
  if (!l->max_open_files) l->max_open_files = defaults.max_open_files;
  if (!l->cpu_time_sec) l->cpu_time_sec = defaults.cpu_time_sec;
  if (!l->tmp_mb) l->tmp_mb = defaults.tmp_mb;
}

// A session's effective limits: every unset field of `l` takes the one of `defaults`, then a
// tmp_mb still unset is derived from the memory limit (default_tmp_mb).
inline void fill_unset_limits(Limits* l, const Limits& defaults) {
  merge_unset_limits(l, defaults);
  if (!l->tmp_mb && l->memory_mb) l->tmp_mb = default_tmp_mb(*l->memory_mb);
}

// The rule between limits that each field's own bounds cannot check: /tmp lives in the box's
// memory, so it may take at most half of it (else a full /tmp would starve every command).
// Checked on effective limits (after fill_unset_limits); `prefix` names the object ("limits").
inline Status check_limits_together(const Limits& l, std::string_view prefix) {
  if (l.tmp_mb && l.memory_mb && *l.tmp_mb > *l.memory_mb / 2) {
    const std::string p(prefix);
    return fail(Code::kInvalid, "field '" + p + ".tmp_mb' = " + std::to_string(*l.tmp_mb) +
                                    " is more than half of " + p + ".memory_mb (" +
                                    std::to_string(*l.memory_mb) +
                                    "): /tmp is held in the box's memory");
  }
  return {};
}

}  // namespace agentbox::sandbox
