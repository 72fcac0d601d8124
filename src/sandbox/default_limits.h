#pragma once
// The built-in limits of an isolating backend, where neither the request nor the daemon's
// default_limits set one (disk_mb: none, the workspace is not capped). The ns backend applies
// them; the session layer fills them into a session's spec, so a session shows what its box
// gets (API.md "Sessions": the effective limits).

#include <cstdint>

#include "sandbox/sandbox.h"

namespace agentbox::sandbox {

inline constexpr std::uint64_t kDefaultMemoryMb = 512;
inline constexpr std::uint32_t kDefaultCpuPercent = 100;
inline constexpr std::uint32_t kDefaultMaxPids = 256;
inline constexpr std::uint32_t kDefaultOpenFiles = 1024;

inline Limits builtin_default_limits() {
  Limits l;
  l.memory_mb = kDefaultMemoryMb;
  l.cpu_percent = kDefaultCpuPercent;
  l.max_pids = kDefaultMaxPids;
  l.max_open_files = kDefaultOpenFiles;
  return l;
}

// Every unset field of `l` takes the one of `defaults`.
inline void fill_unset_limits(Limits* l, const Limits& defaults) {
  if (!l->memory_mb) l->memory_mb = defaults.memory_mb;
  if (!l->cpu_percent) l->cpu_percent = defaults.cpu_percent;
  if (!l->max_pids) l->max_pids = defaults.max_pids;
  if (!l->disk_mb) l->disk_mb = defaults.disk_mb;
  if (!l->max_open_files) l->max_open_files = defaults.max_open_files;
}

}  // namespace agentbox::sandbox
