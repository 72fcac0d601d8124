#pragma once
// The box filesystem (shared/DESIGN.md "The ns backend"): what a box sees as "/".
//
// A fresh tmpfs root holding:
//   /usr /bin /sbin /lib /lib32 /lib64 /libx32   read-only binds of the host's (the ones that
//                                                exist; usrmerge symlinks are recreated as such)
//   /etc        a curated, read-only view: synthetic passwd/group/hosts/hostname/nsswitch.conf
//               naming the session user, plus read-only binds of what programs need from the host
//               (ld.so.cache, resolv.conf, ssl certs, alternatives, timezone, ...)
//   /workspace  read-write bind of the session's workspace (nosuid, nodev)
//   /tmp        tmpfs, size- and inode-capped, mode 1777 (nosuid, nodev)
//   /mnt        tmpfs of 1 MiB, mode 0755, root's: mountpoints for mounts added while the box
//               runs (nosuid, nodev, noexec; the binds on it keep their own flags)
//   /proc       a fresh procfs of the box's pid namespace; /proc/sys and friends read-only
//   /dev        tmpfs with binds of null zero full random urandom tty, its own devpts (ptmx),
//               /dev/shm tmpfs, fd/stdin/stdout/stderr links
//   extra binds (shared dirs, skills, configured mounts), read-only unless asked otherwise;
//               prepared in the daemon (linux/host_binds.h), read-write ones idmapped so the
//               session user writes as the host dir's owner
// Nothing else of the host (no /home, /root, /var, /run, /sys, the daemon's data dir).
//
// Planning and applying are split. plan_box_fs() runs in the daemon: it inspects the host (which
// system dirs exist, which are symlinks), validates the spec and prepares every string. The clone
// child then runs apply_mount_plan(), which only makes syscalls on the prepared plan: no
// allocation, no locks, async-signal-safe. Pivoting into the root is box.cc's job.
//
// SECURITY: mount targets are resolved from the new root's fd one component at a time with
// openat2(RESOLVE_NO_SYMLINKS), and mounts are attached to those fds with the new mount API
// (open_tree/fsmount + move_mount), never by path. A symlink an agent planted in its workspace
// (e.g. /workspace/.skills -> /etc) therefore cannot redirect a mount or a mountpoint mkdir to a
// host path.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"

namespace agentbox::linux {

inline constexpr char kBoxWorkspacePath[] = "/workspace";
inline constexpr char kBoxUserName[] = "agent";
inline constexpr char kBoxCachePath[] = "/cache";

struct BoxBind {
  std::string host_path;  // absolute; must exist
  std::string box_path;   // absolute, normalised; not "/", not under /proc or /dev
  bool read_only = true;
  std::string what;       // names it in errors ("mounts[0]", "skills.web"); "" = by box_path
};

struct BoxFsSpec {
  std::string workspace_dir;  // host path, bound read-write at /workspace
  // workspace_dir is a client's host dir (host_binds.h prepare_workspace_bind): idmapped for
  // uid/gid when writable and owned by another user, read-only when workspace_read_only.
  bool workspace_on_host = false;
  bool workspace_read_only = false;
  std::vector<BoxBind> binds;
  uid_t uid = 0;  // the session user, "agent" in the box's /etc/passwd
  gid_t gid = 0;
  std::string hostname = "agentbox";
  std::uint64_t tmp_bytes = 256ull << 20;
  std::uint64_t tmp_inodes = 65536;
  std::uint64_t shm_bytes = 64ull << 20;
  // Seed 004: package caches (pip, uv, npm, bun) on their own size-capped tmpfs at kBoxCachePath,
  // outside the workspace's disk quota. 0 = no /cache.
  std::uint64_t cache_bytes = 0;
  std::uint64_t cache_inodes = 262144;
  // Where the host's system dirs and /etc are read from ("/" except in tests).
  std::string host_root = "/";
  // The root is an image's (linux/image_root.h), not a fresh tmpfs: no host system dirs and no
  // host /etc entries; the identity files (passwd, group, hosts, hostname, nsswitch.conf)
  // replace the image's.
  bool image_root = false;
};

// Mount flags of the new mount API (MOUNT_ATTR_*), spelled here so this header need not pull in
// <sys/mount.h>.
inline constexpr std::uint64_t kAttrRdonly = 0x1;
inline constexpr std::uint64_t kAttrNosuid = 0x2;
inline constexpr std::uint64_t kAttrNodev = 0x4;
inline constexpr std::uint64_t kAttrNoexec = 0x8;

struct MountOp {
  enum class Kind : std::uint8_t {
    kDir,         // mkdir -p target (mode), never through a symlink
    kFile,        // create target with `data` (fails if it exists)
    kMountpoint,  // create an empty file target if missing (a mountpoint for a file bind)
    kSymlink,     // symlink target -> source
    kBind,        // bind source (host path if absolute, else relative to the new root) on target
    kFs,          // mount a new `source` filesystem (tmpfs, proc, devpts) with options `data`
  };
  Kind kind = Kind::kDir;
  const char* target = nullptr;  // relative to the new root: "usr", "etc/passwd"
  const char* source = nullptr;
  const char* data = nullptr;    // kFile: contents; kFs: "k=v,flag,..." options
  std::size_t data_len = 0;
  std::uint64_t attrs = 0;       // kBind, kFs: kAttr* flags of the new mount
  bool recursive = false;        // kBind: include submounts
  std::uint32_t mode = 0755;     // kDir, kFile
  // kBind of a tree prepared in the daemon (host_binds.h): just move_mount it onto target
  // (source, attrs and idmapped are for describe()). Owned by the plan; -1 otherwise.
  int tree_fd = -1;
  bool idmapped = false;
  bool replace = false;  // kFile, kSymlink: remove what is at target first (an image root)
};

// A prepared plan. Move-only: the ops point into strings the plan owns (std::deque keeps their
// addresses stable across growth and moves).
class MountPlan {
 public:
  MountPlan() = default;
  MountPlan(MountPlan&&) = default;
  MountPlan& operator=(MountPlan&&) = default;
  MountPlan(const MountPlan&) = delete;
  MountPlan& operator=(const MountPlan&) = delete;

  const std::vector<MountOp>& ops() const { return ops_; }
  // "bind /usr on /usr (ro)", for the error naming a failed step.
  std::string describe(std::size_t index) const;

  void add_dir(std::string target, std::uint32_t mode);
  void add_file(std::string target, std::string contents, std::uint32_t mode);
  void add_mountpoint(std::string target);
  void add_symlink(std::string target, std::string link_text);
  void add_bind(std::string source, std::string target, std::uint64_t attrs, bool recursive);
  void add_fs(std::string fstype, std::string target, std::string options, std::uint64_t attrs);
  // A detached mount prepared in the daemon (host_binds.h), attached on target as it is.
  void add_tree(UniqueFd tree, std::string source, std::string target, std::uint64_t attrs,
                bool idmapped);
  // Marks ops from index `from` on as MountOp::replace.
  void mark_replace(std::size_t from);

 private:
  const char* keep(std::string s);

  std::deque<std::string> strings_;
  std::vector<MountOp> ops_;
  std::vector<UniqueFd> trees_;  // the kBind ops' tree_fd
};

// Builds the plan for one box. Fails (kInvalid / kNotFound) on a bad bind: relative or
// non-normalised paths, a box path of "/" or under /proc or /dev, a missing host path, a
// read-write bind the kernel or its filesystem cannot idmap (host_binds.h). Extra binds are
// prepared here, in the daemon: the plan holds their detached mounts until it is destroyed.
[[nodiscard]] Result<MountPlan> plan_box_fs(const BoxFsSpec& spec);

// Whether the host path `path` (absolute) is seen at the same path inside an isolated box: it
// lies under one of the system dirs every box gets (/usr, /bin, /lib, ...) or under one of
// `readonly_dirs` (the daemon's, bound read-only at their own path), as given or resolved.
[[nodiscard]] bool host_path_seen_in_box(const std::string& path,
                                         const std::vector<std::string>& readonly_dirs);

// Runs the plan with `root_fd` (the new root, not yet pivoted into) as the base of every target.
// Returns 0, or an errno with *failed_op set to the index of the op that failed.
// async-signal-safe.
int apply_mount_plan(const MountPlan& plan, int root_fd, std::size_t* failed_op) noexcept;

// The same component-wise, symlink-refusing open the plan uses, for box.cc: `rel` relative to
// root_fd, as an O_PATH fd. async-signal-safe. Returns -1 with errno set.
int open_in_root_nofollow(int root_fd, const char* rel, bool create_dirs, bool want_dir,
                          std::uint32_t mode) noexcept;

}  // namespace agentbox::linux
