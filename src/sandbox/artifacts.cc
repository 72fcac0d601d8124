#include "sandbox/artifacts.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <magic.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "common/log.h"
#include "common/unique_fd.h"

namespace agentbox::sandbox {
namespace {

constexpr const char* kUnknownMime = "application/octet-stream";
// libmagic reads this much of a file at most (its default is megabytes): plenty for the magic
// numbers MIME detection looks at, and it bounds the cost of an agent's 10,000 large files.
constexpr std::size_t kMagicBytesMax = 256 * 1024;

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};
using DirPtr = std::unique_ptr<DIR, DirCloser>;

// Opens the directory `name` under `parent` for reading, never through a symlink. Returns null
// (and takes care of the fd) on failure.
DirPtr open_subdir(int parent, const char* name) {
  UniqueFd fd(::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) return nullptr;
  DIR* d = ::fdopendir(fd.get());
  if (d == nullptr) return nullptr;
  (void)fd.release();  // the DIR owns it now
  return DirPtr(d);
}

std::int64_t mtime_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// One libmagic cookie per thread: magic_t is not thread-safe, and loading the database once per
// thread (it is mmapped, so the pages are shared) beats a global lock around every lookup.
class MagicCookie {
 public:
  MagicCookie() : cookie_(::magic_open(MAGIC_MIME_TYPE | MAGIC_NO_CHECK_COMPRESS)) {
    if (cookie_ == nullptr) {
      spdlog::warn("artifacts: magic_open failed: errno {}", errno);
      return;
    }
    if (::magic_load(cookie_, nullptr) != 0) {
      spdlog::warn("artifacts: magic_load failed: {}", ::magic_error(cookie_));
      ::magic_close(cookie_);
      cookie_ = nullptr;
      return;
    }
    const std::size_t bytes_max = kMagicBytesMax;
    ::magic_setparam(cookie_, MAGIC_PARAM_BYTES_MAX, &bytes_max);
  }
  ~MagicCookie() {
    if (cookie_ != nullptr) ::magic_close(cookie_);
  }
  MagicCookie(const MagicCookie&) = delete;
  MagicCookie& operator=(const MagicCookie&) = delete;

  magic_t get() const { return cookie_; }

 private:
  magic_t cookie_;
};

// Opens `rel` under `dir_fd` for sniffing. SECURITY: RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, so no
// component (not only the last) may be a symlink and nothing outside the dir can be opened even
// if the agent swapped a directory for a symlink since the snapshot. O_NONBLOCK: a FIFO swapped
// in cannot hang us (and is dropped by the S_ISREG check).
UniqueFd open_beneath(int dir_fd, const std::string& rel) {
  open_how how{};
  how.flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  for (;;) {
    int fd = static_cast<int>(::syscall(SYS_openat2, dir_fd, rel.c_str(), &how, sizeof(how)));
    if (fd < 0 && errno == EAGAIN) continue;  // a concurrent rename raced the walk; retry
    return UniqueFd(fd);
  }
}

}  // namespace

std::string detect_mime_type(int fd) {
  static thread_local MagicCookie cookie;
  if (cookie.get() == nullptr) return kUnknownMime;
  const char* type = ::magic_descriptor(cookie.get(), fd);
  if (type == nullptr || *type == '\0') return kUnknownMime;
  return type;
}

Result<TreeSnapshot> snapshot_tree(int dir_fd, const SnapshotLimits& limits) {
  TreeSnapshot snap;
  DirPtr root = open_subdir(dir_fd, ".");
  if (!root) return fail_errno(errno, "opendir(artifact dir)");

  struct Level {
    DirPtr dir;
    std::string prefix;  // relative path of this dir, "" or ending in '/'
    int depth;
  };
  std::vector<Level> stack;  // depth-first; at most max_depth + 1 open directories
  stack.push_back(Level{std::move(root), std::string(), 0});
  std::size_t entries = 0;
  while (!stack.empty()) {
    DIR* dir = stack.back().dir.get();
    errno = 0;
    const dirent* e = ::readdir(dir);
    if (e == nullptr) {
      // End of the directory, or a read error (e.g. removed under us): either way, move on.
      stack.pop_back();
      continue;
    }
    const char* name = e->d_name;
    if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
    if (++entries > limits.max_entries) {
      snap.complete = false;
      break;
    }
    struct stat st;
    if (::fstatat(::dirfd(dir), name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;  // gone
    std::string rel = stack.back().prefix + name;
    if (S_ISREG(st.st_mode)) {
      if (snap.files.size() >= limits.max_files) {
        snap.complete = false;
        break;
      }
      snap.files.emplace(std::move(rel), FileStamp{.size = static_cast<std::uint64_t>(st.st_size),
                                                   .mtime_ns = mtime_ns(st),
                                                   .dev = st.st_dev,
                                                   .ino = st.st_ino});
    } else if (S_ISDIR(st.st_mode)) {
      const int depth = stack.back().depth + 1;
      if (depth > limits.max_depth) {
        snap.complete = false;
        continue;
      }
      DirPtr sub = open_subdir(::dirfd(dir), name);
      if (!sub) continue;  // unreadable or replaced by a symlink since the fstatat
      rel += '/';
      stack.push_back(Level{std::move(sub), std::move(rel), depth});
    }
    // Symlinks, FIFOs, sockets, devices: not artifacts.
  }
  return snap;
}

std::vector<Artifact> diff_artifacts(const TreeSnapshot& before, const TreeSnapshot& after,
                                     int dir_fd, std::string_view artifact_dir) {
  std::vector<Artifact> out;
  std::string prefix(artifact_dir);
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  if (prefix != "/") prefix += '/';
  for (const auto& [rel, stamp] : after.files) {
    auto it = before.files.find(rel);
    if (it != before.files.end() && it->second == stamp) continue;
    UniqueFd fd = open_beneath(dir_fd, rel);
    if (!fd) continue;  // removed since, or a symlink now
    struct stat st;
    if (::fstat(fd.get(), &st) < 0 || !S_ISREG(st.st_mode)) continue;
    out.push_back(Artifact{.path = prefix + rel,
                           .size = static_cast<std::uint64_t>(st.st_size),
                           .mime_type = detect_mime_type(fd.get())});
  }
  // after.files is a map ordered by rel, and every path shares the prefix: already sorted.
  return out;
}

}  // namespace agentbox::sandbox
