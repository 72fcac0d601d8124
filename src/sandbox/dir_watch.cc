#include "sandbox/dir_watch.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <deque>

#include "common/paths.h"
#include "linux/sys.h"
#include "sandbox/path.h"
#include "sandbox/rooted_fs.h"

namespace agentbox::sandbox {
namespace {

// fsnotify's set: what E2B's envd asks the kernel for.
constexpr std::uint32_t kMask = IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |
                                IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR;

std::string join(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (name.empty()) return dir;
  return dir + "/" + std::string(name);
}


}  // namespace

DirWatch::DirWatch(UniqueFd dir, UniqueFd inotify, std::string shown, DirWatchOptions opts)
    : root_(std::move(dir)), inotify_(std::move(inotify)), shown_(std::move(shown)), opts_(opts) {}

Result<std::unique_ptr<DirWatch>> DirWatch::open(UniqueFd dir, std::string shown,
                                                 DirWatchOptions opts) {
  struct stat st {};
  if (::fstat(dir.get(), &st) != 0) return fail_errno(errno, "watch(" + shown + ")");
  if (!S_ISDIR(st.st_mode)) {
    return fail(Code::kNotDir, "watch(" + printable_path(shown) + "): not a directory");
  }
  UniqueFd in(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!in) return fail_errno(errno, "inotify_init1");
  std::unique_ptr<DirWatch> w(new DirWatch(std::move(dir), std::move(in), std::move(shown), opts));
  if (auto s = w->add_one("", &w->root_wd_); !s) return std::unexpected(s.error());
  if (opts.recursive) {
    if (auto s = w->add_tree("", /*add_self=*/false, nullptr); !s) return std::unexpected(s.error());
  } else {
    // Nothing more to open from it; and an fd held on the directory would keep the kernel
    // from reporting its removal (IN_DELETE_SELF comes when the last reference goes).
    w->root_.reset();
  }
  return w;
}

Status DirWatch::add_one(const std::string& rel, int* wd_out) {
  *wd_out = -1;
  // SECURITY: `rel` is made of names the kernel reported under the root; no symlink is followed
  // on the way and nothing above the root is reached, whatever the box did meanwhile.
  const int fd = linux::sys::openat2_raw(root_.get(), rel.empty() ? "." : rel.c_str(),
                                         O_PATH | O_DIRECTORY,
                                         RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
                                             RESOLVE_NO_MAGICLINKS);
  if (fd < 0) {
    // Gone (or replaced by a symlink or a file) since it was reported: nothing to watch.
    if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP || errno == EXDEV) return {};
    return fail_errno(errno, "watch(" + printable_path(join(shown_, rel)) + ")");
  }
  UniqueFd dir(fd);
  if (paths_.size() >= opts_.max_dirs) {
    return fail(Code::kTooBig, "watch(" + printable_path(shown_) + "): more than " +
                                   std::to_string(opts_.max_dirs) +
                                   " directories to watch; watch a smaller tree");
  }
  // inotify_add_watch takes a path, not an fd: the fd's /proc/self/fd link names exactly the
  // directory opened above (the daemon's own fd table, not a path the box controls).
  std::string proc = "/proc/self/fd/" + std::to_string(dir.get());
  int wd = ::inotify_add_watch(inotify_.get(), proc.c_str(), kMask);
  if (wd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return {};
    if (errno == ENOSPC) {
      return fail(Code::kQuota, "watch(" + printable_path(shown_) +
                                    "): the kernel's limit of inotify watches is reached "
                                    "(fs.inotify.max_user_watches)");
    }
    return fail_errno(errno, "inotify_add_watch(" + printable_path(join(shown_, rel)) + ")");
  }
  // The same directory twice (a bind mount of it below itself) keeps its first name.
  paths_.emplace(wd, rel);
  *wd_out = wd;
  return {};
}

Status DirWatch::add_tree(const std::string& rel, bool add_self, std::vector<WatchEvent>* found) {
  std::deque<std::string> todo{rel};
  bool self = true;
  while (!todo.empty()) {
    std::string cur = std::move(todo.front());
    todo.pop_front();
    if (!self || add_self) {
      int wd;
      if (auto s = add_one(cur, &wd); !s) return s;
      if (wd < 0) {
        self = false;
        continue;
      }
    }
    self = false;
    const int fd = linux::sys::openat2_raw(root_.get(), cur.empty() ? "." : cur.c_str(),
                                           O_PATH | O_DIRECTORY,
                                           RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
                                               RESOLVE_NO_MAGICLINKS);
    if (fd < 0) continue;  // gone meanwhile
    UniqueFd dir(fd);
    auto entries = linux::sys::read_dir(dir.get(), join(shown_, cur), opts_.max_dirs * 64);
    if (!entries) continue;  // unreadable or gone: its own events still come
    for (const auto& e : *entries) {
      bool is_dir = e.type == DT_DIR;
      if (e.type == DT_UNKNOWN) {
        struct stat st {};
        is_dir = ::fstatat(dir.get(), e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                 S_ISDIR(st.st_mode);
      }
      if (is_dir) todo.push_back(join(cur, e.name));
      if (found) found->push_back({join(cur, e.name), WatchOp::kCreate, is_dir});
    }
  }
  return {};
}

void DirWatch::drop_tree(const std::string& rel) {
  for (auto it = paths_.begin(); it != paths_.end();) {
    if (it->first != root_wd_ && paths::at_or_under(it->second, rel)) {
      ::inotify_rm_watch(inotify_.get(), it->first);
      it = paths_.erase(it);
    } else {
      ++it;
    }
  }
}

Result<bool> DirWatch::read(std::vector<WatchEvent>* out) {
  if (gone_) return false;
  alignas(struct inotify_event) char buf[64 << 10];
  for (;;) {
    ssize_t n = ::read(inotify_.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      return fail_errno(errno, "read(inotify)");
    }
    for (ssize_t off = 0; off < n;) {
      const auto* ev = reinterpret_cast<const struct inotify_event*>(buf + off);
      off += static_cast<ssize_t>(sizeof(struct inotify_event) + ev->len);
      if (ev->mask & IN_Q_OVERFLOW) {
        return fail(Code::kUnavailable, "watch(" + printable_path(shown_) +
                                            "): the kernel's event queue overflowed; events "
                                            "were lost");
      }
      auto it = paths_.find(ev->wd);
      if (it == paths_.end()) continue;  // a watch dropped a moment ago
      const std::string dir = it->second;
      const bool is_root = ev->wd == root_wd_;
      if (ev->mask & IN_IGNORED) {
        paths_.erase(it);
        if (is_root) {
          gone_ = true;
          return false;
        }
        continue;
      }
      // A directory below the root reports its own removal and move through its parent too:
      // only the root's self events are news.
      if ((ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) && !is_root) continue;
      if (ev->mask & IN_UNMOUNT) continue;
      std::string_view name = ev->len ? std::string_view(ev->name) : std::string_view{};
      // The file API's atomic writes: their temp files are noise; the rename that ends one
      // reports the file itself.
      if (name.starts_with(kAtomicTempPrefix)) continue;
      WatchEvent we;
      we.name = join(dir, name);
      we.is_dir = (ev->mask & IN_ISDIR) != 0 || (is_root && name.empty());
      if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
        we.op = WatchOp::kCreate;
      } else if (ev->mask & (IN_MOVED_FROM | IN_MOVE_SELF)) {
        we.op = WatchOp::kRename;
      } else if (ev->mask & IN_ATTRIB) {
        we.op = WatchOp::kChmod;
      } else if (ev->mask & IN_MODIFY) {
        we.op = WatchOp::kWrite;
      } else if (ev->mask & (IN_DELETE | IN_DELETE_SELF)) {
        we.op = WatchOp::kRemove;
      } else {
        continue;
      }
      if (opts_.recursive && we.is_dir && !name.empty()) {
        if (we.op == WatchOp::kCreate) {
          // What was made in it before its watch was there is reported as created now.
          std::vector<WatchEvent> found;
          if (auto s = add_tree(we.name, /*add_self=*/true, &found); !s) {
            return std::unexpected(s.error());
          }
          out->push_back(std::move(we));
          for (auto& f : found) {
            if (!std::string_view(f.name).substr(f.name.find_last_of('/') + 1)
                     .starts_with(kAtomicTempPrefix)) {
              out->push_back(std::move(f));
            }
          }
          continue;
        }
        if (we.op == WatchOp::kRename) drop_tree(we.name);
      }
      out->push_back(std::move(we));
    }
  }
}

}  // namespace agentbox::sandbox
