#include "linux/idmap.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "linux/internal/clone_args.h"
#include "linux/sys.h"

namespace agentbox::linux {
namespace {

using detail::CloneArgs;

// The helper child: kill it (if still there) and reap it, whatever happened.
class Helper {
 public:
  Helper(pid_t pid, int pidfd) : pid_(pid), pidfd_(pidfd) {}
  ~Helper() {
    (void)::syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGKILL, nullptr, 0);
    siginfo_t info{};
    while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info,
                    WEXITED | __WALL) != 0 &&
           errno == EINTR) {
    }
  }
  Helper(const Helper&) = delete;
  Helper& operator=(const Helper&) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
  UniqueFd pidfd_;
};

// Writes the map's lines "<disk> <seen> <count>" (one write: the kernel takes a map once).
// With `owner`, seen ids 0 and owner are swapped (make_idmap_userns with an owner).
Status write_map(pid_t pid, const char* file, unsigned long disk, unsigned long seen,
                 unsigned long count = 1, unsigned long owner = 0) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/%s", static_cast<int>(pid), file);
  struct Extent {
    unsigned long disk, seen, count;
  };
  std::vector<Extent> extents;
  if (owner == 0) {
    extents = {{disk, seen, count}};
  } else {
    extents = {{disk, seen + owner, 1},
               {disk + 1, seen + 1, owner - 1},
               {disk + owner, seen, 1},
               {disk + owner + 1, seen + owner + 1, count - owner - 1}};
  }
  char lines[256];
  int len = 0;
  for (const Extent& e : extents) {
    if (e.count == 0) continue;
    len += std::snprintf(lines + len, sizeof lines - static_cast<std::size_t>(len), "%lu %lu %lu\n",
                         e.disk, e.seen, e.count);
  }
  UniqueFd fd(::open(path, O_WRONLY | O_CLOEXEC));
  if (!fd) return fail_errno(errno, std::string("open(") + path + ")");
  ssize_t n = ::write(fd.get(), lines, static_cast<std::size_t>(len));
  if (n != len) return fail_errno(n < 0 ? errno : EIO, std::string("write(") + path + ")");
  return {};
}

}  // namespace

Result<UniqueFd> make_idmap_userns(const IdMap& map) {
  return make_idmap_userns(map, 1);
}

Result<UniqueFd> make_idmap_userns(const IdMap& map, std::uint32_t count) {
  return make_idmap_userns(map, count, 0);
}

Result<UniqueFd> make_idmap_userns(const IdMap& map, std::uint32_t count, std::uint32_t owner) {
  if (owner != 0 && owner >= count) {
    return fail(Code::kInvalid, "idmap: owner id " + std::to_string(owner) +
                                    " outside the mapped range of " + std::to_string(count));
  }
  Pipe wait = AB_TRY(sys::pipe(/*above_stdio=*/true));
  const int wait_r = wait.read.get();
  const int wait_w = wait.write.get();

  int pidfd = -1;
  CloneArgs ca{};
  ca.flags = CLONE_NEWUSER | CLONE_PIDFD;
  ca.pidfd = reinterpret_cast<std::uintptr_t>(&pidfd);
  // No exit signal: a SIGCHLD-driven waitpid(-1) elsewhere must not reap it; Helper reaps it
  // through its pidfd.
  ca.exit_signal = 0;
  long pid;
  {
    // The child runs with every signal blocked (only SIGKILL, from Helper, ends it early): none
    // of the daemon's handlers may run in it.
    sigset_t all;
    sigset_t old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    pid = ::syscall(SYS_clone3, &ca, sizeof ca);
    if (pid == 0) {
      // Child: async-signal-safe only. Wait until the daemon has written the maps and opened
      // the namespace (it closes the pipe), then go.
      ::close(wait_w);
      char c;
      while (::read(wait_r, &c, 1) < 0 && errno == EINTR) {
      }
      _exit(0);
    }
    int saved = errno;
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    errno = saved;
  }
  if (pid < 0) return fail_errno(errno, "clone3(CLONE_NEWUSER) for a mount idmap");
  Helper helper(static_cast<pid_t>(pid), pidfd);

  AB_TRY(write_map(helper.pid(), "uid_map", map.disk_uid, map.seen_uid, count, owner));
  AB_TRY(write_map(helper.pid(), "gid_map", map.disk_gid, map.seen_gid, count, owner));
  const std::string ns = "/proc/" + std::to_string(helper.pid()) + "/ns/user";
  UniqueFd fd(::open(ns.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return fail_errno(errno, "open(" + ns + ")");
  return fd;  // ~Helper ends and reaps the child; the fd keeps the namespace
}

std::string filesystem_name(int fd) {
  struct statfs st;
  if (::fstatfs(fd, &st) != 0) return "unknown filesystem";
  switch (static_cast<unsigned long>(st.f_type)) {
    case EXT4_SUPER_MAGIC: return "ext2/3/4";
    case XFS_SUPER_MAGIC: return "xfs";
    case BTRFS_SUPER_MAGIC: return "btrfs";
    case F2FS_SUPER_MAGIC: return "f2fs";
    case TMPFS_MAGIC: return "tmpfs";
    case RAMFS_MAGIC: return "ramfs";
    case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
    case NFS_SUPER_MAGIC: return "nfs";
    case FUSE_SUPER_MAGIC: return "fuse";
    case V9FS_MAGIC: return "9p";
    case CIFS_SUPER_MAGIC: return "cifs";
    case SMB2_SUPER_MAGIC: return "smb2";
    case SQUASHFS_MAGIC: return "squashfs";
    case MSDOS_SUPER_MAGIC: return "vfat";
    case EXFAT_SUPER_MAGIC: return "exfat";
    case CEPH_SUPER_MAGIC: return "ceph";
    case PROC_SUPER_MAGIC: return "proc";
    case SYSFS_MAGIC: return "sysfs";
    default: break;
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "filesystem 0x%lx", static_cast<unsigned long>(st.f_type));
  return hex;
}

}  // namespace agentbox::linux
