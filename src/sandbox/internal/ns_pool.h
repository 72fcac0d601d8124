#pragma once
// The ns backend's warm pool (NsBackendOptions::pool_size; config `pool`): boxes started ahead
// and bound to a session when it is created, so a create pays for the binding only (a few
// syscalls and one helper thread) instead of a box start (namespaces, the mount plan, the init).
//
// A pooled box is started as a fresh one is (linux/box.h), with what no session decides: its
// namespaces, init, seccomp filter, capabilities, hostname, the system dirs, /etc, /tmp, /cache,
// /mnt, /proc and /dev, and a cgroup of its own (named "pool-<n>") with the built-in limits. Two
// things differ until it is bound: its root stays writable (BoxSpec::root_read_only = false)
// and /workspace is an empty mountpoint (BoxFsSpec::pooled). Binding it (bind_pooled_box) gives
// it everything a fresh box of that session would have had from its start, before any command
// runs in it:
//   /etc/passwd, /etc/group  rewritten for the session's uid/gid (the uid is per command: the
//                            init starts each command as the uid of its request)
//   workspace, binds         attached with move_mount from a helper thread in the box's mount
//                            namespace (linux/host_binds.h attach_session), prepared in the
//                            daemon exactly as the mount plan prepares them (idmapped when rw)
//   /tmp                     reconfigured to the session's size
//   "/"                      made read-only, as step kRootReadOnly does in a fresh box
//   cgroup limits            memory, cpu and pids written (Cgroup::set_limits)
//   rlimits                  nofile and fsize of the init set with prlimit (commands inherit)
//   scheduling               the init's nice value back to the daemon's (the pool starts boxes
//                            at nice +10 so that refilling never competes with the exec path)
// The session's env and network mode are applied after either kind of start by the same code
// (NsSandbox, start_network). tests/sandbox/ns_pool_test.cc compares a pooled and a fresh box
// field by field.
//
// Refill: one thread of the pool (PR_SET_PDEATHSIG ties a box to the thread that started it, so
// the thread lives as long as the backend's Core) starts one box at a time, at nice +10, until
// `size` boxes are ready; a take() wakes it. A start that fails is retried after a back-off.

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/unique_fd.h"
#include "linux/box.h"
#include "linux/cgroup.h"
#include "linux/mounts.h"
#include "linux/pooled_box.h"
#include "linux/rlimits.h"

namespace agentbox::sandbox::ns_detail {

struct Core;

// A box of the pool: running, not yet anyone's.
struct PooledBox {
  std::unique_ptr<linux::Cgroup> cgroup;
  std::unique_ptr<linux::Box> box;
  UniqueFd root;   // /proc/<init>/root, O_PATH
  UniqueFd mntns;  // /proc/<init>/ns/mnt
};

class BoxPool {
 public:
  // Starts the refill thread; `core` outlives the pool (it owns it).
  BoxPool(Core& core, std::size_t size);
  // Stops the refill and kills the boxes not taken.
  ~BoxPool();
  BoxPool(const BoxPool&) = delete;
  BoxPool& operator=(const BoxPool&) = delete;

  // A ready box, or nothing when the pool is empty (the caller starts a fresh one). Wakes the
  // refill either way.
  std::optional<PooledBox> take();
  // Boxes ready now.
  std::size_t ready() const;
  std::size_t size() const { return size_; }
  // The nice value a bound box's init gets back (the daemon's when the pool was made).
  int base_nice() const { return base_nice_; }

 private:
  void run();
  Result<PooledBox> start_one();

  Core& core_;
  const std::size_t size_;
  const int base_nice_;  // the daemon's: a bound box's init gets it back
  std::uint64_t seq_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PooledBox> ready_;  // guarded by mu_
  bool stop_ = false;            // guarded by mu_
  std::thread thread_;           // last: starts once the members above exist
};

// What a bound box must get from its session (see above).
struct PoolBinding {
  linux::BoxFsSpec fs;  // uid, gid, workspace, binds and tmp_bytes, as for plan_box_fs
  linux::CgroupLimits limits;
  linux::BoxRlimits rlimits;
};

// The session's workspace and binds, prepared in the daemon as plan_box_fs prepares them,
// before a box is taken: the errors of the session's own making (a missing host path, a rw bind
// that cannot be idmapped) come from here, with plan_box_fs's messages.
[[nodiscard]] Result<linux::SessionMounts> prepare_session_mounts(const linux::BoxFsSpec& fs);

// Binds `pb` to a session. An error leaves it half bound: the caller discards it. Blocking.
[[nodiscard]] Status bind_pooled_box(PooledBox& pb, linux::SessionMounts mounts,
                                     const PoolBinding& b, int nice);

}  // namespace agentbox::sandbox::ns_detail
