#include "linux/mounts.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/paths.h"
#include "common/unique_fd.h"
#include "common/validate.h"
#include "linux/host_binds.h"
#include "linux/pooled_box.h"
#include "linux/sys.h"

namespace agentbox::linux {
namespace {

// The host system directories a box gets read-only. Those missing on the host are skipped; on
// usrmerge systems (Debian 12) most are symlinks into /usr and are recreated as such.
constexpr std::array<std::string_view, 7> kSystemDirs = {"usr",   "bin",   "sbin",  "lib",
                                                         "lib32", "lib64", "libx32"};

// What programs need from the host's /etc, bound read-only when present. Deliberately not the
// whole of /etc: no shadow, no ssh keys, no daemon configs, no /etc/ssl/private, no
// ld.so.preload. passwd, group, hosts, hostname and nsswitch.conf are synthetic (below).
constexpr std::array<std::string_view, 22> kEtcEntries = {
    "ld.so.cache",  "ld.so.conf",    "ld.so.conf.d",       "resolv.conf",   "host.conf",
    "gai.conf",     "localtime",     "timezone",           "protocols",     "services",
    "ssl/certs",    "ssl/openssl.cnf", "ca-certificates",  "ca-certificates.conf",
    "alternatives", "os-release",    "debian_version",     "mime.types",    "bash.bashrc",
    "profile",      "inputrc",       "perl"};
// Prefixes of /etc entries taken too (Debian's python keeps sitecustomize there).
constexpr std::array<std::string_view, 1> kEtcPrefixes = {"python3"};

constexpr std::array<std::string_view, 6> kDevNodes = {"null", "zero", "full",
                                                       "random", "urandom", "tty"};
// procfs entries made read-only on top of the fresh /proc (docker's list). Commands run without
// capabilities anyway; this is depth.
constexpr std::array<std::string_view, 5> kProcReadOnly = {"sys", "sysrq-trigger", "bus", "irq",
                                                           "fs"};

constexpr std::uint64_t kRo = kAttrRdonly | kAttrNosuid | kAttrNodev;

std::string join(const std::string& root, std::string_view rel) {
  std::string out = root;
  if (out.empty() || out.back() != '/') out += '/';
  out += rel;
  return out;
}


std::string passwd_file(const BoxFsSpec& spec, const std::string& shell) {
  return "root:x:0:0:root:/root:/usr/sbin/nologin\n" + std::string(kBoxUserName) + ":x:" +
         std::to_string(spec.uid) + ":" + std::to_string(spec.gid) + ":agentbox:" +
         kBoxWorkspacePath + ":" + shell +
         "\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
}

std::string group_file(const BoxFsSpec& spec) {
  return "root:x:0:\n" + std::string(kBoxUserName) + ":x:" + std::to_string(spec.gid) +
         ":\nnogroup:x:65534:\n";
}

std::string hosts_file(const BoxFsSpec& spec) {
  return "127.0.0.1\tlocalhost\n127.0.1.1\t" + spec.hostname +
         "\n::1\tlocalhost ip6-localhost ip6-loopback\n";
}

// Only the "files" sources: the host's NSS modules (sss, systemd, ldap) have no business in a box.
constexpr std::string_view kNsswitch =
    "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
    "protocols: files\nservices: files\nethers: files\nrpc: files\n";

// One /etc entry: a symlink into /usr stays a symlink (e.g. localtime -> /usr/share/zoneinfo/..,
// os-release -> ../usr/lib/os-release); anything else is bound read-only from what it resolves
// to on the host (e.g. resolv.conf -> /run/systemd/resolve/stub-resolv.conf, invisible in the box).
void plan_etc_entry(MountPlan& plan, const std::string& host_root, std::string_view name) {
  const std::string host = join(host_root, "etc/" + std::string(name));
  const std::string target = "etc/" + std::string(name);
  struct stat st;
  if (::lstat(host.c_str(), &st) != 0) return;
  if (S_ISLNK(st.st_mode)) {
    char real[PATH_MAX];
    if (::realpath(host.c_str(), real) == nullptr) return;  // dangling: skip
    std::string resolved = real;
    const std::string usr = join(host_root, "usr");
    if (paths::at_or_under(resolved, usr)) {
      char link[PATH_MAX];
      ssize_t n = ::readlink(host.c_str(), link, sizeof link - 1);
      if (n <= 0) return;
      plan.add_symlink(target, std::string(link, static_cast<std::size_t>(n)));
      return;
    }
    if (::stat(real, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
      plan.add_dir(target, 0755);
    } else if (S_ISREG(st.st_mode)) {
      plan.add_mountpoint(target);
    } else {
      return;
    }
    plan.add_bind(resolved, target, kRo, true);
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    plan.add_dir(target, 0755);
  } else if (S_ISREG(st.st_mode)) {
    plan.add_mountpoint(target);
  } else {
    return;
  }
  plan.add_bind(host, target, kRo, true);
}

// ---- child side: raw syscalls only -------------------------------------------------------------

void close_keep_errno(int fd) {
  int saved = errno;
  ::close(fd);
  errno = saved;
}

int do_bind(const MountOp& op, int root_fd) {
  if (op.tree_fd >= 0) {
    int target = open_in_root_nofollow(root_fd, op.target, false, false, 0);
    if (target < 0) return errno;
    int rc = ::move_mount(op.tree_fd, "", target, "",
                          MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH);
    int err = rc == 0 ? 0 : errno;
    ::close(target);
    return err;
  }
  const bool host = op.source[0] == '/';
  unsigned tree_flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (op.recursive ? AT_RECURSIVE : 0);
  int tree = ::open_tree(host ? AT_FDCWD : root_fd, op.source, tree_flags);
  if (tree < 0) return errno;
  if (op.attrs != 0) {
    mount_attr attr{};
    attr.attr_set = op.attrs;
    if (::mount_setattr(tree, "", AT_EMPTY_PATH | (op.recursive ? AT_RECURSIVE : 0), &attr,
                        sizeof attr) != 0) {
      int err = errno;
      ::close(tree);
      return err;
    }
  }
  int target = open_in_root_nofollow(root_fd, op.target, false, false, 0);
  if (target < 0) {
    int err = errno;
    ::close(tree);
    return err;
  }
  int rc = ::move_mount(tree, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH);
  int err = rc == 0 ? 0 : errno;
  ::close(target);
  ::close(tree);
  return err;
}

// fsopen + one fsconfig per "k=v" or "flag" option + fsmount + move_mount.
int do_fs(const MountOp& op, int root_fd) {
  int fs = ::fsopen(op.source, FSOPEN_CLOEXEC);
  if (fs < 0) return errno;
  // The "source" shown in /proc/mounts (the old mount(2) API's first argument).
  if (::fsconfig(fs, FSCONFIG_SET_STRING, "source", op.source, 0) != 0) {
    int err = errno;
    ::close(fs);
    return err;
  }
  char opts[256];
  if (op.data_len >= sizeof opts) {
    ::close(fs);
    return ENAMETOOLONG;
  }
  std::memcpy(opts, op.data, op.data_len);
  opts[op.data_len] = '\0';
  char* p = opts;
  while (*p != '\0') {
    char* key = p;
    char* comma = std::strchr(p, ',');
    if (comma != nullptr) {
      *comma = '\0';
      p = comma + 1;
    } else {
      p += std::strlen(p);
    }
    char* eq = std::strchr(key, '=');
    int rc;
    if (eq != nullptr) {
      *eq = '\0';
      rc = ::fsconfig(fs, FSCONFIG_SET_STRING, key, eq + 1, 0);
    } else {
      rc = ::fsconfig(fs, FSCONFIG_SET_FLAG, key, nullptr, 0);
    }
    if (rc != 0) {
      int err = errno;
      ::close(fs);
      return err;
    }
  }
  if (::fsconfig(fs, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
    int err = errno;
    ::close(fs);
    return err;
  }
  int mnt = ::fsmount(fs, FSMOUNT_CLOEXEC, static_cast<unsigned>(op.attrs));
  int err = mnt < 0 ? errno : 0;
  ::close(fs);
  if (mnt < 0) return err;
  int target = open_in_root_nofollow(root_fd, op.target, false, true, 0);
  if (target < 0) {
    err = errno;
    ::close(mnt);
    return err;
  }
  int rc = ::move_mount(mnt, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH);
  err = rc == 0 ? 0 : errno;
  ::close(target);
  ::close(mnt);
  return err;
}

// Splits `rel` into (parent fd, last component) with the parent opened by
// open_in_root_nofollow. Returns the parent fd (caller closes) or -1; *name points into buf.
int open_parent(int root_fd, const char* rel, bool create_dirs, char (&buf)[PATH_MAX],
                const char** name) {
  std::size_t len = std::strlen(rel);
  if (len == 0 || len >= PATH_MAX) {
    errno = EINVAL;
    return -1;
  }
  std::memcpy(buf, rel, len + 1);
  char* slash = std::strrchr(buf, '/');
  if (slash == nullptr) {
    *name = buf;
    int fd = ::fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
    return fd;
  }
  *slash = '\0';
  *name = slash + 1;
  return open_in_root_nofollow(root_fd, buf, create_dirs, true, 0755);
}

int do_file(const MountOp& op, int root_fd, bool exclusive) {
  char buf[PATH_MAX];
  const char* name = nullptr;
  int parent = open_parent(root_fd, op.target, true, buf, &name);
  if (parent < 0) return errno;
  if (op.replace) (void)::unlinkat(parent, name, 0);
  int flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (exclusive ? O_EXCL : 0);
  int fd = ::openat(parent, name, flags, exclusive ? op.mode : 0644);
  int err = fd < 0 ? errno : 0;
  close_keep_errno(parent);
  if (fd < 0) return err;
  const char* p = op.data;
  std::size_t left = exclusive ? op.data_len : 0;
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      ::close(fd);
      return err;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  ::close(fd);
  return 0;
}

int do_symlink(const MountOp& op, int root_fd) {
  char buf[PATH_MAX];
  const char* name = nullptr;
  int parent = open_parent(root_fd, op.target, true, buf, &name);
  if (parent < 0) return errno;
  if (op.replace) (void)::unlinkat(parent, name, 0);
  int rc = ::symlinkat(op.source, parent, name);
  int err = rc == 0 ? 0 : errno;
  ::close(parent);
  return err;
}

}  // namespace

// ---- MountPlan -------------------------------------------------------------------------------

const char* MountPlan::keep(std::string s) {
  strings_.push_back(std::move(s));
  return strings_.back().c_str();
}

void MountPlan::add_dir(std::string target, std::uint32_t mode) {
  MountOp op;
  op.kind = MountOp::Kind::kDir;
  op.target = keep(std::move(target));
  op.mode = mode;
  ops_.push_back(op);
}

void MountPlan::add_file(std::string target, std::string contents, std::uint32_t mode) {
  MountOp op;
  op.kind = MountOp::Kind::kFile;
  op.target = keep(std::move(target));
  op.data_len = contents.size();
  op.data = keep(std::move(contents));
  op.mode = mode;
  ops_.push_back(op);
}

void MountPlan::add_mountpoint(std::string target) {
  MountOp op;
  op.kind = MountOp::Kind::kMountpoint;
  op.target = keep(std::move(target));
  ops_.push_back(op);
}

void MountPlan::mark_replace(std::size_t from) {
  for (std::size_t i = from; i < ops_.size(); ++i) ops_[i].replace = true;
}

void MountPlan::add_symlink(std::string target, std::string link_text) {
  MountOp op;
  op.kind = MountOp::Kind::kSymlink;
  op.target = keep(std::move(target));
  op.source = keep(std::move(link_text));
  ops_.push_back(op);
}

void MountPlan::add_bind(std::string source, std::string target, std::uint64_t attrs,
                         bool recursive) {
  MountOp op;
  op.kind = MountOp::Kind::kBind;
  op.source = keep(std::move(source));
  op.target = keep(std::move(target));
  op.attrs = attrs;
  op.recursive = recursive;
  ops_.push_back(op);
}

void MountPlan::add_fs(std::string fstype, std::string target, std::string options,
                       std::uint64_t attrs) {
  MountOp op;
  op.kind = MountOp::Kind::kFs;
  op.source = keep(std::move(fstype));
  op.target = keep(std::move(target));
  op.data_len = options.size();
  op.data = keep(std::move(options));
  op.attrs = attrs;
  ops_.push_back(op);
}

void MountPlan::add_tree(UniqueFd tree, std::string source, std::string target,
                         std::uint64_t attrs, bool idmapped) {
  MountOp op;
  op.kind = MountOp::Kind::kBind;
  op.source = keep(std::move(source));
  op.target = keep(std::move(target));
  op.attrs = attrs;
  op.recursive = true;
  op.tree_fd = tree.get();
  op.idmapped = idmapped;
  trees_.push_back(std::move(tree));
  ops_.push_back(op);
}

std::string MountPlan::describe(std::size_t index) const {
  if (index >= ops_.size()) return "mount step #" + std::to_string(index);
  const MountOp& op = ops_[index];
  const std::string target = std::string("/") + op.target;
  auto attrs = [&op] {
    std::string s;
    if (op.attrs & kAttrRdonly) s += "ro,";
    if (op.attrs & kAttrNosuid) s += "nosuid,";
    if (op.attrs & kAttrNodev) s += "nodev,";
    if (op.attrs & kAttrNoexec) s += "noexec,";
    if (op.idmapped) s += "idmapped,";
    if (!s.empty()) s.pop_back();
    return s.empty() ? std::string("rw") : s;
  };
  switch (op.kind) {
    case MountOp::Kind::kDir:
      return "mkdir " + target;
    case MountOp::Kind::kFile:
      return "write " + target;
    case MountOp::Kind::kMountpoint:
      return "create mountpoint " + target;
    case MountOp::Kind::kSymlink:
      return "symlink " + target + " -> " + op.source;
    case MountOp::Kind::kBind:
      return std::string("bind ") + (op.source[0] == '/' ? "" : "/") + op.source + " on " +
             target + " (" + attrs() + ")";
    case MountOp::Kind::kFs:
      return std::string("mount ") + op.source + " on " + target + " (" + op.data + ")";
  }
  return "mount step #" + std::to_string(index);
}

// ---- planning ----------------------------------------------------------------------------------

bool host_path_seen_in_box(const std::string& path, const std::vector<std::string>& readonly_dirs) {
  auto under = [](std::string_view p, std::string_view root) {
    while (root.size() > 1 && root.back() == '/') root.remove_suffix(1);
    return p == root || (p.size() > root.size() && p.starts_with(root) &&
                         (root == "/" || p[root.size()] == '/'));
  };
  auto seen = [&](const std::string& p) {
    for (std::string_view d : kSystemDirs) {
      if (under(p, "/" + std::string(d))) return true;
    }
    return std::any_of(readonly_dirs.begin(), readonly_dirs.end(),
                       [&](const std::string& r) { return under(p, r); });
  };
  if (seen(path)) return true;
  char real[PATH_MAX];
  return ::realpath(path.c_str(), real) != nullptr && seen(real);
}

std::string box_passwd_file(const BoxFsSpec& spec) {
  struct stat st;
  // An image root's own shell is not the host's: /bin/sh is in every image.
  const std::string shell =
      !spec.image_root && ::stat(join(spec.host_root, "bin/bash").c_str(), &st) == 0 ? "/bin/bash"
                                                                                    : "/bin/sh";
  return passwd_file(spec, shell);
}

std::string box_group_file(const BoxFsSpec& spec) {
  return group_file(spec);
}

namespace {

// plan_box_fs, or with `pooled` plan_pooled_box_fs (pooled_box.h).
Result<MountPlan> plan_fs(const BoxFsSpec& spec, bool pooled) {
  MountPlan plan;
  const std::string& hr = spec.host_root;

  // System directories: read-only, nosuid, nodev (an image root has its own).
  for (std::string_view d : kSystemDirs) {
    if (spec.image_root) break;
    const std::string host = join(hr, d);
    struct stat st;
    if (::lstat(host.c_str(), &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      char link[PATH_MAX];
      ssize_t n = ::readlink(host.c_str(), link, sizeof link - 1);
      if (n <= 0) continue;
      plan.add_symlink(std::string(d), std::string(link, static_cast<std::size_t>(n)));
    } else if (S_ISDIR(st.st_mode)) {
      plan.add_dir(std::string(d), 0755);
      plan.add_bind(host, std::string(d), kRo, true);
    }
  }

  // /etc: synthetic identity files, then the curated host entries.
  struct stat st;
  plan.add_dir("etc", 0755);
  const std::size_t first_etc = plan.ops().size();
  plan.add_file("etc/passwd", box_passwd_file(spec), 0644);
  plan.add_file("etc/group", box_group_file(spec), 0644);
  plan.add_file("etc/hosts", hosts_file(spec), 0644);
  plan.add_file("etc/hostname", spec.hostname + "\n", 0644);
  plan.add_file("etc/nsswitch.conf", std::string(kNsswitch), 0644);
  plan.add_symlink("etc/mtab", "../proc/self/mounts");
  if (spec.image_root) plan.mark_replace(first_etc);
  if (spec.image_root) {
    // The image's own /etc otherwise (its loader cache, certs, ...): nothing of the host's.
  } else {
    for (std::string_view e : kEtcEntries) plan_etc_entry(plan, hr, e);
  }
  if (UniqueFd etc(spec.image_root
                       ? -1
                       : ::open(join(hr, "etc").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      etc) {
    if (auto names = sys::list_names(etc.get(), join(hr, "etc")); names) {
      for (const std::string& n : *names) {
        for (std::string_view prefix : kEtcPrefixes) {
          if (n.starts_with(prefix)) plan_etc_entry(plan, hr, n);
        }
      }
    }
  }

  // /workspace: the session's files, read-write but never setuid or device nodes. A pooled box
  // has only the mountpoint; it gets them (and its binds) when it is bound to its session.
  plan.add_dir("workspace", 0755);
  if (!pooled) {
    if (spec.workspace_dir.empty() || spec.workspace_dir[0] != '/') {
      return fail(Code::kInvalid, "workspace dir '" + spec.workspace_dir + "' must be absolute");
    }
    if (::stat(spec.workspace_dir.c_str(), &st) != 0) {
      return fail_errno(errno, "stat(" + spec.workspace_dir + ")");
    }
    if (!S_ISDIR(st.st_mode)) {
      return fail(Code::kNotDir, "workspace " + spec.workspace_dir + " is not a directory");
    }
    if (spec.workspace_on_host) {
      PreparedBind p = AB_TRY(
          prepare_workspace_bind(spec.workspace_dir, spec.workspace_read_only, spec.uid, spec.gid));
      plan.add_tree(std::move(p.tree), spec.workspace_dir, "workspace",
                    spec.workspace_read_only ? kRo : (kAttrNosuid | kAttrNodev), p.idmapped);
    } else {
      plan.add_bind(spec.workspace_dir, "workspace", kAttrNosuid | kAttrNodev, true);
    }
  }

  // /tmp: capped in bytes and inodes so a box cannot fill the host's memory.
  plan.add_dir("tmp", 01777);
  plan.add_fs("tmpfs", "tmp",
              "size=" + std::to_string(spec.tmp_bytes) +
                  ",nr_inodes=" + std::to_string(spec.tmp_inodes) + ",mode=1777",
              kAttrNosuid | kAttrNodev);

  // /cache (seed 004): package caches, capped like /tmp and outside the workspace's quota.
  if (spec.cache_bytes != 0) {
    plan.add_dir("cache", 01777);
    plan.add_fs("tmpfs", "cache",
                "size=" + std::to_string(spec.cache_bytes) +
                    ",nr_inodes=" + std::to_string(spec.cache_inodes) + ",mode=1777",
                kAttrNosuid | kAttrNodev);
  }

  // /mnt: a small tmpfs for mountpoints. The root is read-only once the box runs, so a mount
  // added to a running box at /mnt/x needs a writable parent to make x in (host_binds.h).
  // The daemon's (0755): the session user makes nothing there.
  plan.add_dir("mnt", 0755);
  plan.add_fs("tmpfs", "mnt", "size=1048576,nr_inodes=1024,mode=0755",
              kAttrNosuid | kAttrNodev | kAttrNoexec);

  // /proc: the box's own pid namespace (mounted by its pid 1).
  plan.add_dir("proc", 0555);
  plan.add_fs("proc", "proc", "", kAttrNosuid | kAttrNodev | kAttrNoexec);
  for (std::string_view e : kProcReadOnly) {
    if (::access(("/proc/" + std::string(e)).c_str(), F_OK) != 0) continue;
    plan.add_bind("proc/" + std::string(e), "proc/" + std::string(e), kRo, true);
  }

  // /dev: nodev on the tmpfs itself, so a device node created there is useless; the few real
  // nodes are separate bind mounts, which keep their own (device-allowing) flags.
  plan.add_dir("dev", 0755);
  plan.add_fs("tmpfs", "dev", "size=65536,nr_inodes=64,mode=0755",
              kAttrNosuid | kAttrNodev | kAttrNoexec);
  for (std::string_view n : kDevNodes) {
    const std::string host = join(hr, "dev/" + std::string(n));
    if (::stat(host.c_str(), &st) != 0 || !S_ISCHR(st.st_mode)) continue;
    plan.add_mountpoint("dev/" + std::string(n));
    plan.add_bind(host, "dev/" + std::string(n), kAttrNosuid | kAttrNoexec, false);
  }
  plan.add_dir("dev/pts", 0755);
  plan.add_fs("devpts", "dev/pts", "newinstance,ptmxmode=0666,mode=0620",
              kAttrNosuid | kAttrNoexec);
  plan.add_symlink("dev/ptmx", "pts/ptmx");
  plan.add_dir("dev/shm", 01777);
  plan.add_fs("tmpfs", "dev/shm",
              "size=" + std::to_string(spec.shm_bytes) + ",nr_inodes=4096,mode=1777",
              kAttrNosuid | kAttrNodev);
  plan.add_symlink("dev/fd", "/proc/self/fd");
  plan.add_symlink("dev/stdin", "/proc/self/fd/0");
  plan.add_symlink("dev/stdout", "/proc/self/fd/1");
  plan.add_symlink("dev/stderr", "/proc/self/fd/2");

  // Extra binds last (they may live under /workspace or /tmp), parents before children.
  std::vector<BoxBind> binds = pooled ? std::vector<BoxBind>() : spec.binds;
  std::sort(binds.begin(), binds.end(),
            [](const BoxBind& a, const BoxBind& b) { return a.box_path < b.box_path; });
  for (const BoxBind& b : binds) {
    // Checked (target rules, host path) and prepared here, in the daemon: a rw bind is
    // idmapped for the session user, or fails now naming itself (host_binds.h).
    PreparedBind p = AB_TRY(prepare_bind(b, spec.uid, spec.gid));
    const std::string target = b.box_path.substr(1);
    if (p.is_dir) {
      plan.add_dir(target, 0755);
    } else {
      plan.add_mountpoint(target);
    }
    plan.add_tree(std::move(p.tree), b.host_path, target,
                  b.read_only ? kRo : (kAttrNosuid | kAttrNodev), p.idmapped);
  }
  return plan;
}

}  // namespace

Result<MountPlan> plan_box_fs(const BoxFsSpec& spec) {
  return plan_fs(spec, false);
}

Result<MountPlan> plan_pooled_box_fs(const BoxFsSpec& spec) {
  return plan_fs(spec, true);
}

// ---- applying (child side) ---------------------------------------------------------------------

int open_in_root_nofollow(int root_fd, const char* rel, bool create_dirs, bool want_dir,
                          std::uint32_t mode) noexcept {
  char buf[PATH_MAX];
  std::size_t len = std::strlen(rel);
  if (len >= sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  std::memcpy(buf, rel, len + 1);
  // SECURITY: every component is opened on its own with RESOLVE_NO_SYMLINKS (a symlink anywhere
  // fails with ELOOP) and RESOLVE_BENEATH (no "..", no absolute jumps).
  constexpr std::uint64_t kResolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH;
  int cur = root_fd;
  char* p = buf;
  while (*p != '\0') {
    char* comp = p;
    char* slash = std::strchr(p, '/');
    bool last = slash == nullptr;
    if (!last) {
      *slash = '\0';
      p = slash + 1;
    } else {
      p += std::strlen(p);
    }
    if (*comp == '\0') continue;
    const bool dir = !last || want_dir;
    std::uint64_t flags = O_PATH | O_CLOEXEC | (dir ? O_DIRECTORY : 0);
    int fd = sys::openat2_raw(cur, comp, flags, kResolve);
    if (fd < 0 && errno == ENOENT && create_dirs && dir) {
      if (::mkdirat(cur, comp, mode) != 0 && errno != EEXIST) {
        if (cur != root_fd) close_keep_errno(cur);
        return -1;
      }
      fd = sys::openat2_raw(cur, comp, flags, kResolve);
    }
    if (cur != root_fd) close_keep_errno(cur);
    if (fd < 0) return -1;
    cur = fd;
  }
  if (cur == root_fd) return ::fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
  return cur;
}

int apply_mount_plan(const MountPlan& plan, int root_fd, std::size_t* failed_op) noexcept {
  const std::vector<MountOp>& ops = plan.ops();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const MountOp& op = ops[i];
    int err = 0;
    switch (op.kind) {
      case MountOp::Kind::kDir: {
        int fd = open_in_root_nofollow(root_fd, op.target, true, true, op.mode);
        if (fd < 0) {
          err = errno;
        } else {
          ::close(fd);
        }
        break;
      }
      case MountOp::Kind::kFile:
        err = do_file(op, root_fd, true);
        break;
      case MountOp::Kind::kMountpoint:
        err = do_file(op, root_fd, false);
        break;
      case MountOp::Kind::kSymlink:
        err = do_symlink(op, root_fd);
        break;
      case MountOp::Kind::kBind:
        err = do_bind(op, root_fd);
        break;
      case MountOp::Kind::kFs:
        err = do_fs(op, root_fd);
        break;
    }
    if (err != 0) {
      *failed_op = i;
      return err;
    }
  }
  return 0;
}

}  // namespace agentbox::linux
