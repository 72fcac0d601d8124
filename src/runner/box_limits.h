#pragma once
// The session limits agentbox-runner enforces (docs/runner-protocol.md "Limits"): memory_mb and
// max_pids, through a cgroup of its own per box (the session a request names in `box`), when it
// runs as root on Linux with the memory and pids controllers: cgroup v2 where they are enabled
// at its root, else the v1 memory and pids hierarchies. Otherwise it enforces only the per-request
// "timeout" and "output_cap", and says so in its register (enforces()).
//
// These are a few file writes, not the daemon's isolation code (runner/ links none of linux/):
//   v2: <root>/agentbox-runner-<pid>/<box>            memory.max, memory.swap.max, pids.max
//   v1: <memory>/agentbox-runner-<pid>/<box>          memory.limit_in_bytes (+ memsw when there)
//       <pids>/agentbox-runner-<pid>/<box>            pids.max
// A box's cgroup is made (its limits written) when a command of it starts and removed when its
// last command has been reaped; the runner's own parent dir goes at exit (close()), after killing
// what is still in it. The runner's pid in the name keeps two runners on one host apart.
//
// Thread-safe.

#include <sys/types.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "runner/protocol.h"

namespace agentbox::runner {

class BoxCgroups {
 public:
  // Probes the host (root? which controllers where?) once.
  BoxCgroups();
  ~BoxCgroups() { close(); }
  BoxCgroups(const BoxCgroups&) = delete;
  BoxCgroups& operator=(const BoxCgroups&) = delete;

  // What the register frame says this runner enforces (proto::enforce:: names).
  std::vector<std::string> enforces() const;

  // A command of `limits.box` is about to start: its box cgroup exists with the limits written,
  // and the returned fds are its cgroup.procs files (the child writes "0" to each before exec;
  // spawn.h SpawnSpec::join_fds). Call release(box) once the command has been reaped (also when
  // spawning failed). No limits: nothing (no fds, no release needed). ENOTSUP naming a limit
  // this runner does not enforce; EIO when a cgroup write fails.
  Result<std::vector<UniqueFd>> acquire(const proto::BoxLimits& limits);
  void release(const std::string& box);

  // Kills what is left in the boxes and removes every cgroup this runner made. Idempotent.
  void close();

 private:
  std::vector<std::string> box_dirs(const std::string& box) const;
  bool v2_ = false;
  std::vector<std::string> parents_;  // v2: one dir; v1: memory's, then pids'
  bool memsw_ = false;                // v1: memory.memsw.limit_in_bytes exists
  std::mutex mu_;
  std::map<std::string, int> users_;  // box -> commands of it alive
  bool made_parents_ = false;
};

}  // namespace agentbox::runner
