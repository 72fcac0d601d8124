#include "sandbox/rooted_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "linux/sys.h"
#include "sandbox/path.h"

namespace agentbox::sandbox {

namespace {

constexpr std::string_view kTempPrefix = kAtomicTempPrefix;
constexpr int kTempNameAttempts = 8;
constexpr mode_t kDefaultFileMode = 0644;
constexpr mode_t kDirMode = 0755;
constexpr std::size_t kDirBufBytes = 32 * 1024;
// remove_all gives up when directories it emptied keep getting refilled (an agent racing it).
constexpr int kRemoveAllRefills = 64;

std::int64_t mtime_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// A path cut into the directory that holds its final entry and that entry's name.
struct Split {
  std::string parent;  // "." for a bare name, "/" for "/name"
  std::string name;    // "" when the path names the root itself ("", ".", "/", "//")
  // True when there is no entry name to act on: the root, or a final "." / "..".
  bool nameless() const { return name.empty() || name == "." || name == ".."; }
};

Split split_path(const std::string& path) {
  std::size_t end = path.size();
  while (end > 0 && path[end - 1] == '/') --end;
  if (end == 0) return {path.empty() ? "." : "/", ""};
  const std::size_t slash = path.rfind('/', end - 1);
  if (slash == std::string::npos) return {".", path.substr(0, end)};
  std::size_t parent_end = slash;
  while (parent_end > 0 && path[parent_end - 1] == '/') --parent_end;
  return {parent_end == 0 ? "/" : path.substr(0, parent_end),
          path.substr(slash + 1, end - slash - 1)};
}

Status random_temp_name(std::string& out) {
  unsigned char bytes[8];
  std::size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "getrandom");
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  out.assign(kTempPrefix);
  for (const unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 0xf];
  }
  return {};
}

Status write_all(int fd, std::string_view data, const std::string& what) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, what);
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

// Paths reach RootedFs as std::string: a NUL would silently cut the path short at c_str().
Status check_path(const std::string& path) {
  if (path.find('\0') != std::string::npos) {
    return fail(Code::kInvalid, "path " + printable_path(path) + ": contains a NUL byte");
  }
  if (path.size() > kMaxPathBytes) {
    return fail(Code::kTooBig, "path of " + std::to_string(path.size()) + " bytes: over the " +
                                   std::to_string(kMaxPathBytes) + "-byte limit");
  }
  return {};
}

// The writer behind create_file. Owns the target's parent directory fd (O_RDONLY, so it can be
// fsynced) and the temp file; every name it touches is a single component relative to that fd.
class AtomicFileWriter final : public FileWriter {
 public:
  AtomicFileWriter(UniqueFd dir, std::string temp_name, std::string target_name, UniqueFd file,
                   mode_t mode, std::optional<Owner> owner, std::uint64_t max_bytes,
                   std::string shown)
      : dir_(std::move(dir)),
        temp_name_(std::move(temp_name)),
        target_name_(std::move(target_name)),
        file_(std::move(file)),
        mode_(mode),
        owner_(owner),
        max_bytes_(max_bytes),
        shown_(std::move(shown)) {}

  ~AtomicFileWriter() override { discard(); }

  Status write(std::string_view chunk) override {
    if (!file_) return fail(Code::kInvalid, "write(" + shown_ + "): writer already finished");
    if (chunk.size() > max_bytes_ - written_) {
      discard();
      return fail(Code::kTooBig,
                  "write(" + shown_ + "): over the " + std::to_string(max_bytes_) + "-byte limit");
    }
    if (auto s = write_all(file_.get(), chunk, "write(" + shown_ + ")"); !s) {
      discard();
      return s;
    }
    written_ += chunk.size();
    return {};
  }

  Result<std::uint64_t> commit() override {
    if (!file_) return fail(Code::kInvalid, "commit(" + shown_ + "): writer already finished");
    const std::string what = "write(" + shown_ + ")";
    // Data before name: the rename must never publish a file whose blocks are not on disk.
    if (::fsync(file_.get()) != 0) return discard_with(errno, what);
    // SECURITY: chown before chmod, and the mode never has setuid/setgid bits (create_file
    // checks), so the daemon cannot be made to publish a privileged executable.
    if (owner_ && ::fchown(file_.get(), owner_->uid, owner_->gid) != 0) {
      return discard_with(errno, what);
    }
    if (::fchmod(file_.get(), mode_) != 0) return discard_with(errno, what);
    // SECURITY: rename replaces a final symlink instead of following it, so a planted
    // "/workspace/s -> /etc/shadow" gets replaced, and the outside file is never opened.
    if (::renameat(dir_.get(), temp_name_.c_str(), dir_.get(), target_name_.c_str()) != 0) {
      return discard_with(errno, what);
    }
    file_.reset();
    // The rename itself is only durable once the directory is.
    if (::fsync(dir_.get()) != 0) return fail_errno(errno, what);
    return written_;
  }

 private:
  // Removes the temp file (the target stays as it was). Idempotent.
  void discard() {
    if (!file_) return;
    file_.reset();
    ::unlinkat(dir_.get(), temp_name_.c_str(), 0);
  }

  std::unexpected<Error> discard_with(int err, const std::string& what) {
    discard();
    return fail_errno(err, what);
  }

  UniqueFd dir_;
  std::string temp_name_;
  std::string target_name_;
  UniqueFd file_;  // open while the temp file exists and is ours to publish or remove
  mode_t mode_;
  std::optional<Owner> owner_;
  std::uint64_t max_bytes_;
  std::uint64_t written_ = 0;
  std::string shown_;
};

}  // namespace

RootedFs::RootedFs(UniqueFd root, RootMode mode, std::optional<Owner> owner,
                   std::string display_prefix)
    : root_(std::move(root)),
      mode_(mode),
      owner_(owner),
      display_prefix_(std::move(display_prefix)) {
  AB_CHECK(root_.valid());
}

std::string RootedFs::display(const std::string& path) const {
  if (!path.empty() && path.front() == '/') return printable_path(path);
  if (display_prefix_.empty()) return printable_path(path.empty() ? "." : path);
  if (path.empty() || path == ".") return printable_path(display_prefix_);
  std::string joined = display_prefix_;
  if (joined.back() != '/') joined += '/';
  joined += path;
  return printable_path(joined);
}

std::string RootedFs::what(const char* op, const std::string& path) const {
  return std::string(op) + "(" + display(path) + ")";
}

Result<UniqueFd> RootedFs::resolve(const std::string& rel, int flags, const char* op,
                                   const std::string& shown) const {
  // SECURITY: the only way an agent path becomes an fd. BENEATH refuses any step outside the
  // root (EXDEV); IN_ROOT treats "/" and ".." at the root as the root itself; NO_MAGICLINKS
  // refuses /proc/<pid>/{root,cwd,fd/N}-style links, which would jump anywhere.
  const std::uint64_t resolve_flags =
      (mode_ == RootMode::kBeneath ? RESOLVE_BENEATH : RESOLVE_IN_ROOT) | RESOLVE_NO_MAGICLINKS;
  // openat2's bounded EAGAIN policy (an agent looping renames gets EACCES) is sys::openat2's.
  auto fd = linux::sys::openat2(root_.get(), rel, static_cast<std::uint64_t>(flags), resolve_flags,
                                what(op, shown));
  if (fd) return fd;
  Error& e = fd.error();
  switch (e.sys_errno) {
    case EXDEV: e.message = what(op, shown) + ": outside the root"; break;
    case ELOOP: e.message = what(op, shown) + ": too many symlinks, or a /proc magic link"; break;
    default: break;
  }
  return fd;
}

Error RootedFs::refuse_nameless(const std::string& path, const char* op) const {
  auto fd = resolve(path, O_PATH | O_DIRECTORY, op, path);
  if (!fd) return std::move(fd.error());
  struct stat target {};
  struct stat root {};
  if (::fstat(fd->get(), &target) != 0 || ::fstat(root_.get(), &root) != 0) {
    return Error::from_errno(errno, what(op, path));
  }
  if (same_file(target, root)) {
    return Error::make(Code::kAccess, what(op, path) + ": is the root");
  }
  return Error::make(Code::kInvalid, what(op, path) + ": must name an entry, not end in . or ..");
}

Result<UniqueFd> RootedFs::open_dir(const std::string& path) const {
  if (auto s = check_path(path); !s) return std::unexpected(std::move(s.error()));
  return resolve(path, O_RDONLY | O_DIRECTORY, "opendir", path);
}

Result<FileReader> RootedFs::open_file(const std::string& path) const {
  if (auto s = check_path(path); !s) return std::unexpected(std::move(s.error()));
  // SECURITY: O_NONBLOCK so opening a FIFO returns at once instead of waiting for a writer; we
  // then refuse anything that is not a regular file (FIFOs, sockets, devices stream forever).
  auto fd = resolve(path, O_RDONLY | O_NONBLOCK | O_NOCTTY, "open", path);
  if (!fd) {
    // open(2) of a unix socket is ENXIO, of a device without a driver ENXIO/ENODEV.
    const int err = fd.error().sys_errno;
    if (err == ENXIO || err == ENODEV) {
      return std::unexpected(
          Error{Code::kInvalid, err, what("open", path) + ": not a regular file"});
    }
    return std::unexpected(std::move(fd.error()));
  }
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return fail_errno(errno, what("open", path));
  if (S_ISDIR(st.st_mode)) return fail(Code::kIsDir, what("open", path) + ": is a directory");
  if (!S_ISREG(st.st_mode)) {
    return fail(Code::kInvalid, what("open", path) + ": not a regular file");
  }
  const int fl = ::fcntl(fd->get(), F_GETFL);
  if (fl < 0 || ::fcntl(fd->get(), F_SETFL, fl & ~O_NONBLOCK) != 0) {
    return fail_errno(errno, what("open", path));
  }
  return FileReader{std::move(*fd), static_cast<std::uint64_t>(st.st_size)};
}

Result<std::unique_ptr<FileWriter>> RootedFs::create_file(const std::string& path,
                                                          WriteOptions opts) const {
  if (auto s = check_path(path); !s) return std::unexpected(std::move(s.error()));
  if (opts.mode && (*opts.mode & ~std::uint32_t{0777}) != 0) {
    return fail(Code::kInvalid, what("write", path) + ": mode must be within 0777");
  }
  const Split split = split_path(path);
  // A trailing "/" names a directory, as with open(2) O_CREAT.
  if (split.nameless() || path.back() == '/') {
    return fail(Code::kIsDir, what("write", path) + ": is a directory");
  }
  if (opts.mkdirs) {
    if (auto s = mkdir_all(split.parent); !s) return std::unexpected(std::move(s.error()));
  }
  // O_RDONLY rather than O_PATH: commit() fsyncs the directory through this fd.
  auto dir = resolve(split.parent, O_RDONLY | O_DIRECTORY, "write", path);
  if (!dir) return std::unexpected(std::move(dir.error()));

  mode_t mode = kDefaultFileMode;
  struct stat st {};
  if (::fstatat(dir->get(), split.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISDIR(st.st_mode)) return fail(Code::kIsDir, what("write", path) + ": is a directory");
    if (S_ISREG(st.st_mode)) mode = st.st_mode & 0777;
  } else if (errno != ENOENT) {
    return fail_errno(errno, what("write", path));
  }
  if (opts.mode) mode = static_cast<mode_t>(*opts.mode);

  std::string temp;
  UniqueFd file;
  for (int attempt = 0; attempt < kTempNameAttempts && !file; ++attempt) {
    if (auto s = random_temp_name(temp); !s) return std::unexpected(std::move(s.error()));
    // 0600 until commit: nobody else reads a half-written file through its temp name.
    file = UniqueFd(::openat(dir->get(), temp.c_str(),
                             O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!file && errno != EEXIST) return fail_errno(errno, what("write", path));
  }
  if (!file) return fail_errno(EEXIST, what("write", path));
  return std::make_unique<AtomicFileWriter>(std::move(*dir), std::move(temp), split.name,
                                            std::move(file), mode, owner_, opts.max_bytes,
                                            display(path));
}

Result<FileInfo> RootedFs::stat(const std::string& path) const {
  if (auto s = check_path(path); !s) return std::unexpected(std::move(s.error()));
  // O_PATH|O_NOFOLLOW on a final symlink yields the link itself, like lstat.
  auto fd = resolve(path, O_PATH | O_NOFOLLOW, "stat", path);
  if (!fd) return std::unexpected(std::move(fd.error()));
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return fail_errno(errno, what("stat", path));
  const Split split = split_path(path);
  FileInfo info;
  info.name = split.name == "." ? "" : split.name;
  info.path = path;
  info.size = static_cast<std::uint64_t>(st.st_size);
  info.mode = st.st_mode;
  info.mod_time_ns = mtime_ns(st);
  info.is_dir = S_ISDIR(st.st_mode);
  info.is_symlink = S_ISLNK(st.st_mode);
  info.uid = st.st_uid;
  info.gid = st.st_gid;
  if (info.is_symlink) {
    // The link itself (O_PATH|O_NOFOLLOW): readlinkat with an empty name reads it.
    char target[kMaxPathBytes];
    ssize_t n = ::readlinkat(fd->get(), "", target, sizeof target);
    if (n > 0) info.symlink_target.assign(target, static_cast<std::size_t>(n));
  }
  return info;
}

Result<std::vector<DirEntry>> RootedFs::read_dir(const std::string& path,
                                                 std::size_t max_entries) const {
  if (auto s = check_path(path); !s) return std::unexpected(std::move(s.error()));
  auto dir = resolve(path, O_RDONLY | O_DIRECTORY, "readdir", path);
  if (!dir) return std::unexpected(std::move(dir.error()));
  // RootedFs's display names, not the fd's: "readdir(/workspace/x)".
  auto names = linux::sys::read_dir(dir->get(), display(path), max_entries);
  if (!names) return std::unexpected(std::move(names.error()));
  std::vector<DirEntry> entries;
  entries.reserve(names->size());
  for (const linux::sys::DirEntry& n : *names) {
    struct stat st {};
    if (::fstatat(dir->get(), n.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed since getdents: not there any more
      return fail_errno(errno, what("readdir", path));
    }
    DirEntry e;
    e.name = n.name;
    e.is_dir = S_ISDIR(st.st_mode);
    e.is_symlink = S_ISLNK(st.st_mode);
    e.size = static_cast<std::uint64_t>(st.st_size);
    e.mode = st.st_mode;
    e.mod_time_ns = mtime_ns(st);
    e.uid = st.st_uid;
    e.gid = st.st_gid;
    entries.push_back(std::move(e));
  }
  return entries;
}

Status RootedFs::mkdir_all(const std::string& path) const {
  if (auto s = check_path(path); !s) return s;
  // Already there (the common case): one resolution, nothing created.
  auto existing = resolve(path, O_PATH | O_DIRECTORY, "mkdir", path);
  if (existing) return {};
  if (existing.error().sys_errno != ENOENT) return std::unexpected(std::move(existing.error()));

  std::string prefix = !path.empty() && path.front() == '/' ? "/" : "";
  auto cur = resolve(prefix, O_RDONLY | O_DIRECTORY, "mkdir", path);
  if (!cur) return std::unexpected(std::move(cur.error()));
  std::string_view rest = path;
  while (!rest.empty()) {
    const std::size_t slash = rest.find('/');
    const std::string comp(rest.substr(0, slash));
    rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
    if (comp.empty() || comp == ".") continue;
    if (!prefix.empty() && prefix.back() != '/') prefix += '/';
    prefix += comp;
    if (comp != ".." && ::mkdirat(cur->get(), comp.c_str(), kDirMode) == 0) {
      // We made it, so it is a real directory directly inside `cur`: enter it without following
      // anything (a swap for a symlink since then fails with ELOOP).
      UniqueFd made(
          ::openat(cur->get(), comp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!made) return fail_errno(errno, what("mkdir", path));
      if (owner_ && ::fchown(made.get(), owner_->uid, owner_->gid) != 0) {
        return fail_errno(errno, what("mkdir", path));
      }
      *cur = std::move(made);
      continue;
    }
    if (comp != ".." && errno != EEXIST) return fail_errno(errno, what("mkdir", path));
    // Something is there already (maybe a symlink, maybe "..") : resolve the prefix from the
    // root again so it gets the same confinement as any other path.
    cur = resolve(prefix, O_RDONLY | O_DIRECTORY, "mkdir", path);
    if (!cur) return std::unexpected(std::move(cur.error()));
  }
  return {};
}

Status RootedFs::remove(const std::string& path) const {
  if (auto s = check_path(path); !s) return s;
  const Split split = split_path(path);
  if (split.nameless()) return std::unexpected(refuse_nameless(path, "remove"));
  auto dir = resolve(split.parent, O_PATH | O_DIRECTORY, "remove", path);
  if (!dir) return std::unexpected(std::move(dir.error()));
  // unlinkat without AT_REMOVEDIR never follows the final name; on Linux a directory gives
  // EISDIR, and only then do we try it as a directory (no stat-then-act race).
  if (::unlinkat(dir->get(), split.name.c_str(), 0) == 0) return {};
  if (errno != EISDIR) return fail_errno(errno, what("remove", path));
  if (::unlinkat(dir->get(), split.name.c_str(), AT_REMOVEDIR) == 0) return {};
  const int err = errno;
  if (err == EEXIST || err == ENOTEMPTY) {
    return std::unexpected(Error{Code::kNotEmpty, err, what("remove", path) + ": not empty"});
  }
  if (err == EBUSY) {
    return std::unexpected(Error{Code::kAccess, err, what("remove", path) + ": a mount point"});
  }
  return fail_errno(err, what("remove", path));
}

Status RootedFs::remove_all(const std::string& path) const {
  if (auto s = check_path(path); !s) return s;
  const Split split = split_path(path);
  if (split.nameless()) return std::unexpected(refuse_nameless(path, "remove_all"));
  auto dir = resolve(split.parent, O_PATH | O_DIRECTORY, "remove_all", path);
  if (!dir) return std::unexpected(std::move(dir.error()));
  const char* name = split.name.c_str();
  if (::unlinkat(dir->get(), name, 0) == 0) return {};
  if (errno != EISDIR) return fail_errno(errno, what("remove_all", path));
  return remove_tree(dir->get(), split.name, path);
}

namespace {

// Opens the subdirectory `name` of `dirfd` for remove_all, or returns -errno.
// SECURITY: a single component with RESOLVE_NO_SYMLINKS (a directory swapped for a symlink is
// ELOOP, never followed) and RESOLVE_NO_XDEV (EXDEV instead of walking into a mount below the
// tree, e.g. a read-only skills bind or a shared dir).
int open_subdir(int dirfd, const char* name) {
  const int fd = linux::sys::openat2_raw(
      dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW,
      RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV);
  return fd >= 0 ? fd : -errno;
}

}  // namespace

// Depth-first and iterative. Only the directory being emptied is open (plus a transient fd while
// climbing), so depth costs memory for names, not fds. Climbing uses openat(cur, "..") and checks
// that it is the very directory we came down from (st_dev/st_ino recorded on the way down): if
// the agent moved our directory elsewhere meanwhile, ".." is somewhere else and we stop rather
// than delete there. Coming down never follows a symlink and never crosses a mount.
Status RootedFs::remove_tree(int parent_fd, const std::string& name,
                             const std::string& path) const {
  const std::string op_what = what("remove_all", path);
  auto sys_fail = [&](int err) { return std::unexpected(Error::from_errno(err, op_what)); };

  struct Frame {
    std::string name;  // of the directory below, in the directory identified by dev/ino
    dev_t dev;
    ino_t ino;
  };
  std::vector<Frame> stack;

  int fd = open_subdir(parent_fd, name.c_str());
  if (fd == -ENOTDIR || fd == -ELOOP) {
    // No longer a directory (swapped since remove_all looked): remove whatever is there now.
    if (::unlinkat(parent_fd, name.c_str(), 0) == 0 || errno == ENOENT) return {};
    return sys_fail(errno);
  }
  if (fd == -EXDEV) return fail(Code::kAccess, op_what + ": a mount point");
  if (fd < 0) return sys_fail(-fd);
  UniqueFd cur(fd);
  struct stat cur_st {};
  if (::fstat(cur.get(), &cur_st) != 0) return sys_fail(errno);

  auto buf = std::make_unique<std::byte[]>(kDirBufBytes);
  int refills = 0;
  for (;;) {
    // One pass over `cur`: unlink what is not a directory; stop at the first subdirectory.
    if (::lseek(cur.get(), 0, SEEK_SET) < 0) return sys_fail(errno);
    bool saw_entries = false;
    std::string subdir;
    bool have_subdir = false;
    while (!have_subdir) {
      const ssize_t n = ::getdents64(cur.get(), buf.get(), kDirBufBytes);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return sys_fail(errno);
      if (n == 0) break;
      for (ssize_t off = 0; off < n && !have_subdir;) {
        const auto* d = reinterpret_cast<const struct dirent64*>(buf.get() + off);
        off += d->d_reclen;
        const std::string_view entry = d->d_name;
        if (entry == "." || entry == "..") continue;
        saw_entries = true;
        if (d->d_type != DT_DIR) {
          if (::unlinkat(cur.get(), d->d_name, 0) == 0 || errno == ENOENT) continue;
          if (errno != EISDIR) return sys_fail(errno);
        }
        subdir = entry;
        have_subdir = true;
      }
    }

    if (have_subdir) {
      fd = open_subdir(cur.get(), subdir.c_str());
      if (fd == -ENOENT) continue;
      if (fd == -ENOTDIR || fd == -ELOOP) {
        // Swapped for a file or symlink since getdents: remove that entry itself. EISDIR: swapped
        // back already; the next pass sees it again.
        if (::unlinkat(cur.get(), subdir.c_str(), 0) != 0 && errno != ENOENT && errno != EISDIR) {
          return sys_fail(errno);
        }
        continue;
      }
      if (fd == -EXDEV) return fail(Code::kAccess, op_what + ": contains a mount point");
      if (fd < 0) return sys_fail(-fd);
      stack.push_back(Frame{std::move(subdir), cur_st.st_dev, cur_st.st_ino});
      cur = UniqueFd(fd);
      if (::fstat(cur.get(), &cur_st) != 0) return sys_fail(errno);
      continue;
    }
    // A pass that removed something may have missed entries (getdents offsets shift on some
    // filesystems as entries go): only a pass that saw nothing proves the directory empty.
    if (saw_entries) continue;

    int up_fd = parent_fd;
    std::string child_name = name;
    UniqueFd up;
    if (!stack.empty()) {
      up = UniqueFd(::openat(cur.get(), "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!up) return sys_fail(errno);
      struct stat up_st {};
      if (::fstat(up.get(), &up_st) != 0) return sys_fail(errno);
      const Frame& top = stack.back();
      if (up_st.st_dev != top.dev || up_st.st_ino != top.ino) {
        return fail(Code::kAccess, op_what + ": a directory was moved during the removal");
      }
      child_name = top.name;
      up_fd = up.get();
      cur_st = up_st;
    }
    cur.reset();
    if (::unlinkat(up_fd, child_name.c_str(), AT_REMOVEDIR) != 0) {
      const int err = errno;
      if (err == EBUSY) return fail(Code::kAccess, op_what + ": contains a mount point");
      if (err == EEXIST || err == ENOTEMPTY) {
        // Refilled behind us: go through it again, up to a bound.
        if (++refills > kRemoveAllRefills) {
          return std::unexpected(
              Error{Code::kNotEmpty, err, op_what + ": kept being refilled during the removal"});
        }
      } else if (err != ENOENT && err != ENOTDIR) {
        return sys_fail(err);
      }
      if (stack.empty()) {
        // The top directory itself: start over from it.
        fd = open_subdir(parent_fd, name.c_str());
        if (fd == -ENOENT || fd == -ENOTDIR || fd == -ELOOP) return {};
        if (fd < 0) return sys_fail(-fd);
        cur = UniqueFd(fd);
        if (::fstat(cur.get(), &cur_st) != 0) return sys_fail(errno);
        continue;
      }
    }
    if (stack.empty()) return {};
    stack.pop_back();
    cur = std::move(up);
  }
}

Status RootedFs::rename(const std::string& from, const std::string& to) const {
  if (auto s = check_path(from); !s) return s;
  if (auto s = check_path(to); !s) return s;
  const Split src = split_path(from);
  const Split dst = split_path(to);
  if (src.nameless()) return std::unexpected(refuse_nameless(from, "rename"));
  if (dst.nameless()) return std::unexpected(refuse_nameless(to, "rename"));
  auto src_dir = resolve(src.parent, O_PATH | O_DIRECTORY, "rename", from);
  if (!src_dir) return std::unexpected(std::move(src_dir.error()));
  auto dst_dir = resolve(dst.parent, O_PATH | O_DIRECTORY, "rename", to);
  if (!dst_dir) return std::unexpected(std::move(dst_dir.error()));
  // renameat acts on the two final names themselves: a symlink is moved or replaced, never
  // followed.
  if (::renameat(src_dir->get(), src.name.c_str(), dst_dir->get(), dst.name.c_str()) == 0) {
    return {};
  }
  const int err = errno;
  const std::string w = "rename(" + display(from) + ", " + display(to) + ")";
  if (err == EBUSY) return std::unexpected(Error{Code::kAccess, err, w + ": a mount point"});
  if (err == EXDEV) {
    return std::unexpected(Error{Code::kInvalid, err, w + ": across filesystems"});
  }
  if (err == EEXIST || err == ENOTEMPTY) {
    return std::unexpected(Error{Code::kNotEmpty, err, w + ": target directory not empty"});
  }
  return fail_errno(err, w);
}

namespace {

std::size_t remove_stale_temps_below(int dir_fd, std::int64_t cutoff_ns, int depth) {
  constexpr int kMaxDepth = 64;
  auto entries = linux::sys::read_dir(dir_fd, "temp sweep");
  if (!entries) return 0;
  std::size_t removed = 0;
  for (const linux::sys::DirEntry& e : *entries) {
    const std::string_view name = e.name;
    const char* cname = e.name.c_str();
    struct stat st;
    if (::fstatat(dir_fd, cname, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const std::int64_t mtime_ns = std::int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    if (S_ISREG(st.st_mode) && name.substr(0, kTempPrefix.size()) == kTempPrefix &&
        mtime_ns < cutoff_ns) {
      if (::unlinkat(dir_fd, cname, 0) == 0) ++removed;
    } else if (S_ISDIR(st.st_mode) && depth < kMaxDepth) {
      UniqueFd sub(::openat(dir_fd, cname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (sub) removed += remove_stale_temps_below(sub.get(), cutoff_ns, depth + 1);
    }
  }
  return removed;
}

}  // namespace

std::size_t remove_stale_temp_files(int dir_fd, std::chrono::system_clock::time_point older_than) {
  const std::int64_t cutoff_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(older_than.time_since_epoch()).count();
  return remove_stale_temps_below(dir_fd, cutoff_ns, 0);
}

}  // namespace agentbox::sandbox
