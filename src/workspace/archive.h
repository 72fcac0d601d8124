#pragma once
// Workspace archives (DESIGN.md "Lifecycle": destroyed, optionally archived to tar.zst first;
// API.md DELETE ?archive=true and POST /restore). Plain libarchive + zstd, no HTTP, no tenants.
//
// SECURITY (shared/SECURITY.md T5): an archive handed to restore is untrusted input; the
// session that owned the workspace chose every byte of it. extract_archive() therefore
//  - never builds a host path from an entry name: each entry's parent is resolved with
//    openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) from the dirfd of
//    the new workspace, and the final name is created with *at() calls that do not follow it
//    (O_CREAT|O_EXCL|O_NOFOLLOW, mkdirat, symlinkat);
//  - refuses absolute names, ".." components, hard links, devices, FIFOs and sockets;
//  - strips setuid, setgid and sticky bits (only 0777 survives);
//  - stops at the limits below (bytes, entries, depth, expansion ratio) — bombs abort early;
//  - chowns what it creates to the given owner (the session uid), never to the uid in the tar.
// A failed extraction may leave a partial tree in `into`; the caller removes the directory
// (it made it, empty, for this purpose).
//
// Threading: plain blocking functions with all state on the stack; any thread may call them.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "common/error.h"

namespace agentbox::workspace {

struct ArchiveOwner {
  uid_t uid;
  gid_t gid;
};

struct ExtractLimits {
  std::uint64_t max_total_bytes = 8ull << 30;  // sum of file sizes, declared and written
  std::uint64_t max_entries = 1'000'000;
  std::size_t max_depth = 256;  // path components of one entry
  // Bytes written may exceed max_ratio x the compressed archive size only below ratio_floor.
  std::uint64_t max_ratio = 1000;
  std::uint64_t ratio_floor_bytes = 64ull << 20;
};

struct ArchiveStats {
  std::uint64_t entries = 0;
  std::uint64_t bytes = 0;  // file content bytes
};

// The deepest tree write_archive() stores; deeper is an error (it keeps one fd per level).
inline constexpr std::size_t kMaxArchiveDepth = 256;

// Writes the tree under `workspace_fd` (a directory fd) as a zstd-compressed pax tar to
// `out_dir_fd`/`out_name`: written to a temp name in out_dir_fd, fsynced, renamed (no replace),
// directory fsynced. Regular files, directories and symlinks (as links, never followed) are
// stored with their 0777 mode bits and mtime; FIFOs, sockets and devices are skipped. `shown` is
// the workspace's name for error messages. On error nothing is left in out_dir_fd.
[[nodiscard]] Result<ArchiveStats> write_archive(int workspace_fd, int out_dir_fd,
                                                 const std::string& out_name,
                                                 const std::string& shown);

// Extracts the tar.zst read from `archive_fd` into the directory `into_fd` (see SECURITY
// above). Errors: not a zstd tar -> EINVAL; an escaping or forbidden entry -> EACCES naming it;
// a limit -> ETOOBIG naming it; a duplicate entry -> EINVAL. `shown` names the archive.
[[nodiscard]] Result<ArchiveStats> extract_archive(int archive_fd, int into_fd,
                                                   const ExtractLimits& limits,
                                                   std::optional<ArchiveOwner> owner,
                                                   const std::string& shown);

}  // namespace agentbox::workspace
