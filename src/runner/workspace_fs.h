#pragma once
// The runner's file operations, confined to its workspace (PROTOCOLS.md 1.3 file requests).
//
// SECURITY: unlike xbot's string-prefix guard (PROTOCOLS.md 1.5), every path is opened with
// openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) from the workspace's directory fd, so
// "/ws2/x" for workspace "/ws", "../../etc/passwd", a symlink out (to read, to create a new file
// through, to mkdir through) and a rename racing the walk all fail with EPERM. Entries that are
// created or removed are acted on by name relative to their parent's fd.
//
// Threading: immutable after open(); any number of threads may call it. Calls block.

#include <sys/types.h>

#include <string>

#include "common/error.h"
#include "common/unique_fd.h"
#include "runner/protocol.h"

namespace agentbox::runner {

class WorkspaceFs {
 public:
  // `dir` must exist; it is resolved (realpath) once.
  static Result<WorkspaceFs> open(const std::string& dir);

  const std::string& path() const { return path_; }
  int root_fd() const { return root_.get(); }

  // The agent's path relative to the workspace ("" is the workspace itself): a relative path is
  // joined to the workspace, the result cleaned lexically. A path outside is kAccess with xbot's
  // message `path "P" (resolved to "R") escapes workspace "W"`.
  Result<std::string> relative(const std::string& p) const;
  // openat2 of the agent's path beneath the workspace; escapes are kAccess (xbot's message).
  Result<UniqueFd> open_at(const std::string& p, int flags, mode_t mode = 0) const;
  // A directory for a child's cwd (O_PATH|O_DIRECTORY); missing or not a directory is an error.
  Result<UniqueFd> open_dir(const std::string& p) const;

  Result<std::string> read_file(const std::string& p) const;
  // Creates or truncates, as Go's os.WriteFile; `perm` (Go FileMode) applies on creation.
  Status write_file(const std::string& p, std::string_view data, std::uint32_t perm) const;
  Result<proto::FileInfo> stat(const std::string& p) const;
  Result<proto::DirEntries> read_dir(const std::string& p) const;
  Status mkdir_all(const std::string& p, std::uint32_t perm) const;
  Status remove(const std::string& p) const;
  // A missing path is fine.
  Status remove_all(const std::string& p) const;

  // An atomic writer for a chunked upload: a temp file beside the target, renamed over it by
  // commit(); dropped uncommitted, the temp file goes.
  class Writer {
   public:
    Writer() = default;
    Writer(Writer&&) noexcept;
    Writer& operator=(Writer&&) noexcept;
    ~Writer();
    Status write(std::string_view data);
    Status commit();
    std::int64_t written() const { return written_; }

   private:
    friend class WorkspaceFs;
    UniqueFd dir_, fd_;
    std::string tmp_, name_, shown_;
    std::int64_t written_ = 0;
    std::int64_t flushed_ = 0;  // bytes whose writeback was started (sync_file_range)
  };
  Result<Writer> create(const std::string& p, std::uint32_t perm) const;

 private:
  WorkspaceFs(UniqueFd root, std::string path) : root_(std::move(root)), path_(std::move(path)) {}
  // The parent's fd and the final name; the workspace itself has no name (kAccess).
  Result<std::pair<UniqueFd, std::string>> parent_of(const std::string& p, const char* op) const;
  Error escape(const std::string& p, const std::string& resolved) const;
  Error os_error(int err, const char* op, const std::string& p) const;

  UniqueFd root_;
  std::string path_;
};

}  // namespace agentbox::runner
