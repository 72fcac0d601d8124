#include "linux/quota_disk.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/unique_fd.h"
#include "linux/sys.h"

extern char** environ;

namespace agentbox::linux {
namespace {

// ext4 needs room for its metadata and journal; below this a "disk" would be mostly overhead.
constexpr std::uint64_t kMinBytes = 8ull << 20;

Result<bool> dir_is_empty(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return fail_errno(errno, "opendir(" + path + ")");
  bool empty = true;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      empty = false;
      break;
    }
  }
  ::closedir(d);
  return empty;
}

// Runs mkfs.ext4 on the image; its output goes to a pipe and is quoted in the error.
Status format_ext4(const QuotaDiskSpec& spec) {
  const char* mkfs = nullptr;
  for (const char* p : {"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"}) {
    if (::access(p, X_OK) == 0) {
      mkfs = p;
      break;
    }
  }
  if (mkfs == nullptr) return fail(Code::kUnavailable, "mkfs.ext4 not found (install e2fsprogs)");
  // -m 0: no blocks reserved for root (nobody is root in a box); root_owner: the session user
  // owns the workspace; nodiscard: the image is fresh and sparse already.
  std::string opts = "root_owner=" + std::to_string(spec.uid) + ":" + std::to_string(spec.gid) +
                     ",nodiscard";
  std::vector<std::string> args = {mkfs, "-q", "-F", "-m", "0", "-E", opts, spec.image_path};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  auto pipe = sys::pipe();
  if (!pipe) return std::unexpected(std::move(pipe.error()));
  UniqueFd rd = std::move(pipe->read), wr = std::move(pipe->write);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), 1);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), 2);
  pid_t pid = -1;
  int err = ::posix_spawn(&pid, mkfs, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  wr.reset();
  if (err != 0) return fail_errno(err, std::string("spawn ") + mkfs);
  std::string out;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(rd.get(), buf, sizeof buf);
    if (n > 0 && out.size() < 4096) out.append(buf, static_cast<std::size_t>(n));
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return fail(Code::kInternal, "mkfs.ext4 " + spec.image_path + " failed: " + out);
  }
  return {};
}

struct Loop {
  std::string path;
  UniqueFd fd;  // keep open until mounted: with AUTOCLEAR, the last close would free the device
};

// Attaches `image_fd` to a free loop device. The device frees itself when its last user (the
// mount, once our fd is closed) lets go (LO_FLAGS_AUTOCLEAR).
Result<Loop> attach_loop(int image_fd, const std::string& image_path) {
  UniqueFd ctl(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!ctl) return fail_errno(errno, "open(/dev/loop-control) (loop devices are needed for disk_mb)");
  // Another process may take the device we were offered before we configure it: retry.
  for (int attempt = 0; attempt < 16; ++attempt) {
    int n = ::ioctl(ctl.get(), LOOP_CTL_GET_FREE);
    if (n < 0) return fail_errno(errno, "LOOP_CTL_GET_FREE");
    std::string dev = "/dev/loop" + std::to_string(n);
    UniqueFd loop(::open(dev.c_str(), O_RDWR | O_CLOEXEC));
    if (!loop && errno == ENOENT) {
      // A container's /dev may lack nodes the kernel created after it was populated.
      if (::mknod(dev.c_str(), S_IFBLK | 0600, ::makedev(7, static_cast<unsigned>(n))) != 0 &&
          errno != EEXIST) {
        return fail_errno(errno, "mknod(" + dev + ")");
      }
      loop = UniqueFd(::open(dev.c_str(), O_RDWR | O_CLOEXEC));
    }
    if (!loop) return fail_errno(errno, "open(" + dev + ")");
    loop_config cfg{};
    cfg.fd = static_cast<__u32>(image_fd);
    cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
    std::strncpy(reinterpret_cast<char*>(cfg.info.lo_file_name), image_path.c_str(),
                 LO_NAME_SIZE - 1);
    if (::ioctl(loop.get(), LOOP_CONFIGURE, &cfg) == 0) return Loop{dev, std::move(loop)};
    if (errno != EBUSY) return fail_errno(errno, "LOOP_CONFIGURE(" + dev + ")");
  }
  return fail(Code::kUnavailable, "no free loop device after 16 attempts");
}

}  // namespace

Result<bool> is_mount_root(const std::string& path) {
  struct statx stx {};
  if (::statx(AT_FDCWD, path.c_str(), AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &stx) != 0) {
    return fail_errno(errno, "statx(" + path + ")");
  }
  if ((stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) == 0) {
    return fail(Code::kUnavailable, "statx: no STATX_ATTR_MOUNT_ROOT (Linux 5.8+)");
  }
  return (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
}

Status attach_quota_disk(const QuotaDiskSpec& spec) {
  if (spec.bytes < kMinBytes) {
    return fail(Code::kInvalid, "limits.disk_mb must be at least " +
                                    std::to_string(kMinBytes >> 20) + " (got " +
                                    std::to_string(spec.bytes >> 20) + ")");
  }
  auto mounted = is_mount_root(spec.mountpoint);
  if (!mounted) return std::unexpected(mounted.error());
  if (*mounted) return {};  // attached before (e.g. by the daemon before a restart)

  // SECURITY: mounting over a directory that has files would hide them (and a later detach would
  // bring them back); a workspace gets its disk when it is new, and keeps it.
  auto empty = dir_is_empty(spec.mountpoint);
  if (!empty) return std::unexpected(empty.error());

  bool fresh = false;
  UniqueFd image(::open(spec.image_path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!image && errno == ENOENT) {
    if (!*empty) {
      return fail(Code::kExists, "workspace " + spec.mountpoint +
                                       " already has files; disk_mb applies to new workspaces");
    }
    image = UniqueFd(
        ::open(spec.image_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!image) return fail_errno(errno, "create(" + spec.image_path + ")");
    fresh = true;
    // Sparse: the host pays only for what the session writes.
    if (::ftruncate(image.get(), static_cast<off_t>(spec.bytes)) != 0) {
      int err = errno;
      ::unlink(spec.image_path.c_str());
      return fail_errno(err, "ftruncate(" + spec.image_path + ")");
    }
    if (auto st = format_ext4(spec); !st) {
      ::unlink(spec.image_path.c_str());
      return st;
    }
  } else if (!image) {
    return fail_errno(errno, "open(" + spec.image_path + ")");
  } else if (!*empty) {
    return fail(Code::kExists, "workspace " + spec.mountpoint +
                                     " has files beside its disk image; refusing to hide them");
  }

  auto loop = attach_loop(image.get(), spec.image_path);
  if (!loop) {
    if (fresh) ::unlink(spec.image_path.c_str());
    return std::unexpected(loop.error());
  }
  // The mount holds the loop device from here; closing loop->fd (at scope end) leaves the mount
  // as its only user, so AUTOCLEAR frees the device when the mount goes.
  if (::mount(loop->path.c_str(), spec.mountpoint.c_str(), "ext4",
              MS_NOSUID | MS_NODEV | MS_NOATIME, nullptr) != 0) {
    int err = errno;
    if (fresh) ::unlink(spec.image_path.c_str());
    return fail_errno(err, "mount(" + loop->path + " on " + spec.mountpoint + ")");
  }
  if (fresh) {
    // The agent's workspace starts empty: no lost+found (e2fsck recreates it when it needs one).
    (void)::rmdir((spec.mountpoint + "/lost+found").c_str());
    // Like a plain workspace directory: the session user's, private.
    if (::chmod(spec.mountpoint.c_str(), 0700) != 0) {
      return fail_errno(errno, "chmod(" + spec.mountpoint + ")");
    }
  }
  return {};
}

Status unmount_quota_disk(const std::string& mountpoint) {
  auto mounted = is_mount_root(mountpoint);
  if (mounted && *mounted && ::umount2(mountpoint.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0) {
    return fail_errno(errno, "umount(" + mountpoint + ")");
  }
  return {};
}

Status detach_quota_disk(const std::string& mountpoint, const std::string& image_path) {
  if (auto st = unmount_quota_disk(mountpoint); !st) return st;
  if (::unlink(image_path.c_str()) != 0 && errno != ENOENT) {
    return fail_errno(errno, "unlink(" + image_path + ")");
  }
  return {};
}

}  // namespace agentbox::linux
