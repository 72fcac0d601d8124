#include "workspace/archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <string_view>
#include <vector>

#include "common/log.h"
#include "common/unique_fd.h"
#include "linux/sys.h"

namespace agentbox::workspace {
namespace {

constexpr std::size_t kChunk = 64u << 10;

struct WriteFree {
  void operator()(struct archive* a) const { archive_write_free(a); }
};
struct ReadFree {
  void operator()(struct archive* a) const { archive_read_free(a); }
};
struct EntryFree {
  void operator()(archive_entry* e) const { archive_entry_free(e); }
};
using ArchiveWriter = std::unique_ptr<struct archive, WriteFree>;
using ArchiveReader = std::unique_ptr<struct archive, ReadFree>;
using Entry = std::unique_ptr<archive_entry, EntryFree>;

std::string archive_error(struct archive* a) {
  const char* s = archive_error_string(a);
  return s ? s : "unknown libarchive error";
}

// Names in messages: control bytes escaped, long names cut, so a hostile entry name cannot
// forge log lines or bloat a reply.
std::string shown_name(std::string_view name) {
  std::string out;
  for (char c : name.substr(0, 256)) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  if (name.size() > 256) out += "...";
  return out;
}

bool write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// openat2 of one path relative to `dirfd`, confined beneath it (sys::openat2_raw's bounded
// EAGAIN policy). Returns the fd or -1 with errno.
int openat2_beneath(int dirfd, const char* path, std::uint64_t flags) {
  // SECURITY: no "..", no absolute path, no symlink of any kind (not even one pointing inside),
  // no magic link, no other mount: the entry lands in this tree or nowhere.
  return linux::sys::openat2_raw(
      dirfd, path, flags,
      RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV);
}

// ---- writing ----

struct Frame {
  UniqueFd fd;
  std::vector<std::string> names;
  std::size_t next = 0;
  std::string rel;  // "" for the root, else "a/b/"
};

Status write_header(struct archive* a, archive_entry* e, const std::string& rel) {
  int r = archive_write_header(a, e);
  if (r < ARCHIVE_WARN)
    return fail(Code::kInternal, "archive " + shown_name(rel) + ": " + archive_error(a));
  return {};
}

Result<ArchiveStats> write_tree(struct archive* a, int workspace_fd, const std::string& shown) {
  ArchiveStats stats;
  struct stat root_st;
  if (::fstat(workspace_fd, &root_st) != 0) return fail_errno(errno, "stat(" + shown + ")");
  std::vector<Frame> stack;
  {
    Frame root;
    root.fd = UniqueFd(::openat(workspace_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root.fd) return fail_errno(errno, "open(" + shown + ")");
    auto names = linux::sys::list_names(root.fd.get(), shown);
    if (!names) return std::unexpected(names.error());
    root.names = std::move(*names);
    stack.push_back(std::move(root));
  }
  std::vector<char> buf(kChunk);
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.next == f.names.size()) {
      stack.pop_back();
      continue;
    }
    const std::string name = f.names[f.next++];
    const std::string rel = f.rel + name;
    const int dirfd = f.fd.get();
    struct stat st;
    // SECURITY: never follow a link the session planted; a symlink is stored as a symlink.
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      return fail_errno(errno, "stat(" + shown + "/" + shown_name(rel) + ")");
    }
    Entry e(archive_entry_new());
    archive_entry_set_pathname(e.get(), rel.c_str());
    archive_entry_set_perm(e.get(), st.st_mode & 0777);
    archive_entry_set_mtime(e.get(), st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    archive_entry_set_uid(e.get(), st.st_uid);
    archive_entry_set_gid(e.get(), st.st_gid);
    if (S_ISREG(st.st_mode)) {
      UniqueFd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      if (!fd) return fail_errno(errno, "open(" + shown + "/" + shown_name(rel) + ")");
      struct stat fst;
      if (::fstat(fd.get(), &fst) != 0 || !S_ISREG(fst.st_mode)) continue;  // swapped: skip
      archive_entry_set_filetype(e.get(), AE_IFREG);
      archive_entry_set_size(e.get(), fst.st_size);
      if (auto st2 = write_header(a, e.get(), rel); !st2) return std::unexpected(st2.error());
      std::uint64_t left = static_cast<std::uint64_t>(fst.st_size);
      while (left > 0) {
        ssize_t n = ::read(fd.get(), buf.data(), std::min<std::uint64_t>(left, buf.size()));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return fail_errno(errno, "read(" + shown + "/" + shown_name(rel) + ")");
        if (n == 0) break;  // shrank: libarchive pads the entry with zeros
        if (archive_write_data(a, buf.data(), static_cast<std::size_t>(n)) < 0) {
          return fail(Code::kInternal, "archive " + shown_name(rel) + ": " + archive_error(a));
        }
        left -= static_cast<std::uint64_t>(n);
        stats.bytes += static_cast<std::uint64_t>(n);
      }
    } else if (S_ISDIR(st.st_mode)) {
      if (st.st_dev != root_st.st_dev) continue;  // a mount point: not the workspace's data
      if (stack.size() >= kMaxArchiveDepth) {
        return fail(Code::kTooBig, "workspace " + shown + " is over " +
                                       std::to_string(kMaxArchiveDepth) +
                                       " directories deep; cannot archive " + shown_name(rel));
      }
      archive_entry_set_filetype(e.get(), AE_IFDIR);
      if (auto st2 = write_header(a, e.get(), rel + "/"); !st2) return std::unexpected(st2.error());
      Frame child;
      child.fd =
          UniqueFd(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!child.fd) return fail_errno(errno, "open(" + shown + "/" + shown_name(rel) + ")");
      auto names = linux::sys::list_names(child.fd.get(), shown + "/" + shown_name(rel));
      if (!names) return std::unexpected(names.error());
      child.names = std::move(*names);
      child.rel = rel + "/";
      ++stats.entries;
      stack.push_back(std::move(child));  // `f` is invalid from here on
      continue;
    } else if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX + 1];
      ssize_t n = ::readlinkat(dirfd, name.c_str(), target, PATH_MAX);
      if (n < 0) return fail_errno(errno, "readlink(" + shown + "/" + shown_name(rel) + ")");
      target[n] = '\0';
      archive_entry_set_filetype(e.get(), AE_IFLNK);
      archive_entry_set_symlink(e.get(), target);
      if (auto st2 = write_header(a, e.get(), rel); !st2) return std::unexpected(st2.error());
    } else {
      // FIFOs, sockets, devices: nothing a restore would accept (and nodev in the box anyway).
      spdlog::debug("archive of {}: skipping special file {}", shown, shown_name(rel));
      continue;
    }
    ++stats.entries;
  }
  return stats;
}

std::string temp_suffix() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

// ---- extraction ----

// Splits an entry name into components, dropping "" and "."; refuses what could point outside.
Result<std::vector<std::string>> split_entry(std::string_view name, const ExtractLimits& limits,
                                             const std::string& shown) {
  if (name.empty()) return fail(Code::kInvalid, "archive " + shown + ": an entry has no name");
  if (name.size() > PATH_MAX) {
    return fail(Code::kInvalid, "archive " + shown + ": entry name over " +
                                    std::to_string(PATH_MAX) + " bytes: " + shown_name(name));
  }
  // SECURITY: an absolute name would be "/etc/x"; refuse rather than strip, the archive is hostile.
  if (name.front() == '/') {
    return fail(Code::kAccess, "archive " + shown + ": entry " + shown_name(name) +
                                   " is an absolute path; refusing to extract it");
  }
  std::vector<std::string> comps;
  std::size_t i = 0;
  while (i <= name.size()) {
    std::size_t j = name.find('/', i);
    if (j == std::string_view::npos) j = name.size();
    std::string_view c = name.substr(i, j - i);
    i = j + 1;
    if (c.empty() || c == ".") continue;
    // SECURITY: ".." anywhere (even "a/../b", which would stay inside) is refused outright.
    if (c == "..") {
      return fail(Code::kAccess, "archive " + shown + ": entry " + shown_name(name) +
                                     " has a '..' component; refusing to extract it");
    }
    if (c.size() > NAME_MAX) {
      return fail(Code::kInvalid, "archive " + shown + ": entry " + shown_name(name) +
                                      " has a component over " + std::to_string(NAME_MAX) +
                                      " bytes");
    }
    comps.emplace_back(c);
  }
  if (comps.size() > limits.max_depth) {
    return fail(Code::kTooBig, "archive " + shown + ": entry " + shown_name(name) + " is " +
                                   std::to_string(comps.size()) + " levels deep (limit " +
                                   std::to_string(limits.max_depth) + ")");
  }
  return comps;
}

Status chown_at(int dirfd, const std::string& name, const std::optional<ArchiveOwner>& owner,
                const std::string& what) {
  if (!owner) return {};
  if (::fchownat(dirfd, name.c_str(), owner->uid, owner->gid, AT_SYMLINK_NOFOLLOW) != 0) {
    return fail_errno(errno, "chown(" + what + ")");
  }
  return {};
}

// The directory that will hold comps.back(), resolved one component at a time from `into_fd`
// and created (0700, owner applied) where missing. Returns an O_PATH fd.
Result<UniqueFd> open_parent(int into_fd, const std::vector<std::string>& comps,
                             const std::optional<ArchiveOwner>& owner, const std::string& entry,
                             const std::string& shown) {
  UniqueFd cur(::openat(into_fd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!cur) return fail_errno(errno, "open(workspace)");
  for (std::size_t k = 0; k + 1 < comps.size(); ++k) {
    const std::string& c = comps[k];
    int fd = openat2_beneath(cur.get(), c.c_str(), O_PATH | O_DIRECTORY);
    if (fd < 0 && errno == ENOENT) {
      if (::mkdirat(cur.get(), c.c_str(), 0700) != 0 && errno != EEXIST) {
        return fail_errno(errno, "archive " + shown + ": mkdir for entry " + entry);
      }
      if (auto st = chown_at(cur.get(), c, owner, entry); !st) return std::unexpected(st.error());
      fd = openat2_beneath(cur.get(), c.c_str(), O_PATH | O_DIRECTORY);
    }
    if (fd < 0) {
      int err = errno;
      if (err == ELOOP || err == EXDEV || err == ENOTDIR) {
        // SECURITY: the classic "d -> /" then "d/etc/x": the entry would go through a symlink
        // (or a non-directory); refuse the whole archive.
        return fail(Code::kAccess, "archive " + shown + ": entry " + entry +
                                       " goes through a symlink or non-directory (" +
                                       shown_name(c) + "); refusing to extract it");
      }
      return fail_errno(err, "archive " + shown + ": open parent of entry " + entry);
    }
    cur = UniqueFd(fd);
  }
  return cur;
}

struct DirFixup {
  std::string path;
  mode_t mode;
  timespec mtime;
};

}  // namespace

Result<ArchiveStats> write_archive(int workspace_fd, int out_dir_fd, const std::string& out_name,
                                   const std::string& shown) {
  const std::string tmp = "." + out_name + ".tmp-" + temp_suffix();
  UniqueFd out(::openat(out_dir_fd, tmp.c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!out) return fail_errno(errno, "create archive " + tmp);
  bool keep = false;
  struct Cleanup {
    int dirfd;
    const std::string& name;
    const bool& keep;
    ~Cleanup() {
      if (!keep) ::unlinkat(dirfd, name.c_str(), 0);
    }
  } cleanup{out_dir_fd, tmp, keep};

  ArchiveWriter a(archive_write_new());
  if (!a) return fail(Code::kInternal, "archive_write_new failed");
  if (archive_write_add_filter_zstd(a.get()) != ARCHIVE_OK ||
      archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK) {
    return fail(Code::kInternal, "archive: zstd/pax unavailable: " + archive_error(a.get()));
  }
  // Names are stored as the bytes they are (no locale conversion, which would fail on
  // non-UTF-8 names in the daemon's C locale).
  (void)archive_write_set_format_option(a.get(), "pax", "hdrcharset", "BINARY");
  if (archive_write_open_fd(a.get(), out.get()) != ARCHIVE_OK) {
    return fail(Code::kInternal, "archive open " + tmp + ": " + archive_error(a.get()));
  }
  auto stats = write_tree(a.get(), workspace_fd, shown);
  if (!stats) return std::unexpected(stats.error());
  if (archive_write_close(a.get()) != ARCHIVE_OK) {
    return fail(Code::kInternal, "archive close " + tmp + ": " + archive_error(a.get()));
  }
  // Durable before visible: the workspace is deleted right after this returns.
  if (::fsync(out.get()) != 0) return fail_errno(errno, "fsync(" + tmp + ")");
  if (::renameat2(out_dir_fd, tmp.c_str(), out_dir_fd, out_name.c_str(), RENAME_NOREPLACE) != 0) {
    return fail_errno(errno, "rename(" + tmp + ", " + out_name + ")");
  }
  keep = true;
  if (::fsync(out_dir_fd) != 0) return fail_errno(errno, "fsync(archives dir)");
  return *stats;
}

Result<ArchiveStats> extract_archive(int archive_fd, int into_fd, const ExtractLimits& limits,
                                     std::optional<ArchiveOwner> owner, const std::string& shown) {
  struct stat ast;
  if (::fstat(archive_fd, &ast) != 0) return fail_errno(errno, "stat(" + shown + ")");
  if (!S_ISREG(ast.st_mode)) {
    return fail(Code::kInvalid, "archive " + shown + " is not a regular file");
  }
  const std::uint64_t compressed =
      std::max<std::uint64_t>(1, static_cast<std::uint64_t>(ast.st_size));

  ArchiveReader a(archive_read_new());
  if (!a) return fail(Code::kInternal, "archive_read_new failed");
  // Only what write_archive() produces: zstd, tar (pax/ustar/gnu). No zip, no cpio, no raw.
  archive_read_support_filter_zstd(a.get());
  archive_read_support_format_tar(a.get());
  if (archive_read_open_fd(a.get(), archive_fd, kChunk) != ARCHIVE_OK) {
    return fail(Code::kInvalid,
                "archive " + shown + " is not a tar.zst: " + archive_error(a.get()));
  }
  if (archive_filter_code(a.get(), 0) != ARCHIVE_FILTER_ZSTD) {
    return fail(Code::kInvalid, "archive " + shown + " is not zstd-compressed (not a tar.zst)");
  }

  ArchiveStats stats;
  std::vector<DirFixup> dirs;
  std::vector<char> buf(kChunk);
  for (;;) {
    archive_entry* e = nullptr;
    int r = archive_read_next_header(a.get(), &e);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) {
      return fail(Code::kInvalid,
                  "archive " + shown + " is not a valid tar.zst: " + archive_error(a.get()));
    }
    if (archive_filter_code(a.get(), 0) != ARCHIVE_FILTER_ZSTD) {
      return fail(Code::kInvalid, "archive " + shown + " is not zstd-compressed (not a tar.zst)");
    }
    if (++stats.entries > limits.max_entries) {
      return fail(Code::kTooBig, "archive " + shown + " has over " +
                                     std::to_string(limits.max_entries) +
                                     " entries (limit); restore aborted");
    }
    const char* raw_name = archive_entry_pathname(e);
    if (!raw_name) return fail(Code::kInvalid, "archive " + shown + ": an entry has no name");
    const std::string name = raw_name;
    const std::string entry = shown_name(name);
    auto comps = split_entry(name, limits, shown);
    if (!comps) return std::unexpected(comps.error());

    // SECURITY: hard links could name a file outside (or alias one inside that is later
    // swapped); write_archive() never makes them, so every one is refused.
    if (const char* hl = archive_entry_hardlink(e)) {
      return fail(Code::kAccess, "archive " + shown + ": entry " + entry + " is a hard link (to " +
                                     shown_name(hl) + "); hard links are not allowed");
    }
    const mode_t type = archive_entry_filetype(e);
    if (type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK) {
      const char* kind = type == AE_IFIFO    ? "a FIFO"
                         : type == AE_IFCHR  ? "a character device"
                         : type == AE_IFBLK  ? "a block device"
                         : type == AE_IFSOCK ? "a socket"
                                             : "of an unknown type";
      // SECURITY: no device nodes or FIFOs in a workspace, whatever the archive says.
      return fail(Code::kAccess, "archive " + shown + ": entry " + entry + " is " + kind +
                                     "; only files, directories and symlinks are allowed");
    }
    // SECURITY: setuid/setgid/sticky are stripped; the session uid owns what we create.
    const mode_t perm = archive_entry_perm(e) & 0777;

    if (comps->empty()) {
      if (type == AE_IFDIR) continue;  // "./": the workspace root itself, which we made
      return fail(Code::kInvalid, "archive " + shown + ": entry " + entry + " names the root");
    }
    auto parent = open_parent(into_fd, *comps, owner, entry, shown);
    if (!parent) return std::unexpected(parent.error());
    const std::string& leaf = comps->back();
    const int pfd = parent->get();

    if (type == AE_IFDIR) {
      if (::mkdirat(pfd, leaf.c_str(), 0700) == 0) {
        if (auto st = chown_at(pfd, leaf, owner, entry); !st) return std::unexpected(st.error());
      } else if (errno == EEXIST) {
        struct stat st;
        if (::fstatat(pfd, leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) {
          return fail(Code::kInvalid, "archive " + shown + ": duplicate entry " + entry +
                                          " (a directory over a non-directory)");
        }
      } else {
        return fail_errno(errno, "archive " + shown + ": mkdir for entry " + entry);
      }
      std::string rel;
      for (const auto& c : *comps) rel += (rel.empty() ? "" : "/") + c;
      timespec mt{archive_entry_mtime(e), archive_entry_mtime_nsec(e)};
      dirs.push_back({std::move(rel), perm, mt});  // modes last: a 0500 dir must still fill
      continue;
    }
    if (type == AE_IFLNK) {
      const char* target = archive_entry_symlink(e);
      if (!target || !*target || std::strlen(target) > PATH_MAX) {
        return fail(Code::kInvalid, "archive " + shown + ": symlink entry " + entry +
                                        " has an empty or over-long target");
      }
      // The target is stored as given: it is resolved inside the box, never by the daemon
      // (every daemon-side resolution uses RESOLVE_NO_SYMLINKS or RESOLVE_IN_ROOT).
      if (::symlinkat(target, pfd, leaf.c_str()) != 0) {
        if (errno == EEXIST) {
          return fail(Code::kInvalid, "archive " + shown + ": duplicate entry " + entry);
        }
        return fail_errno(errno, "archive " + shown + ": symlink for entry " + entry);
      }
      if (auto st = chown_at(pfd, leaf, owner, entry); !st) return std::unexpected(st.error());
      continue;
    }

    // A regular file.
    if (archive_entry_size_is_set(e)) {
      auto declared = static_cast<std::uint64_t>(std::max<la_int64_t>(0, archive_entry_size(e)));
      if (declared > limits.max_total_bytes || stats.bytes + declared > limits.max_total_bytes) {
        return fail(Code::kTooBig, "archive " + shown + ": entry " + entry + " (" +
                                       std::to_string(declared) + " bytes) takes the restore " +
                                       "over its limit of " +
                                       std::to_string(limits.max_total_bytes) + " bytes");
      }
    }
    // SECURITY: O_EXCL|O_NOFOLLOW: never write through a symlink or over an earlier entry.
    UniqueFd fd(
        ::openat(pfd, leaf.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd) {
      if (errno == EEXIST) {
        return fail(Code::kInvalid, "archive " + shown + ": duplicate entry " + entry);
      }
      return fail_errno(errno, "archive " + shown + ": create entry " + entry);
    }
    for (;;) {
      la_ssize_t n = archive_read_data(a.get(), buf.data(), buf.size());
      if (n < 0) {
        return fail(Code::kInvalid,
                    "archive " + shown + ": entry " + entry + ": " + archive_error(a.get()));
      }
      if (n == 0) break;
      stats.bytes += static_cast<std::uint64_t>(n);
      if (stats.bytes > limits.max_total_bytes) {
        return fail(Code::kTooBig, "archive " + shown + " expands to over " +
                                       std::to_string(limits.max_total_bytes) +
                                       " bytes (limit); restore aborted at entry " + entry);
      }
      if (stats.bytes > limits.ratio_floor_bytes && stats.bytes / compressed > limits.max_ratio) {
        return fail(Code::kTooBig, "archive " + shown + " expands over " +
                                       std::to_string(limits.max_ratio) +
                                       "x its compressed size (a zip bomb?); restore aborted at "
                                       "entry " +
                                       entry);
      }
      if (!write_all(fd.get(), buf.data(), static_cast<std::size_t>(n))) {
        return fail_errno(errno, "archive " + shown + ": write entry " + entry);
      }
    }
    if (owner && ::fchown(fd.get(), owner->uid, owner->gid) != 0) {
      return fail_errno(errno, "chown(" + entry + ")");
    }
    // fchmod after fchown: chown clears setuid bits anyway, and perm has none.
    if (::fchmod(fd.get(), perm) != 0) return fail_errno(errno, "chmod(" + entry + ")");
    timespec times[2] = {{0, UTIME_OMIT}, {archive_entry_mtime(e), archive_entry_mtime_nsec(e)}};
    (void)::futimens(fd.get(), times);
  }

  // Directory modes and mtimes last (deepest first, so a child's fixup does not touch its
  // parent's mtime after the parent was set).
  std::sort(dirs.begin(), dirs.end(),
            [](const DirFixup& x, const DirFixup& y) { return x.path > y.path; });
  for (const DirFixup& d : dirs) {
    UniqueFd fd(openat2_beneath(into_fd, d.path.c_str(), O_RDONLY | O_DIRECTORY));
    if (!fd) return fail_errno(errno, "archive " + shown + ": open dir " + shown_name(d.path));
    if (::fchmod(fd.get(), d.mode) != 0) return fail_errno(errno, "chmod(" + d.path + ")");
    timespec times[2] = {{0, UTIME_OMIT}, d.mtime};
    (void)::futimens(fd.get(), times);
  }
  return stats;
}

}  // namespace agentbox::workspace
