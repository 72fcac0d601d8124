#pragma once
// Workspaces on the host (DESIGN.md "workspace/"): data_dir/workspaces/<id>, their ownership,
// their size-capped disks (limits.disk_mb: data_dir/disks/<id>.img, linux/quota_disk.h) and
// their archives (data_dir/archives, archive.h). No sessions, no tenants, no boxes: the
// session manager decides when, this module knows how.
//
// SECURITY: ids are validated single path components (the caller's job) and every open is
// O_NOFOLLOW beneath the workspaces dir fd, so a symlink planted where a workspace belongs is
// never followed: the workspace is exactly data_dir/workspaces/<id>. The workspaces dir is
// 0700 and daemon-owned: no session uid can list or enter other sessions' workspaces.
//
// Threading: every method may be called from any thread; calls for one id must not overlap
// (the session manager serialises them by the session's phase).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "workspace/archive.h"

namespace agentbox::workspace {

// Who owns a workspace's root: the session's uid with isolation; nullopt = the daemon's user.
using Owner = ArchiveOwner;

class Workspaces {
 public:
  // Creates data_dir/workspaces (0700) if missing. data_dir is absolute and exists.
  // `root_dir` (absolute): keep the workspaces there instead (seed 001's --workdir), made 0700
  // with its parents when missing; disks and archives stay in data_dir.
  static Result<Workspaces> open(std::string data_dir, std::string root_dir = "");
  std::string root_path() const { return root_path_; }

  std::string path(const std::string& id) const;  // host path of a workspace
  std::string archives_dir() const { return data_dir_ + "/archives"; }

  struct Prepared {
    UniqueFd dir;          // the workspace root (the mounted disk's root when capped)
    bool created = false;  // the directory did not exist before
  };
  // The one sequence every workspace goes through before use: mkdir 0700 -> open (O_NOFOLLOW;
  // a non-directory there is EACCES) -> attach the quota disk when disk_mb -> chmod 0700 (the
  // umask may have narrowed mkdir, a reused one keeps its own) -> chown to `owner`.
  // must_be_new: an existing directory is EEXIST (a restore never merges). On failure a
  // directory made here is removed again.
  Result<Prepared> prepare(const std::string& id, bool must_be_new, std::optional<Owner> owner,
                           std::uint64_t disk_mb) const;
  // The workspace root, or an error (ENOENT when missing).
  Result<UniqueFd> open_dir(const std::string& id) const;
  // A dup of the workspaces dir fd (e.g. for a RootedFs over all of them).
  Result<UniqueFd> dup_root() const;
  bool exists(const std::string& id) const;
  // Names in data_dir/workspaces.
  std::vector<std::string> names() const;

  // Unmounts a capped workspace and deletes its image (before the directory is removed, which
  // would otherwise fail on the mount point). Missing pieces are fine.
  Status drop_disk(const std::string& id) const;
  // Unmounts a capped workspace, keeping its image (a clean daemon exit; the next attach
  // mounts it again). Not capped or not mounted: nothing to do.
  Status unmount_disk(const std::string& id) const;

  // Writes the workspace to data_dir/archives/<id>-<UTC time>.tar.zst (fsynced); its path.
  Result<std::string> archive(const std::string& id) const;
  // The archive a restore names (absolute, or relative to archives_dir()), opened after the
  // location and name checks: outside the archives dir is EACCES, not a .tar.zst EINVAL.
  Result<UniqueFd> open_archive(const std::string& archive) const;

 private:
  Workspaces(std::string data_dir, std::string root_path, UniqueFd root)
      : data_dir_(std::move(data_dir)), root_path_(std::move(root_path)), root_(std::move(root)) {}
  std::string image_path(const std::string& id) const;
  Status attach_disk(const std::string& id, std::optional<Owner> owner,
                     std::uint64_t disk_mb) const;
  Result<UniqueFd> open_archives_dir() const;

  std::string data_dir_;
  std::string root_path_;  // data_dir/workspaces, or the root given to open()
  UniqueFd root_;          // root_path_, O_DIRECTORY
};

}  // namespace agentbox::workspace
