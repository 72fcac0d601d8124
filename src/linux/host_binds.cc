#include "linux/host_binds.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/validate.h"
#include "linux/idmap.h"
#include "linux/pooled_box.h"
#include "linux/sys.h"

namespace agentbox::linux {
namespace {

std::string describe(const PreparedBind& b) {
  return b.what.empty() ? "mount " + b.box_path : b.what + " (" + b.box_path + ")";
}

std::string describe(const BoxBind& b) {
  return b.what.empty() ? "mount " + b.box_path : b.what + " (" + b.box_path + ")";
}

// A mountpoint made in the running box for a bind, removed again if the whole attach fails.
struct Made {
  UniqueFd parent;
  std::string name;
  bool dir = true;
};

// Opens `rel` (relative to root_fd, no symlinks anywhere) as an O_PATH fd, creating the missing
// directories (and, for a file bind, the empty file) it needs; each one made is appended to
// `made`. Returns -1 with errno set.
int open_mountpoint(int root_fd, const std::string& rel, bool is_dir, std::vector<Made>& made) {
  std::size_t start = 0;
  for (;;) {
    const std::size_t slash = rel.find('/', start);
    const bool last = slash == std::string::npos;
    const std::string prefix = last ? rel : rel.substr(0, slash);
    const bool want_dir = !last || is_dir;
    int fd = open_in_root_nofollow(root_fd, prefix.c_str(), false, want_dir, 0);
    if (fd < 0 && errno == ENOENT) {
      const std::size_t cut = prefix.rfind('/');
      const std::string parent_rel = cut == std::string::npos ? "" : prefix.substr(0, cut);
      const std::string name = cut == std::string::npos ? prefix : prefix.substr(cut + 1);
      UniqueFd parent(parent_rel.empty() ? ::fcntl(root_fd, F_DUPFD_CLOEXEC, 0)
                                         : open_in_root_nofollow(root_fd, parent_rel.c_str(),
                                                                 false, true, 0));
      if (!parent) return -1;
      int rc;
      if (want_dir) {
        rc = ::mkdirat(parent.get(), name.c_str(), 0755);
      } else {
        rc = ::openat(parent.get(), name.c_str(),
                      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (rc >= 0) {
          ::close(rc);
          rc = 0;
        }
      }
      if (rc != 0 && errno != EEXIST) return -1;
      if (rc == 0) made.push_back({std::move(parent), name, want_dir});
      fd = open_in_root_nofollow(root_fd, prefix.c_str(), false, want_dir, 0);
    }
    if (last || fd < 0) return fd;
    ::close(fd);
    start = slash + 1;
  }
}

void remove_made(std::vector<Made>& made) {
  for (auto it = made.rbegin(); it != made.rend(); ++it) {
    (void)::unlinkat(it->parent.get(), it->name.c_str(), it->dir ? AT_REMOVEDIR : 0);
  }
  made.clear();
}

// The start of the helper thread (see host_binds.h): leaves the daemon's mount namespace for
// the box's. Returns the daemon's /proc/self/fd: to detach an attached tree again we name it
// through /proc/self/fd/<tree>, opened before we leave (the box's /proc knows no daemon pid).
Result<UniqueFd> enter_box_mntns(int mntns_fd) {
  UniqueFd proc_fds(::open("/proc/self/fd", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!proc_fds) return fail_errno(errno, "open(/proc/self/fd)");
  // SECURITY: setns(CLONE_NEWNS) needs fs attributes of our own; unsharing them affects only
  // this thread, which never returns to the daemon's work.
  if (::unshare(CLONE_FS) != 0) return fail_errno(errno, "unshare(CLONE_FS)");
  if (::setns(mntns_fd, CLONE_NEWNS) != 0) return fail_errno(errno, "setns(box mount namespace)");
  return proc_fds;
}

// The body of the helper thread once in the box's mount namespace; the thread ends right after.
Result<AttachOutcome> attach_entered(int proc_fds_fd, int root_fd,
                                     std::vector<PreparedBind>& binds) {
  std::vector<Made> made;
  std::vector<UniqueFd> targets;
  AttachOutcome out;
  auto undo_made = [&] {
    targets.clear();
    remove_made(made);
  };
  for (const PreparedBind& b : binds) {
    const std::string rel = b.box_path.substr(1);
    int fd = open_mountpoint(root_fd, rel, b.is_dir, made);
    if (fd < 0) {
      int err = errno;
      undo_made();
      if (err == EROFS) {
        out.not_now = describe(b) + ": its mountpoint cannot be made in the running box (" +
                      std::strerror(err) + ")";
        return out;
      }
      return std::unexpected(
          Error::from_errno(err, describe(b) + ": mountpoint " + b.box_path + " in the box"));
    }
    targets.emplace_back(fd);
  }

  std::size_t attached = 0;
  for (; attached < binds.size(); ++attached) {
    const PreparedBind& b = binds[attached];
    if (::move_mount(b.tree.get(), "", targets[attached].get(), "",
                     MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0) {
      int err = errno;
      // Detach what this call attached, newest first, then drop the mountpoints it made.
      bool detached = ::fchdir(proc_fds_fd) == 0;
      for (std::size_t i = attached; detached && i-- > 0;) {
        const std::string name = std::to_string(binds[i].tree.get());
        detached = ::umount2(name.c_str(), MNT_DETACH) == 0;
      }
      undo_made();
      Error e = Error::from_errno(err, describe(b) + ": move_mount onto " + b.box_path);
      if (!detached) e.message += " (and detaching the mounts attached before it failed)";
      return std::unexpected(std::move(e));
    }
  }
  out.attached = true;
  return out;
}

// attach_session() in its helper thread: the workspace, then the binds one at a time, parents
// first, as the mount plan does (a mountpoint under /workspace or under another bind must be
// made in what is mounted there, not in the dir below it), /tmp's size, and last "/" read-only,
// as box.cc's setup step kRootReadOnly does for a fresh box.
Status attach_session_in_thread(int mntns_fd, int root_fd, SessionMounts& s) {
  UniqueFd proc_fds = AB_TRY(enter_box_mntns(mntns_fd));
  std::vector<PreparedBind> one;
  one.push_back(std::move(s.workspace));
  for (std::size_t i = 0;; ++i) {
    AttachOutcome out = AB_TRY(attach_entered(proc_fds.get(), root_fd, one));
    if (!out.attached) return fail(Code::kUnavailable, out.not_now);
    if (i == s.binds.size()) break;
    one[0] = std::move(s.binds[i]);
  }
  if (s.tmp_bytes != 0) {
    // A reconfigure of the tmpfs's superblock: /proc/self/mountinfo then shows the same
    // options as a /tmp mounted with this size (the pooled box's /tmp is still empty).
    UniqueFd fs(
        ::fspick(root_fd, "tmp", FSPICK_CLOEXEC | FSPICK_SYMLINK_NOFOLLOW | FSPICK_NO_AUTOMOUNT));
    if (!fs) return fail_errno(errno, "fspick(/tmp)");
    const std::string size = std::to_string(s.tmp_bytes);
    if (::fsconfig(fs.get(), FSCONFIG_SET_STRING, "size", size.c_str(), 0) != 0 ||
        ::fsconfig(fs.get(), FSCONFIG_CMD_RECONFIGURE, nullptr, nullptr, 0) != 0) {
      return fail_errno(errno, "reconfigure /tmp (size=" + size + ")");
    }
  }
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  if (::mount_setattr(root_fd, "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) {
    return fail_errno(errno, "make the box's / read-only");
  }
  return {};
}

}  // namespace

namespace {

// prepare_bind() once the target is known to be allowed.
Result<PreparedBind> prepare_tree(const BoxBind& b, uid_t uid, gid_t gid) {
  if (b.host_path.empty() || b.host_path[0] != '/') {
    return fail(Code::kInvalid,
                describe(b) + ": host path '" + b.host_path + "' must be absolute");
  }
  PreparedBind out;
  out.host_path = b.host_path;
  out.box_path = b.box_path;
  out.read_only = b.read_only;
  out.what = b.what;
  UniqueFd src(::open(b.host_path.c_str(), O_PATH | O_CLOEXEC));
  if (!src) return fail_errno(errno, describe(b) + ": open(" + b.host_path + ")");
  struct stat st;
  if (::fstat(src.get(), &st) != 0) return fail_errno(errno, "fstat(" + b.host_path + ")");
  out.is_dir = S_ISDIR(st.st_mode);

  out.tree = UniqueFd(::open_tree(src.get(), "",
                                  OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE |
                                      AT_EMPTY_PATH));
  if (!out.tree) return fail_errno(errno, describe(b) + ": open_tree(" + b.host_path + ")");

  if (!b.read_only && (st.st_uid != uid || st.st_gid != gid)) {
    auto userns = make_idmap_userns({st.st_uid, st.st_gid, uid, gid});
    if (!userns) {
      return std::unexpected(Error{userns.error().code, userns.error().sys_errno,
                                   describe(b) + ": idmap for the session user: " +
                                       userns.error().message});
    }
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_IDMAP;
    attr.userns_fd = static_cast<std::uint64_t>(userns->get());
    if (::mount_setattr(out.tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) !=
        0) {
      const int err = errno;
      std::string why =
          err == ENOSYS ? "this kernel has no mount_setattr (idmapped mounts need Linux 5.12+)"
          : err == EINVAL
              ? "the filesystem (" + filesystem_name(src.get()) +
                    ") does not support idmapped mounts"
              : std::string("mount_setattr(MOUNT_ATTR_IDMAP): ") + std::strerror(err);
      return fail(Code::kInvalid,
                  describe(b) + ": cannot mount " + b.host_path +
                      " read-write for the session user (uid " + std::to_string(uid) +
                      ") without chowning it: " + why +
                      "; mount it \"ro\", or make uid " + std::to_string(uid) + " its owner");
    }
    out.idmapped = true;
  }

  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (b.read_only ? MOUNT_ATTR_RDONLY : 0);
  // SECURITY: the clone is made here, in the daemon's mount namespace: of a shared host mount
  // it is a peer, and would stay one in the box (a mount made on the host beneath it would
  // appear in the box, one attached in the box beneath it on the host). Private, recursively,
  // as prepare_box_workspace and the box's own namespace (box.cc) are.
  attr.propagation = MS_PRIVATE;
  if (::mount_setattr(out.tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) != 0) {
    return fail_errno(errno, describe(b) + ": mount_setattr(" + b.host_path + ")");
  }
  return out;
}

}  // namespace

Result<PreparedBind> prepare_bind(const BoxBind& b, uid_t uid, gid_t gid) {
  // The API's one rule for mount targets (common/validate.h), checked again here for every
  // bind however it got into the spec.
  AB_TRY(validate::mount_target(b.box_path, b.what.empty() ? "mount path" : b.what));
  return prepare_tree(b, uid, gid);
}

Result<PreparedBind> prepare_workspace_bind(const std::string& host_dir, bool read_only, uid_t uid,
                                            gid_t gid) {
  // /workspace itself, which mount_target refuses for every other bind.
  auto p = prepare_tree({host_dir, kBoxWorkspacePath, read_only, "host_path"}, uid, gid);
  if (p && !p->is_dir) {
    return fail(Code::kNotDir, "host_path: " + host_dir + " is not a directory");
  }
  return p;
}

Result<PreparedBind> prepare_box_workspace(const std::string& dir) {
  // As MountPlan::add_bind(dir, "workspace", nosuid|nodev, recursive) does it in the box child.
  PreparedBind out;
  out.host_path = dir;
  out.box_path = kBoxWorkspacePath;
  out.read_only = false;
  out.what = "workspace";
  out.tree = UniqueFd(
      ::open_tree(AT_FDCWD, dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE));
  if (!out.tree) return fail_errno(errno, "workspace: open_tree(" + dir + ")");
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  // SECURITY: cloned here, in the daemon's namespace, a mount of a shared host mount would be
  // its peer; the box child clones from its private copy of the namespace. Private, as there.
  attr.propagation = MS_PRIVATE;
  if (::mount_setattr(out.tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) != 0) {
    return fail_errno(errno, "workspace: mount_setattr(" + dir + ")");
  }
  return out;
}

Result<AttachOutcome> attach_binds(int mntns_fd, int root_fd, std::vector<PreparedBind>& binds) {
  std::stable_sort(binds.begin(), binds.end(), [](const PreparedBind& a, const PreparedBind& b) {
    return a.box_path < b.box_path;
  });
  Result<AttachOutcome> result = fail(Code::kInternal, "attach_binds: helper thread did not run");
  // A fresh thread each time: it leaves the daemon's mount namespace for good.
  std::thread helper([&] {
    auto proc_fds = enter_box_mntns(mntns_fd);
    if (!proc_fds) {
      result = std::unexpected(proc_fds.error());
      return;
    }
    result = attach_entered(proc_fds->get(), root_fd, binds);
  });
  helper.join();
  return result;
}

Status attach_session(int mntns_fd, int root_fd, SessionMounts& session) {
  std::stable_sort(
      session.binds.begin(), session.binds.end(),
      [](const PreparedBind& a, const PreparedBind& b) { return a.box_path < b.box_path; });
  Status result = fail(Code::kInternal, "attach_session: helper thread did not run");
  std::thread helper([&] { result = attach_session_in_thread(mntns_fd, root_fd, session); });
  helper.join();
  return result;
}

}  // namespace agentbox::linux
