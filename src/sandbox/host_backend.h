#pragma once
// The `host` backend: no isolation, for development and for machines where namespaces are not
// available. Same API as the isolated backends: commands run directly on the host as the daemon's
// user, in their own process group, with the workspace dir as their default cwd; file operations
// are confined to the workspace dir by RootedFs (openat2 RESOLVE_BENEATH), so the file API cannot
// reach outside it even though commands can.
//
// In-box paths are host paths: workspace() is the workspace dir's (canonical) host path. The
// alias "/workspace/..." is accepted too and maps to the same files.

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "sandbox/host_exec.h"
#include "sandbox/process_table.h"
#include "sandbox/rooted_fs.h"
#include "sandbox/sandbox.h"

namespace agentbox::sandbox {

class HostBackend : public Backend {
 public:
  // `blocking`: where sandboxes run their blocking steps of an exec (artifact scans): the
  // daemon's worker pool. Empty: on the exec's own executor (tests).
  // `path_prefix`: dirs put first in every command's PATH ("a:b"; --toolchain-path).
  explicit HostBackend(asio::any_io_executor blocking = {}, std::string path_prefix = "")
      : blocking_(std::move(blocking)), path_prefix_(std::move(path_prefix)) {}
  std::string_view name() const override { return "host"; }
  bool isolated() const override { return false; }  // the daemon's user, unconfined
  Status check_usable() override { return {}; }
  // config.workspace_dir must be an existing directory; uid/gid, limits and mounts are ignored
  // (this backend runs everything as the daemon's user, unconfined).
  Result<std::unique_ptr<Sandbox>> create(BoxConfig config) override;

 private:
  asio::any_io_executor blocking_;
  std::string path_prefix_;
};

class HostSandbox : public Sandbox, private ProcessLauncher {
 public:
  // `workspace`: canonical absolute host path of the workspace; `root`: an fd of it;
  // `blocking`: see HostBackend.
  HostSandbox(std::string workspace, UniqueFd root, std::map<std::string, std::string> env,
              asio::any_io_executor blocking = {});
  ~HostSandbox() override;

  std::string_view name() const override { return "host"; }
  std::string workspace() const override { return workspace_; }

  // Runs on the caller's executor. cwd must be an existing directory inside the workspace (an
  // Error naming it otherwise, never a silent fallback). Environment: a small base (PATH, HOME =
  // the workspace, LANG, TERM) + the box's env + spec.env, later ones winning. Cancelling the
  // awaiting coroutine kills the command's process group (Sandbox::exec).
  asio::awaitable<Result<ExecResult>> exec(ExecSpec spec, OutputSink* sink) override;

  // Processes run like execs (same cwd and environment rules), each in its own process group
  // (with a pty: its own session); killing one kills its group.
  ProcessTable* processes() override { return &procs_; }

  Result<FileReader> open_file(const std::string& path) override;
  Result<std::unique_ptr<FileWriter>> create_file(const std::string& path,
                                                  WriteOptions opts) override;
  Result<FileInfo> stat(const std::string& path) override;
  Result<std::vector<DirEntry>> read_dir(const std::string& path) override;
  Status mkdir_all(const std::string& path) override;
  Status remove(const std::string& path) override;
  Status remove_all(const std::string& path) override;
  Status rename(const std::string& from, const std::string& to) override;
  Result<UniqueFd> open_dir(const std::string& path) override;

  // Kills the process group of every command this sandbox started that may still have members
  // (background children of finished commands included). Idempotent; later calls fail with
  // EUNAVAILABLE.
  void shutdown() override;

 private:
  struct Mapped {
    std::string abs;  // normalised in-box path, as reported back (FileInfo::path, artifacts)
    std::string rel;  // relative to the workspace, for RootedFs ("" = the workspace itself)
  };
  // Normalises an API path and maps it into the workspace; EACCES outside it.
  Result<Mapped> map_path(std::string_view path) const;
  Status check_open() const;
  // exec() with the caller's throw-on-cancellation switched off.
  asio::awaitable<Result<ExecResult>> exec_uncancellable(ExecSpec spec, OutputSink* sink);
  // argv or command, cwd (resolved in the workspace, its fd into *cwd_fd) and the environment,
  // as exec and processes share them.
  Result<LaunchSpec> prepare_launch(std::vector<std::string> argv, std::string command,
                                    const std::string& cwd, std::map<std::string, std::string> env,
                                    bool pty, UniqueFd* cwd_fd);
  asio::awaitable<Result<Launched>> launch(ProcessSpec spec) override;

  // Process-group bookkeeping for shutdown(). A group is tracked from launch until it is seen
  // empty; `leader_reaped` says whether its id may have been recycled (see kill_groups_locked).
  // track_group returns false (and tracks nothing) once shut down.
  bool track_group(pid_t pgid);
  void command_finished(pid_t pgid);
  void kill_groups_locked();

  const std::string workspace_;
  const RootedFs fs_;
  const std::map<std::string, std::string> env_;
  const asio::any_io_executor blocking_;

  mutable std::mutex mu_;
  bool shut_down_ = false;                  // guarded by mu_
  std::unordered_map<pid_t, bool> groups_;  // pgid -> leader reaped; guarded by mu_
  ProcessTable procs_{*this};  // last: shut down (in ~HostSandbox) before the rest goes
};

}  // namespace agentbox::sandbox
