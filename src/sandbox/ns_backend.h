#pragma once
// The `ns` backend (shared/DESIGN.md "The ns backend"): every session gets a box of its own
// (linux/box.h: namespaces, a read-only system, a writable /workspace, its own uid, cgroup
// limits, seccomp) whose pid 1, agentbox-init, forks each command on request. A command costs a
// fork+exec inside the box and no namespace setup.
//
// Daemon side, per backend:
//   - a "spawner" thread that clones every box: PR_SET_PDEATHSIG fires when the THREAD that
//     created a box exits, so boxes are made on a thread that lives as long as the backend;
//   - an "io" thread running an io_context for the boxes' egress proxies (and, when no control
//     executor is given, the control sockets). No thread per box or per exec.
// Every box's control socket (start and exit reports of commands) is read on the control
// executor (NsBackendOptions::control): in the daemon its network thread, where the execs and
// processes waiting for those reports run, so a report costs no thread hop.
// Per exec: stdio pipes made by the daemon and passed to the init (SCM_RIGHTS); a per-exec child
// cgroup the command joins before it execs (so kill_tree() reaches everything it started, also
// setsid()/double-forked/SIGTERM-ignoring children); the shared exec runner (exec_runner.h) does
// the I/O on the caller's executor. Background jobs an exec leaves are moved to the box cgroup
// when it finishes and live until the box is shut down.
//
// Network mode "allowlist" (BoxConfig::egress_policy): once the box's init exists, a
// net::BoxEgress listens at 127.0.0.1:3128 inside the box's netns, served on the backend's io
// thread; it stops when the box shuts down (suspend, destroy), and a resumed box starts its own.
// The proxy variables (BoxEgress::box_env) are in every command's and process's environment.
// Network mode "open" (BoxConfig::open_network): once the init exists, a net::OpenEgress gives
// its netns a veth with a filtered route out (net/open_egress.h); it is deleted when the box
// shuts down, and a resumed box gets a new one. Sandbox::set_network switches a running box
// between the three modes in its existing netns (sandbox/ns_network.h), and the proxy variables
// are added to each command's environment as it starts, exactly while the mode is allowlist.
// Sandbox::set_limits writes new memory/cpu/pids limits into the box cgroup in place.
//
// Processes (Sandbox::processes(), process_table.h) start the same way as an exec (a request to
// the init, a per-process cgroup the child self-joins, pipes or a pty in the box's own devpts
// passed by SCM_RIGHTS), but the daemon keeps them: their output goes to ring buffers read with
// Asio on the caller's executor, signals go through the init (which alone knows, race-free,
// whether the leader's pid is still its), and the end of the leader kills its cgroup.
//
// File operations resolve in-box paths with RootedFs (RESOLVE_IN_ROOT) from the box's root
// (/proc/<init>/root), so they see exactly what commands see, read-only mounts included, and
// run with the session's fsuid/fsgid: what the agent cannot read or write with a command, it
// cannot with the file API either, and what it creates is owned by the session user.

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "common/error.h"
#include "net/policy.h"
#include "sandbox/sandbox.h"

namespace agentbox::sandbox {

struct NsBackendOptions {
  // The daemon's runtime dir (e.g. <data_dir>/run); created if missing. Holds the empty
  // directory box roots are attached to (inside each box's own mount namespace).
  std::string runtime_dir;
  // agentbox-init; empty means "agentbox-init" beside /proc/self/exe.
  std::string init_path;
  // cgroup hierarchy root and the parent cgroup of every box. The default parent is
  // "agentbox-<hash of runtime_dir>", so two daemons with different data dirs on one host never
  // remove each other's boxes as stale.
  std::string cgroup_root = "/sys/fs/cgroup";
  std::string cgroup_parent;
  // OOM preference: the daemon asks for -1000 for itself (needs CAP_SYS_RESOURCE; a warning
  // otherwise), box inits get init_oom_score_adj, commands command_oom_score_adj.
  bool protect_daemon_from_oom = true;
  int init_oom_score_adj = 100;
  int command_oom_score_adj = 500;
  // Box defaults (BoxConfig::limits override memory, cpu, pids and open files).
  std::uint64_t tmp_bytes = 256ull << 20;
  std::uint64_t tmp_inodes = 65536;
  // Seed 004: the size of every box's /cache tmpfs, where the package caches live (XDG_CACHE_HOME,
  // PIP_CACHE_DIR, UV_CACHE_DIR, npm_config_cache, BUN_INSTALL_CACHE_DIR point there); its
  // pages are memory charged to the box, not disk in its quota. 0 = no /cache.
  std::uint64_t cache_bytes = 512ull << 20;
  // Where sandboxes run the blocking steps of an exec (artifact scans, releasing the exec
  // cgroup): the daemon's worker pool. Empty: on the exec's own executor (tests).
  boost::asio::any_io_executor blocking;
  // Where box control sockets are read: the executor execs and processes run on (the daemon's
  // network thread; one thread), so a command's start and exit reports reach them without a
  // hop between threads. Its io_context may be destroyed before the sandboxes (their readers'
  // descriptors go with it), but must not be destroyed while it still runs. With a control
  // executor, the rare start report that makes the daemon move the child into its cgroup (no
  // cgroup self-join, e.g. cgroup v2) is handled on `blocking`, never on the network thread.
  // Empty: the backend's own io thread (tests that run their io_context only until their
  // exec is done).
  boost::asio::any_io_executor control;
  // Dirs put first in every box's PATH ("a:b"; seed 001's --toolchain-path). "" = none.
  std::string path_prefix;
  // Daemon-wide network settings for boxes with an egress proxy (config `network`; its
  // daemon_ports hold the daemon's own ports). Null: the defaults (no hosts, no private ranges).
  std::shared_ptr<const net::NetworkConfig> network;
  // Boxes kept started ahead (sandbox/internal/ns_pool.h), bound to a session at create; the
  // pool refills in the background, one box at a time at nice +10. 0: no pool (every box starts
  // at its session's create or resume).
  std::size_t pool_size = 0;
};

// Builds the backend. Fails only on unusable options; whether this host can run boxes is
// check_usable()'s answer (create() fails with the same message). Removes box cgroups a previous
// daemon with the same cgroup parent left behind.
[[nodiscard]] Result<std::unique_ptr<Backend>> make_ns_backend(NsBackendOptions opts);

// The uid (== gid) a box gets when BoxConfig::uid is 0: FNV32(key) % 60000 + 10000. The session
// layer normally allocates and persists uids itself (collision-free); this is the fallback.
uid_t default_box_uid(std::string_view key);

}  // namespace agentbox::sandbox
