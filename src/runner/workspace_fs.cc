#include "runner/workspace_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <random>

namespace agentbox::runner {
namespace {

constexpr std::uint64_t kResolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;

// EAGAIN: a rename raced a ".." step; retried a bounded number of times.
int openat2_beneath(int dirfd, const std::string& rel, int flags, mode_t mode) {
  open_how how{};
  how.flags = static_cast<std::uint64_t>(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = kResolve;
  const char* p = rel.empty() ? "." : rel.c_str();
  for (int i = 0; i < 64; ++i) {
    long fd = syscall(SYS_openat2, dirfd, p, &how, sizeof how);
    if (fd >= 0) return static_cast<int>(fd);
    if (errno != EAGAIN && errno != EINTR) return -1;
  }
  return -1;
}

// Go's strerror spelling: lower case.
std::string err_text(int err) {
  std::string s = std::strerror(err);
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

// filepath.Clean of an absolute path.
std::string clean_abs(const std::string& p) {
  std::vector<std::string> parts;
  std::size_t i = 0;
  while (i <= p.size()) {
    std::size_t j = p.find('/', i);
    if (j == std::string::npos) j = p.size();
    std::string c = p.substr(i, j - i);
    if (c == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!c.empty() && c != ".") {
      parts.push_back(std::move(c));
    }
    i = j + 1;
  }
  std::string out;
  for (const auto& c : parts) out += "/" + c;
  return out.empty() ? "/" : out;
}

}  // namespace

Result<WorkspaceFs> WorkspaceFs::open(const std::string& dir) {
  char buf[PATH_MAX];
  if (!::realpath(dir.c_str(), buf)) return fail_errno(errno, "workspace " + dir);
  UniqueFd fd(::open(buf, O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return fail_errno(errno, std::string("workspace ") + buf);
  return WorkspaceFs(std::move(fd), buf);
}

Error WorkspaceFs::escape(const std::string& p, const std::string& resolved) const {
  return Error{
      Code::kAccess, EPERM,
      "path \"" + p + "\" (resolved to \"" + resolved + "\") escapes workspace \"" + path_ + "\""};
}

Error WorkspaceFs::os_error(int err, const char* op, const std::string& p) const {
  if (err == EXDEV || err == ELOOP) {
    std::string abs = p.empty() || p[0] != '/' ? path_ + "/" + p : p;
    return escape(p, clean_abs(abs));
  }
  return Error{code_for_errno(err), err, std::string(op) + " " + p + ": " + err_text(err)};
}

Result<std::string> WorkspaceFs::relative(const std::string& p) const {
  if (p.find('\0') != std::string::npos) return fail(Code::kInvalid, "path contains a NUL byte");
  std::string abs = clean_abs(!p.empty() && p[0] == '/' ? p : path_ + "/" + p);
  if (abs == path_) return std::string();
  if (path_ == "/") return abs.substr(1);
  if (abs.size() > path_.size() && abs.compare(0, path_.size(), path_) == 0 &&
      abs[path_.size()] == '/') {
    return abs.substr(path_.size() + 1);
  }
  return std::unexpected(escape(p, abs));
}

Result<UniqueFd> WorkspaceFs::open_at(const std::string& p, int flags, mode_t mode) const {
  std::string rel = AB_TRY(relative(p));
  UniqueFd fd(openat2_beneath(root_.get(), rel, flags, mode));
  if (!fd) return std::unexpected(os_error(errno, "open", p));
  return fd;
}

Result<UniqueFd> WorkspaceFs::open_dir(const std::string& p) const {
  std::string rel = AB_TRY(relative(p));
  UniqueFd fd(openat2_beneath(root_.get(), rel, O_PATH | O_DIRECTORY, 0));
  if (!fd) return std::unexpected(os_error(errno, "chdir", p));
  return fd;
}

Result<std::pair<UniqueFd, std::string>> WorkspaceFs::parent_of(const std::string& p,
                                                                const char* op) const {
  std::string rel = AB_TRY(relative(p));
  if (rel.empty()) {
    return std::unexpected(
        Error{Code::kAccess, EPERM, std::string(op) + " " + p + ": refusing the workspace itself"});
  }
  std::size_t slash = rel.rfind('/');
  std::string parent = slash == std::string::npos ? "" : rel.substr(0, slash);
  std::string name = slash == std::string::npos ? rel : rel.substr(slash + 1);
  UniqueFd dir(openat2_beneath(root_.get(), parent, O_PATH | O_DIRECTORY, 0));
  if (!dir) return std::unexpected(os_error(errno, op, p));
  return std::pair{std::move(dir), std::move(name)};
}

Result<std::string> WorkspaceFs::read_file(const std::string& p) const {
  UniqueFd fd = AB_TRY(open_at(p, O_RDONLY | O_NONBLOCK));
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return std::unexpected(os_error(errno, "read", p));
  if (S_ISDIR(st.st_mode)) return std::unexpected(os_error(EISDIR, "read", p));
  if (!S_ISREG(st.st_mode)) return std::unexpected(os_error(EINVAL, "read", p));
  std::string out;
  out.reserve(static_cast<std::size_t>(st.st_size));
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::unexpected(os_error(errno, "read", p));
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

static Status write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "write");
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

Status WorkspaceFs::write_file(const std::string& p, std::string_view data,
                               std::uint32_t perm) const {
  // Atomic for readers (a temp file beside the target, renamed over it): a concurrent
  // read_file sees the old bytes or the new ones, never a torn file. The parent is resolved
  // beneath the workspace (parent_of); a final symlink is replaced, not followed.
  Writer w = AB_TRY(create(p, perm));
  if (auto s = w.write(data); !s) return std::unexpected(os_error(s.error().sys_errno, "write", p));
  return w.commit();
}

Result<proto::FileInfo> WorkspaceFs::stat(const std::string& p) const {
  UniqueFd fd = AB_TRY(open_at(p, O_PATH));
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return std::unexpected(os_error(errno, "stat", p));
  std::string abs = clean_abs(!p.empty() && p[0] == '/' ? p : path_ + "/" + p);
  proto::FileInfo fi;
  fi.name = abs == "/" ? "/" : abs.substr(abs.rfind('/') + 1);
  fi.size = st.st_size;
  fi.mode = proto::go_mode_from_st_mode(st.st_mode);
  fi.mod_time = proto::format_mod_time(st.st_mtim.tv_sec);
  fi.is_dir = S_ISDIR(st.st_mode);
  return fi;
}

Result<proto::DirEntries> WorkspaceFs::read_dir(const std::string& p) const {
  UniqueFd fd = AB_TRY(open_at(p, O_RDONLY | O_DIRECTORY));
  int dup_fd = fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return std::unexpected(os_error(errno, "open", p));
  DIR* d = fdopendir(dup_fd);
  if (!d) {
    ::close(dup_fd);
    return std::unexpected(os_error(errno, "open", p));
  }
  proto::DirEntries out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (fstatat(fd.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
    out.entries.push_back({name, S_ISDIR(st.st_mode), st.st_size});
  }
  closedir(d);
  std::sort(out.entries.begin(), out.entries.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

Status WorkspaceFs::mkdir_all(const std::string& p, std::uint32_t perm) const {
  std::string rel = AB_TRY(relative(p));
  mode_t mode = proto::perm_from_go(perm);
  std::string prefix;
  std::size_t i = 0;
  while (i < rel.size()) {
    std::size_t j = rel.find('/', i);
    if (j == std::string::npos) j = rel.size();
    std::string name = rel.substr(i, j - i);
    UniqueFd dir(openat2_beneath(root_.get(), prefix, O_PATH | O_DIRECTORY, 0));
    if (!dir) return std::unexpected(os_error(errno, "mkdir", p));
    if (mkdirat(dir.get(), name.c_str(), mode) != 0 && errno != EEXIST) {
      return std::unexpected(os_error(errno, "mkdir", p));
    }
    prefix = prefix.empty() ? name : prefix + "/" + name;
    i = j + 1;
  }
  // The whole path must now be a directory (an existing file or a symlink out is an error).
  UniqueFd last(openat2_beneath(root_.get(), rel, O_PATH | O_DIRECTORY, 0));
  if (!last) return std::unexpected(os_error(errno, "mkdir", p));
  return {};
}

Status WorkspaceFs::remove(const std::string& p) const {
  auto [dir, name] = AB_TRY(parent_of(p, "remove"));
  if (unlinkat(dir.get(), name.c_str(), 0) == 0) return {};
  int e1 = errno;
  if (unlinkat(dir.get(), name.c_str(), AT_REMOVEDIR) == 0) return {};
  int e2 = errno;
  // As Go's os.Remove: rmdir of a non-directory says ENOTDIR, so then unlink's error is real.
  return std::unexpected(os_error(e2 == ENOTDIR ? e1 : e2, "remove", p));
}

static int remove_tree(int parent, const char* name) {
  struct stat st {};
  if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : errno;
  if (!S_ISDIR(st.st_mode)) return unlinkat(parent, name, 0) == 0 || errno == ENOENT ? 0 : errno;
  int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno;
  DIR* d = fdopendir(fd);
  if (!d) {
    int e = errno;
    ::close(fd);
    return e;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      names.emplace_back(e->d_name);
    }
  }
  int err = 0;
  for (const auto& n : names) {
    if (int e = remove_tree(dirfd(d), n.c_str()); e != 0 && err == 0) err = e;
  }
  closedir(d);
  if (err != 0) return err;
  return unlinkat(parent, name, AT_REMOVEDIR) == 0 || errno == ENOENT ? 0 : errno;
}

Status WorkspaceFs::remove_all(const std::string& p) const {
  auto parent = parent_of(p, "remove");
  if (!parent) {
    if (parent.error().sys_errno == ENOENT) return {};
    return std::unexpected(parent.error());
  }
  if (int e = remove_tree(parent->first.get(), parent->second.c_str()); e != 0) {
    return std::unexpected(os_error(e, "remove", p));
  }
  return {};
}

// ---- chunked-upload writer ----

WorkspaceFs::Writer::Writer(Writer&& o) noexcept
    : dir_(std::move(o.dir_)),
      fd_(std::move(o.fd_)),
      tmp_(std::move(o.tmp_)),
      name_(std::move(o.name_)),
      shown_(std::move(o.shown_)),
      written_(o.written_),
      flushed_(o.flushed_) {
  o.tmp_.clear();
}

WorkspaceFs::Writer& WorkspaceFs::Writer::operator=(Writer&& o) noexcept {
  if (this != &o) {
    this->~Writer();
    new (this) Writer(std::move(o));
  }
  return *this;
}

WorkspaceFs::Writer::~Writer() {
  if (!tmp_.empty() && dir_) unlinkat(dir_.get(), tmp_.c_str(), 0);
}

Status WorkspaceFs::Writer::write(std::string_view data) {
  if (auto s = write_all(fd_.get(), data); !s) {
    return fail_errno(s.error().sys_errno, "write " + shown_);
  }
  written_ += static_cast<std::int64_t>(data.size());
  // Start the disk writeback of what is written so far every few MiB (without waiting for it),
  // so commit()'s fsync finds most of a big file on disk already instead of writing it all then.
  constexpr std::int64_t kWritebackStep = 4 << 20;
  if (written_ - flushed_ >= kWritebackStep) {
    (void)sync_file_range(fd_.get(), flushed_, written_ - flushed_, SYNC_FILE_RANGE_WRITE);
    flushed_ = written_;
  }
  return {};
}

Status WorkspaceFs::Writer::commit() {
  if (fsync(fd_.get()) != 0) return fail_errno(errno, "fsync " + shown_);
  if (renameat(dir_.get(), tmp_.c_str(), dir_.get(), name_.c_str()) != 0) {
    return fail_errno(errno, "rename " + shown_);
  }
  tmp_.clear();
  return {};
}

Result<WorkspaceFs::Writer> WorkspaceFs::create(const std::string& p, std::uint32_t perm) const {
  auto [dir, name] = AB_TRY(parent_of(p, "open"));
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  Writer w;
  w.tmp_ = "." + name + ".agentbox-upload-" + std::to_string(rng() % 1000000000);
  w.fd_ = UniqueFd(openat(dir.get(), w.tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                          proto::perm_from_go(perm)));
  if (!w.fd_) {
    w.tmp_.clear();
    return std::unexpected(os_error(errno, "open", p));
  }
  w.dir_ = std::move(dir);
  w.name_ = std::move(name);
  w.shown_ = p;
  return w;
}

}  // namespace agentbox::runner
