#include "sandbox/artifacts.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <magic.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/unique_fd.h"
#include "linux/sys.h"

namespace agentbox::sandbox {
namespace {

constexpr const char* kUnknownMime = "application/octet-stream";
// libmagic reads this much of a file at most (its default is megabytes): plenty for the magic
// numbers MIME detection looks at, and it bounds the cost of an agent's 10,000 large files.
constexpr std::size_t kMagicBytesMax = 256 * 1024;

// Opens the directory `name` under `parent` for reading, never through a symlink.
UniqueFd open_subdir(int parent, const char* name) {
  return UniqueFd(
      ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
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
  return UniqueFd(linux::sys::openat2_raw(dir_fd, rel.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK,
                                          RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
                                              RESOLVE_NO_MAGICLINKS));
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
  UniqueFd root = open_subdir(dir_fd, ".");
  if (!root) return fail_errno(errno, "opendir(artifact dir)");

  struct Level {
    UniqueFd dir;
    std::vector<linux::sys::DirEntry> names;  // read whole, bounded by what max_entries has left
    std::size_t next = 0;
    std::string prefix;  // relative path of this dir, "" or ending in '/'
    int depth = 0;
  };
  std::vector<Level> stack;  // depth-first; at most max_depth + 1 open directories
  std::size_t entries = 0;
  // Pushes the directory `fd`; false when it holds more entries than the limit has left.
  auto push = [&](UniqueFd fd, std::string prefix, int depth) {
    auto names = linux::sys::read_dir(fd.get(), "artifact dir", limits.max_entries - entries);
    if (!names) {
      // Over the limit: incomplete. Unreadable (e.g. removed under us): move on.
      if (names.error().code == Code::kTooBig) return false;
      return true;
    }
    entries += names->size();
    stack.push_back(Level{std::move(fd), std::move(*names), 0, std::move(prefix), depth});
    return true;
  };
  if (!push(std::move(root), std::string(), 0)) {
    snap.complete = false;
    return snap;
  }
  while (!stack.empty()) {
    Level& top = stack.back();
    if (top.next == top.names.size()) {
      stack.pop_back();
      continue;
    }
    const std::string& name = top.names[top.next++].name;
    const int dir = top.dir.get();
    struct stat st;
    if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) continue;  // gone
    std::string rel = top.prefix + name;
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
      const int depth = top.depth + 1;
      if (depth > limits.max_depth) {
        snap.complete = false;
        continue;
      }
      UniqueFd sub = open_subdir(dir, name.c_str());
      if (!sub) continue;  // unreadable or replaced by a symlink since the fstatat
      rel += '/';
      // `top` and `name` may dangle once push() grows the stack: nothing below uses them.
      if (!push(std::move(sub), std::move(rel), depth)) {
        snap.complete = false;
        break;
      }
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
