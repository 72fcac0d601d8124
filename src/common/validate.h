#pragma once
// One validator per rule of the API, used by every layer that checks it (the JSON codec, the
// session manager, the backends, the box's mount plan): a rule written once cannot drift apart.
// Lives in common/ because the lowest caller (linux/mounts.cc) sits below sandbox/.
//
// Every error is kInvalid and reads "field '<field>' <what is wrong>", quoting the bad value.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"

namespace agentbox::validate {

// Session ids (and skill names, which become one path component): 1..128 bytes of
// A-Z a-z 0-9 . _ -, and not "." or "..". Messages say "invalid session id \"...\"".
inline constexpr std::size_t kMaxIdBytes = 128;
Status session_id(std::string_view id);

// An environment variable: the name is non-empty and has no '=' or NUL (anything else a "K=V" C
// string can carry is allowed; stricter POSIX shell rules are the shell's business), the value
// has no NUL. `field` is the map's name ("env"); a bad value is reported as "env.<name>".
Status env_var(std::string_view name, std::string_view value, std::string_view field);
Status env(const std::map<std::string, std::string>& vars, std::string_view field);

// Where a mount may go in the box: an absolute, normalised path (no empty, "." or ".."
// components, no trailing '/', no NUL, at most kMaxMountPathBytes) that is not
//  - "/" or "/workspace" itself (only the primary host_path replaces the workspace; a bind over
//    it would hide what the agent writes from the file API and from archives), nor "/tmp" itself
//    (the box's sized tmpfs);
//  - at or beneath a system directory: /usr, /bin, /sbin, /lib*, /etc (read-only binds of the
//    host, or the box's synthetic /etc: the mount point cannot be created there, or it shadows
//    what every command needs), /proc, /sys, /dev (the box's own kernel filesystems).
// Beneath /workspace, /tmp and anywhere else (/data, /mnt/x, /opt/x, /srv/x, /home/x) is fine:
// those are the box's own directories, created on its tmpfs root or in the workspace.
inline constexpr std::size_t kMaxMountPathBytes = 1024;
Status mount_target(std::string_view path, std::string_view field);

// Resource limits: floors and ceilings. SECURITY: the cgroup drivers read 0 as "no limit", so a
// value below the floor would lift a cap rather than tighten it, and a box needs room for its
// init and one command.
struct LimitBounds {
  std::string_view name;
  std::uint64_t min;
  std::uint64_t max;
};
inline constexpr std::uint64_t kMaxMiB = std::uint64_t{1} << 40;  // far beyond any machine
inline constexpr LimitBounds kMemoryMb{"memory_mb", 16, kMaxMiB};
inline constexpr LimitBounds kCpuPercent{"cpu_percent", 1, 0xffffffffu};
inline constexpr LimitBounds kMaxPids{"max_pids", 8, 0xffffffffu};
inline constexpr LimitBounds kDiskMb{"disk_mb", 16, kMaxMiB};
inline constexpr LimitBounds kMaxOpenFiles{"max_open_files", 16, 1u << 20};  // fs.nr_open default
// CPU seconds per command: up to a week (seed 004's max_cpu_time; RLIMIT_CPU counts seconds).
inline constexpr LimitBounds kCpuTimeSec{"cpu_time_sec", 1, 7 * 24 * 3600};
inline constexpr LimitBounds kTmpMb{"tmp_mb", 1, kMaxMiB};

// "field '<prefix>.<name>' must be between <min> and <max>" when `value` is out of bounds.
Status limit(const LimitBounds& b, std::uint64_t value, std::string_view prefix);

// Every set field of a sandbox::Limits-shaped struct (optional memory_mb, cpu_percent, max_pids,
// disk_mb, max_open_files, cpu_time_sec, tmp_mb); a template so that this low module need not
// know sandbox/.
template <typename L>
Status limits(const L& l, std::string_view prefix) {
  auto one = [&](const LimitBounds& b, const auto& v) -> Status {
    if (!v) return {};
    return limit(b, static_cast<std::uint64_t>(*v), prefix);
  };
  AB_TRY(one(kMemoryMb, l.memory_mb));
  AB_TRY(one(kCpuPercent, l.cpu_percent));
  AB_TRY(one(kMaxPids, l.max_pids));
  AB_TRY(one(kDiskMb, l.disk_mb));
  AB_TRY(one(kMaxOpenFiles, l.max_open_files));
  AB_TRY(one(kCpuTimeSec, l.cpu_time_sec));
  AB_TRY(one(kTmpMb, l.tmp_mb));
  return {};
}

// A process tag (API.md "Processes"; LangBot's process_id): 1..64 of [A-Za-z0-9._-], not all
// digits (so a tag never reads as a pid).
inline constexpr std::size_t kMaxTagBytes = 64;
bool is_process_tag(std::string_view tag);

// `s` as it can be shown in a message: quoted, printable ASCII kept, anything else as \xNN, cut
// after 160 bytes so a hostile megabyte-long value does not come back in every error and log.
std::string quote(std::string_view s);

}  // namespace agentbox::validate
