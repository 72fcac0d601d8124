#include "workspace/workspaces.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "common/log.h"
#include "linux/sys.h"
#include "linux/quota_disk.h"

namespace agentbox::workspace {
namespace {

constexpr char kArchiveSuffix[] = ".tar.zst";
constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

// "20261121T220000.123Z": UTC, sortable, no ':' (archive file names).
std::string archive_stamp(std::chrono::system_clock::time_point t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%04d%02d%02dT%02d%02d%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms % 1000));
  return buf;
}

}  // namespace

Result<Workspaces> Workspaces::open(std::string data_dir, std::string root_dir) {
  UniqueFd data_fd(::open(data_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!data_fd) return fail_errno(errno, "open(" + data_dir + ")");
  if (root_dir.empty()) {
    const std::string ws = data_dir + "/workspaces";
    if (::mkdirat(data_fd.get(), "workspaces", 0700) != 0 && errno != EEXIST) {
      return fail_errno(errno, "mkdir(" + ws + ")");
    }
    UniqueFd root(::openat(data_fd.get(), "workspaces", kDirFlags));
    if (!root) return fail_errno(errno, "open(" + ws + ")");
    return Workspaces(std::move(data_dir), ws, std::move(root));
  }
  // An operator-chosen root (seed 001's --workdir, e.g. /mnt/workspace): made 0700 when missing,
  // an existing one keeps its mode and owner (the toolbox-server's layout is used in place).
  if (root_dir.front() != '/') {
    return fail(Code::kInvalid, "workspace root '" + root_dir + "' must be absolute");
  }
  std::error_code ec;
  std::filesystem::path parent = std::filesystem::path(root_dir).parent_path();
  std::filesystem::create_directories(parent, ec);
  if (ec) return fail_errno(ec.value(), "mkdir(" + parent.string() + ")");
  if (::mkdir(root_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return fail_errno(errno, "mkdir(" + root_dir + ")");
  }
  UniqueFd root(::open(root_dir.c_str(), kDirFlags));
  if (!root) return fail_errno(errno, "open(" + root_dir + ")");
  return Workspaces(std::move(data_dir), std::move(root_dir), std::move(root));
}

std::string Workspaces::path(const std::string& id) const {
  return root_path_ + "/" + id;
}

std::string Workspaces::image_path(const std::string& id) const {
  return data_dir_ + "/disks/" + id + ".img";
}

Result<UniqueFd> Workspaces::open_dir(const std::string& id) const {
  UniqueFd dir(::openat(root_.get(), id.c_str(), kDirFlags));
  if (!dir) {
    int err = errno;
    if (err == ENOTDIR || err == ELOOP) {
      // SECURITY: something other than a directory (e.g. a planted symlink to a host dir) sits
      // where the workspace belongs; never hand it out.
      return fail(Code::kAccess, "workspace " + path(id) +
                                     " is not a directory (a symlink?); refusing to use it");
    }
    return fail_errno(err, "open(" + path(id) + ")");
  }
  return dir;
}

Result<UniqueFd> Workspaces::dup_root() const {
  UniqueFd fd(::fcntl(root_.get(), F_DUPFD_CLOEXEC, 0));
  if (!fd) return fail_errno(errno, "dup(" + root_path_ + ")");
  return fd;
}

bool Workspaces::exists(const std::string& id) const {
  struct stat st;
  return ::fstatat(root_.get(), id.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

std::vector<std::string> Workspaces::names() const {
  auto names = linux::sys::list_names(root_.get(), root_path_);
  return names ? std::move(*names) : std::vector<std::string>{};
}

Result<Workspaces::Prepared> Workspaces::prepare(const std::string& id, bool must_be_new,
                                                 std::optional<Owner> owner,
                                                 std::uint64_t disk_mb) const {
  Prepared out;
  const std::string shown = path(id);
  if (::mkdirat(root_.get(), id.c_str(), 0700) == 0) {
    out.created = true;
  } else if (errno != EEXIST) {
    return fail_errno(errno, "mkdir(" + shown + ")");
  } else if (must_be_new) {
    return fail(Code::kExists, "workspace " + shown + " already exists on disk; not restoring over it");
  }
  // Whatever fails below, a directory made here does not stay (it is empty, or a fresh disk).
  auto failed = [&](Error e) -> Result<Prepared> {
    out.dir.reset();
    if (out.created) {
      if (disk_mb) (void)drop_disk(id);
      ::unlinkat(root_.get(), id.c_str(), AT_REMOVEDIR);
    }
    return std::unexpected(std::move(e));
  };
  auto dir = open_dir(id);
  if (!dir) return failed(dir.error());
  out.dir = std::move(*dir);
  if (disk_mb) {
    // A capped workspace: the directory becomes the root of its own size-limited file system;
    // reopen it to get the mounted root, not the directory beneath.
    if (auto st = attach_disk(id, owner, disk_mb); !st) return failed(st.error());
    auto mounted = open_dir(id);
    if (!mounted) return failed(mounted.error());
    out.dir = std::move(*mounted);
  }
  if (::fchmod(out.dir.get(), 0700) != 0) {
    return failed(Error::from_errno(errno, "chmod(" + shown + ")"));
  }
  // SECURITY: with isolation the session's own uid owns its workspace root (and no other
  // session's); without, the daemon's user keeps it.
  if (owner && ::fchown(out.dir.get(), owner->uid, owner->gid) != 0) {
    return failed(
        Error::from_errno(errno, "chown(" + shown + ", " + std::to_string(owner->uid) + ")"));
  }
  return out;
}

Status Workspaces::attach_disk(const std::string& id, std::optional<Owner> owner,
                               std::uint64_t disk_mb) const {
  const std::string disks = data_dir_ + "/disks";
  // 0700: the images hold every capped workspace's bytes.
  if (::mkdir(disks.c_str(), 0700) != 0 && errno != EEXIST) {
    return fail_errno(errno, "mkdir(" + disks + ")");
  }
  linux::QuotaDiskSpec spec;
  spec.image_path = image_path(id);
  spec.mountpoint = path(id);
  spec.bytes = disk_mb << 20;
  spec.uid = owner ? owner->uid : ::geteuid();
  spec.gid = owner ? owner->gid : ::getegid();
  return linux::attach_quota_disk(spec);
}

Status Workspaces::drop_disk(const std::string& id) const {
  auto st = linux::detach_quota_disk(path(id), image_path(id));
  if (!st && st.error().code != Code::kNotFound) return st;
  return {};
}

Status Workspaces::unmount_disk(const std::string& id) const {
  return linux::unmount_quota_disk(path(id));
}

Result<UniqueFd> Workspaces::open_archives_dir() const {
  const std::string dir = archives_dir();
  // SECURITY: 0700, daemon-owned: sessions never see archives of other sessions.
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return fail_errno(errno, "mkdir(" + dir + ")");
  }
  UniqueFd fd(::open(dir.c_str(), kDirFlags));
  if (!fd) return fail_errno(errno, "open(" + dir + ")");
  return fd;
}

Result<std::string> Workspaces::archive(const std::string& id) const {
  auto dir = open_archives_dir();
  if (!dir) return std::unexpected(dir.error());
  auto ws = open_dir(id);
  if (!ws) return std::unexpected(ws.error());
  const std::string name =
      id + "-" + archive_stamp(std::chrono::system_clock::now()) + kArchiveSuffix;
  auto stats = write_archive(ws->get(), dir->get(), name, "workspace of session " + id);
  if (!stats) return std::unexpected(stats.error());
  std::string out = archives_dir() + "/" + name;
  spdlog::info("session {}: archived {} entries, {} bytes to {}", id, stats->entries,
               stats->bytes, out);
  return out;
}

Result<UniqueFd> Workspaces::open_archive(const std::string& archive) const {
  if (archive.empty()) return fail(Code::kInvalid, "archive: must not be empty");
  if (archive.find('\0') != std::string::npos) {
    return fail(Code::kInvalid, "archive: path contains NUL");
  }
  const std::string dir = archives_dir();
  std::string rel = archive;
  if (archive.front() == '/') {
    std::string norm = std::filesystem::path(archive).lexically_normal().string();
    if (norm.size() <= dir.size() + 1 || norm.compare(0, dir.size(), dir) != 0 ||
        norm[dir.size()] != '/') {
      return fail(Code::kAccess, "archive " + archive + " is not under the archive directory " +
                                     dir + "; refusing to read it");
    }
    rel = norm.substr(dir.size() + 1);
  }
  if (rel.size() <= sizeof kArchiveSuffix - 1 ||
      rel.compare(rel.size() - (sizeof kArchiveSuffix - 1), std::string::npos, kArchiveSuffix) !=
          0) {
    return fail(Code::kInvalid, "archive " + archive + " is not a .tar.zst file");
  }
  auto dfd = open_archives_dir();
  if (!dfd) return std::unexpected(dfd.error());
  // SECURITY: "..", symlinks and absolute paths cannot lead out of data_dir/archives.
  const int fd = linux::sys::openat2_raw(dfd->get(), rel.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK,
                                         RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
                                             RESOLVE_NO_MAGICLINKS);
  if (fd < 0) {
    int err = errno;
    if (err == EXDEV || err == ELOOP) {
      return fail(Code::kAccess, "archive " + archive + " leads outside the archive directory " +
                                     dir + "; refusing to read it");
    }
    // A bad field of the request (400), not a missing session (404).
    Error e = Error::from_errno(err, "archive: open(" + archive + ")");
    e.code = Code::kInvalid;
    return std::unexpected(std::move(e));
  }
  UniqueFd out(fd);
  struct stat st;
  if (::fstat(out.get(), &st) != 0) return fail_errno(errno, "stat(" + archive + ")");
  if (!S_ISREG(st.st_mode)) {
    return fail(Code::kInvalid, "archive " + archive + " is not a regular file");
  }
  return out;
}

}  // namespace agentbox::workspace
