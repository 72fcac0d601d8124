#pragma once
// File operations on agent-supplied paths, confined to one directory tree: the piece every
// backend's file API stands on.
//
// SECURITY: every path is resolved with openat2 from the root dirfd with RESOLVE_BENEATH or
// RESOLVE_IN_ROOT plus RESOLVE_NO_MAGICLINKS, so "..", absolute paths, symlinks (planted or
// swapped in mid-operation) and /proc magic links cannot reach outside the root. Operations that
// create, replace or remove an entry resolve only its PARENT that way and then act on the final
// name with *at() calls relative to the parent fd, which never follow a final symlink (unlinkat,
// renameat, mkdirat, fstatat(AT_SYMLINK_NOFOLLOW), openat(O_NOFOLLOW)). No decision is ever made
// on the path string alone.
//
// Threading: a RootedFs is immutable after construction; every call keeps its state on the stack,
// so any number of threads may call it concurrently. Calls block (plain syscalls).

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "sandbox/sandbox.h"

namespace agentbox::sandbox {

// The name prefix of create_file()'s temp files.
inline constexpr std::string_view kAtomicTempPrefix = ".agentbox-tmp-";

enum class RootMode {
  // RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS: the root is the workspace dir (host backend);
  // absolute paths and escapes are EACCES.
  kBeneath,
  // RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS: the root is the box's "/" (e.g. an fd of
  // /proc/<init>/root); "/" , ".." and absolute symlinks clamp to it, as chroot would.
  kInRoot,
};

struct Owner {
  uid_t uid;
  gid_t gid;
};

class RootedFs {
 public:
  // `root` is a directory fd (O_PATH is enough); the RootedFs owns it.
  // `owner`: when set, files and dirs created get this owner (fchown), so workspace files belong
  // to the session uid rather than to the daemon.
  // `display_prefix`: prepended to relative paths in error messages (e.g. "/workspace"), so
  // messages name the path the agent used and never the host path of the root.
  RootedFs(UniqueFd root, RootMode mode, std::optional<Owner> owner = std::nullopt,
           std::string display_prefix = {});

  int root_fd() const { return root_.get(); }
  RootMode mode() const { return mode_; }

  // Paths are relative to the root ("a/b"; "" or "." = the root). With kInRoot absolute in-box
  // paths ("/tmp/x") work too. A path with a NUL byte is EINVAL, one over kMaxPathBytes ETOOBIG.
  // Reads (open_dir, open_file, read_dir) follow symlinks, but only within the root.

  // An O_RDONLY|O_DIRECTORY fd of the directory at `path`.
  [[nodiscard]] Result<UniqueFd> open_dir(const std::string& path) const;
  // Regular files only: opened O_NONBLOCK (a FIFO cannot hang us), checked with fstat, then
  // O_NONBLOCK is cleared. FIFO/socket/device -> EINVAL, directory -> EISDIR.
  [[nodiscard]] Result<FileReader> open_file(const std::string& path) const;
  // Atomic writer: a temp file ".agentbox-tmp-<random>" in the target's directory, renamed over
  // the target on commit. A final symlink is replaced, never followed; an existing directory is
  // EISDIR; a missing parent is ENOENT unless opts.mkdirs. opts.mode must be within 0777
  // (EINVAL otherwise: the daemon never makes setuid files); without it a replaced file keeps
  // its permission bits, a new one gets 0644. Writing past opts.max_bytes -> ETOOBIG, and the
  // writer is spent (the temp file is gone, commit() fails, the target is untouched).
  [[nodiscard]] Result<std::unique_ptr<FileWriter>> create_file(const std::string& path,
                                                                WriteOptions opts) const;
  // Does not follow a final symlink (is_symlink reported). FileInfo::path is `path` as given and
  // FileInfo::name its last component ("" for the root): backends put their in-box spelling.
  [[nodiscard]] Result<FileInfo> stat(const std::string& path) const;
  // Sorted by name (bytewise). More than max_entries entries -> ETOOBIG.
  [[nodiscard]] Result<std::vector<DirEntry>> read_dir(const std::string& path,
                                                       std::size_t max_entries = 100000) const;
  // Creates missing directories component by component (mode 0755 before umask, owner applied).
  // An existing directory is fine; an existing non-directory is ENOTDIR.
  [[nodiscard]] Status mkdir_all(const std::string& path) const;
  // A file, symlink or empty directory; never follows a final symlink. The root itself -> EACCES;
  // a non-empty directory -> ENOTEMPTY.
  [[nodiscard]] Status remove(const std::string& path) const;
  // Recursive, iterative, with O(1) fds (10,000-deep trees are fine). Never follows a symlink
  // (links are removed, not their targets) and never crosses a mount: a mount point at or below
  // `path` stops it with EACCES. A directory moved out from under it mid-way stops it with
  // EACCES too. Missing -> ENOENT; the root itself -> EACCES.
  [[nodiscard]] Status remove_all(const std::string& path) const;
  // Both ends resolved inside the root; replaces `to` like rename(2). The root -> EACCES.
  [[nodiscard]] Status rename(const std::string& from, const std::string& to) const;

 private:
  // openat2 of `rel` from the root with this mode's RESOLVE_* flags (EAGAIN retried). Errors
  // name `op` and `shown` (the agent's path).
  [[nodiscard]] Result<UniqueFd> resolve(const std::string& rel, int flags, const char* op,
                                         const std::string& shown) const;
  // The error for an operation that needs a final name but got the root, "." or "..".
  [[nodiscard]] Error refuse_nameless(const std::string& path, const char* op) const;
  [[nodiscard]] Status remove_tree(int parent_fd, const std::string& name,
                                   const std::string& path) const;
  // The agent's spelling of `path` (display prefix joined, control bytes escaped).
  std::string display(const std::string& path) const;
  // "op(path)" for error messages.
  std::string what(const char* op, const std::string& path) const;

  UniqueFd root_;
  RootMode mode_;
  std::optional<Owner> owner_;
  std::string display_prefix_;
};

// Removes the temp files of atomic writes that never committed (a daemon killed mid-write) from
// the tree below `dir_fd`: regular files named like create_file()'s temps and last modified
// before `older_than` (a write in flight now is newer). Walks by dirfd with O_NOFOLLOW and
// AT_SYMLINK_NOFOLLOW, so a planted symlink never takes it outside the tree; at most 64 levels
// deep. Returns how many it removed.
std::size_t remove_stale_temp_files(int dir_fd, std::chrono::system_clock::time_point older_than);

}  // namespace agentbox::sandbox
