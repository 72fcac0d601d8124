#pragma once
// Watching a directory of a box for changes (inotify), for the E2B dialect's WatchDir: events
// named relative to the watched directory, typed like fsnotify's (what E2B's envd reports), and,
// with `recursive`, every directory below it too, including ones created or moved in later.
//
// The directory comes in as an fd the backend opened through its RootedFs (Sandbox::open_dir),
// so the agent's path was resolved inside the box. Directories below it are opened from that fd
// with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS), by names the
// kernel reported: a symlink is never followed, and nothing outside the tree is watched. inotify
// watches inodes, so changes made inside the box (another mount namespace, an overlayfs
// workspace) arrive as they would for a host process.
//
// A directory created (or moved in) under a recursive watch is watched from when its event is
// read; what was already in it by then is reported as created, so nothing made in the gap is
// missed (some of it may be reported twice).
//
// The temp files of the file API's atomic writes (rooted_fs.h) are not reported: a write through
// it shows as the creation of its file (the rename onto it), as if the file appeared whole.
//
// Threading: a DirWatch is used by one thread at a time. read() never blocks (the inotify fd is
// non-blocking): wait for fd() to be readable, then read().

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"

namespace agentbox::sandbox {

// fsnotify's operations (one inotify event may map to one of them).
enum class WatchOp { kCreate, kWrite, kRemove, kRename, kChmod };

struct WatchEvent {
  std::string name;  // relative to the watched directory ("a.txt", "sub/b.txt"; "" = itself)
  WatchOp op = WatchOp::kCreate;
  bool is_dir = false;
};

struct DirWatchOptions {
  bool recursive = false;
  // Directories watched at most (each costs a kernel watch): a tree with more is ETOOBIG.
  std::size_t max_dirs = 8192;
};

class DirWatch {
 public:
  // Starts watching the directory `dir` (any fd of it; the DirWatch owns it). `shown` is the
  // agent's spelling of its path, for error messages.
  [[nodiscard]] static Result<std::unique_ptr<DirWatch>> open(UniqueFd dir, std::string shown,
                                                              DirWatchOptions opts = {});

  // The inotify fd: readable when events are waiting.
  int fd() const { return inotify_.get(); }

  // Appends the waiting events (none when nothing is waiting). Returns false once the watched
  // directory itself is gone (removed, or its filesystem unmounted): nothing more will come.
  // A recursive watch holds an fd of the directory (to open what appears below it), so its
  // removal shows only as the removal of everything in it.
  // A lost event (the kernel's queue overflowed) is an EUNAVAILABLE error.
  [[nodiscard]] Result<bool> read(std::vector<WatchEvent>* out);

  std::size_t watched_dirs() const { return paths_.size(); }

 private:
  DirWatch(UniqueFd dir, UniqueFd inotify, std::string shown, DirWatchOptions opts);
  // Watches every directory below `rel` (relative to the root; "" = the root), and `rel` itself
  // when add_self; what it finds there goes to *found (when not null) as created. A directory
  // gone meanwhile is skipped.
  Status add_tree(const std::string& rel, bool add_self, std::vector<WatchEvent>* found);
  Status add_one(const std::string& rel, int* wd_out);
  void drop_tree(const std::string& rel);

  UniqueFd root_;  // the watched directory; recursive watches only
  UniqueFd inotify_;
  std::string shown_;
  DirWatchOptions opts_;
  int root_wd_ = -1;
  bool gone_ = false;
  std::map<int, std::string> paths_;  // watch descriptor -> relative path
};

}  // namespace agentbox::sandbox
