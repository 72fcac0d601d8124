#pragma once
// Starting a command directly on the host (the `host` backend, and anything else that runs a
// plain child of the daemon): posix_spawn (glibc's clone(CLONE_VM|CLONE_VFORK), so the cost does
// not grow with the daemon's memory), the child in its own process group, stdio on fresh
// O_CLOEXEC pipes, waited for through a pidfd registered with the caller's executor.

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "sandbox/process.h"

namespace agentbox::sandbox {

struct LaunchSpec {
  std::vector<std::string> argv;  // argv[0] without '/' is looked up in the PATH of `env`
  std::string cwd;                // host path; "" = the daemon's cwd. Ignored when cwd_fd >= 0
  std::vector<std::string> env;   // the complete environment, "K=V"
  bool with_stdin = false;        // a stdin pipe; else the command's stdin is /dev/null
  // Borrowed, optional: a directory fd the child fchdir()s to. Preferred to `cwd` when the
  // directory was resolved safely (RootedFs::open_dir): no path is re-walked in the child.
  int cwd_fd = -1;
  // A pty slave path (/dev/pts/N): the child starts a new session and opens it as stdin (so it
  // becomes its controlling terminal), stdout and stderr; with_stdin is then ignored.
  std::string pty_slave;
};

// A command started on the host, or one that could not be (no such binary, not executable):
// that one has no pid, its stderr carries a shell-like message and wait() reports 127 or 126,
// so callers handle both the same way.
class HostProcess : public Process {
 public:
  // A started child `pid`, leader of process group `pid`; takes over its pidfd and registers it
  // with `ex`'s reactor.
  HostProcess(boost::asio::any_io_executor ex, pid_t pid, UniqueFd pidfd);
  // A command that never started.
  explicit HostProcess(boost::asio::any_io_executor ex, ExitStatus status);
  // Reaps the leader. If wait() never completed, kills the group first (the command is being
  // abandoned) and then blocks until the leader is gone, which SIGKILL makes prompt.
  ~HostProcess() override;

  boost::asio::awaitable<ExitStatus> wait() override;
  // SIGKILL to the process group. The leader stays a zombie until this object is destroyed, so
  // the group id cannot be recycled for another process while we may still signal it.
  void kill_tree() override;
  // To the leader; safe until this object is destroyed (the zombie keeps its pid).
  Status signal(int signo) override;

  // The process group id (= the leader's pid); 0 for a command that never started.
  pid_t pgid() const { return pid_; }

 private:
  int pidfd();

  pid_t pid_ = 0;
  boost::asio::posix::stream_descriptor pidfd_;  // owns the pidfd once registered
  UniqueFd fallback_pidfd_;  // the pidfd if the reactor refused it (wait() then blocks)
  ExitStatus status_;
  bool exited_ = false;  // the leader is a zombie (status_ is valid)
};

// Starts spec.argv. Failures of the command itself (ENOENT, EACCES, ENOEXEC without a usable
// shell) come back as a HostProcess that never started; an Error means the host could not start
// anything (EAGAIN/ENOMEM from fork, EMFILE, no pidfd support).
// The child gets: its own process group, an empty signal mask and default dispositions, stdio on
// the pipes (or /dev/null), every other fd closed, the given cwd and env.
Result<std::unique_ptr<HostProcess>> launch_host_process(boost::asio::any_io_executor ex,
                                                         LaunchSpec spec);

}  // namespace agentbox::sandbox
