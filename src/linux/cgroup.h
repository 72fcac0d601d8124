#pragma once
// Per-box resource limits and process tracking with cgroups, v1 and v2.
//
// Layout (both versions): one parent cgroup per daemon, "<hierarchy>/agentbox" (the name is a
// driver parameter so tests never collide with a running daemon), one box cgroup per session
// below it, and optional per-exec children below the box:
//
//   v1: <v1_root>/{memory,cpu,pids,freezer}/agentbox/<box>[/<child>]   (mirrored in every
//       hierarchy; limits on the box dir in each; add_process writes every cgroup.procs)
//   v2: <unified_root>/agentbox/<box>/init     <- add_process() on the box puts pids here
//       <unified_root>/agentbox/<box>/<child>  <- make_child() leaves
//
// v2's no-internal-process rule: a cgroup that distributes a controller to children (has it in
// cgroup.subtree_control) may not hold processes itself. The box enables +memory +cpu +pids for
// its children (so per-exec leaves get memory.oom.group=1 and their own usage), so the box holds
// no process: Cgroup::add_process() on a v2 box cgroup moves the pid into the box's "init" leaf,
// created with the box. Children made by make_child() are leaves with no subtree controllers, so
// processes live in them directly (and make_child on a child works too, uncontrolled). The name
// "init" is therefore reserved for make_child on a v2 box. Consequence for CLONE_NEWCGROUP: a
// process that unshares its cgroup namespace after add_process() on a v2 box has <box>/init as
// its namespace root (on v1, <box>); per-exec leaves then show as "/../<child>" inside. Limits,
// kill and membership are unaffected: cgroup namespaces only change what paths look like.
//
// Limits are hierarchical: the box's memory/cpu/pids limits bound everything below it, children
// included. memory.oom.group on v2 exec leaves makes an OOM kill take that exec's whole process
// tree (not a random victim that leaves half a pipeline behind), never the init leaf's processes
// as a group.
//
// Nothing here is async-signal-safe: the daemon calls it before clone / after the box is up, and
// moves pids in from outside (add_process(host_pid)) rather than from the clone child.
// Thread-compatible: one owner per Cgroup object; distinct objects may be used concurrently.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"

namespace agentbox::linux {

struct CgroupLimits {
  std::uint64_t memory_bytes = 512ull << 20;  // RAM (+ swap: none beyond this, see drivers)
  std::uint32_t cpu_percent = 100;            // of one CPU; 200 = two CPUs' worth. 0 = unlimited
  std::uint32_t max_pids = 256;  // tasks (threads count) in the whole box. 0 = unlimited
};

// Kernel counters of why processes in a cgroup were stopped (API.md "Exec": killed_by). The
// daemon reads them before and after a command; an increase names the cause.
struct CgroupEvents {
  // OOM kills of processes in this cgroup. v2: memory.events `oom_kill` (this cgroup and its
  // descendants); v1: memory.oom_control `oom_kill` (Linux 4.13+; this cgroup only), or, on an
  // older kernel without that field, memory.failcnt (times the limit was hit: an approximation
  // the caller pairs with a SIGKILLed command).
  std::uint64_t oom_kills = 0;
  // Forks refused by a pids.max. pids.events `max`: on v1, and on v2 before Linux 6.12, counted
  // in the forking process's cgroup; on v2 since 6.12, in the cgroup whose limit was hit and its
  // ancestors. Read it on the exec's cgroup and on the box's to cover both.
  std::uint64_t pids_max = 0;
};

// What a cgroup uses now (API.md "Usage"): memory charged, CPU time since it was made (nullopt
// where the kernel does not count it: a v1 host whose cpu hierarchy has no cpuacct), tasks.
struct CgroupUsage {
  std::uint64_t memory_bytes = 0;
  std::optional<std::uint64_t> cpu_usec;
  std::uint64_t tasks = 0;
};

class Cgroup {
 public:
  virtual ~Cgroup() = default;

  // Moves the process (a host pid) into this cgroup: every hierarchy on v1; on a v2 box cgroup,
  // its "init" leaf (see above). Moving an already-dead pid fails with kNotFound (ESRCH).
  [[nodiscard]] virtual Status add_process(pid_t host_pid) = 0;

  // Nested cgroup, e.g. one per exec, for tracking and killing. name: [A-Za-z0-9._-]{1,64}, not
  // "." / "..". A leftover child of the same name is destroyed first. The child is owned by the
  // returned object only in the sense of destroy(); dropping the object leaves the directory
  // (the parent's destroy() removes it).
  [[nodiscard]] virtual Result<std::unique_ptr<Cgroup>> make_child(std::string_view name) = 0;

  // SIGKILLs everything in it and below, and waits (up to ~2 s) until it is empty.
  // v2: cgroup.kill when the kernel has it (5.14+), else freeze + kill loop + thaw.
  // v1: freezer FROZEN, SIGKILL each pid, THAWED, loop until empty.
  // A process that setsid()s, forks or ignores SIGTERM still dies. kTimedOut if pids remain.
  [[nodiscard]] virtual Status kill_all() = 0;

  // Files a process may write "0" into to move ITSELF into this cgroup (initproto.h,
  // kExecSelfJoin), opened for writing now: v1's per-hierarchy `tasks` files. Empty where the
  // driver has no such fast path (v2: moving a process takes the daemon's add_process()).
  [[nodiscard]] virtual Result<std::vector<UniqueFd>> open_self_join() { return {}; }

  // Moves every process in it and below into `target` (a cgroup of the same driver, e.g. the box
  // an exec child belongs to) with this cgroup frozen, so a process that forks meanwhile cannot
  // leave a child behind: v1 freezes with the freezer and moves each process into target's
  // freezer hierarchy last (the kernel thaws it there, by which time it is wholly in target);
  // v2 writes cgroup.freeze (a frozen task moved to an unfrozen cgroup is thawed). Thaws this
  // cgroup afterwards, also on failure. Processes that exit meanwhile are skipped. kTimedOut if
  // processes remain after ~2 s; kInvalid if target is from another driver.
  [[nodiscard]] virtual Status move_processes_to(Cgroup& target) = 0;

  // Every pid in it and below (host pids, sorted, no duplicates).
  [[nodiscard]] virtual Result<std::vector<pid_t>> pids() = 0;

  // Writes the memory, cpu and pids limits (a box cgroup, CgroupDriver::create; live changes of
  // a running box, API.md "Live changes to a session"). Lowering memory below what the box uses
  // makes the kernel reclaim: on v2 it OOM-kills when that is not enough (the write succeeds);
  // on v1 the write fails (EBUSY, returned as kExists naming the usage) and the old limit stays.
  // The memory limit is written first, so a failure there leaves all three as they were.
  // kNotSupported on a v2 exec child (limits belong to the box).
  [[nodiscard]] virtual Status set_limits(const CgroupLimits& limits) {
    (void)limits;
    return fail(Code::kNotSupported, "limits on " + describe());
  }

  // Bytes charged to it and below (v2 memory.current, v1 memory.usage_in_bytes).
  [[nodiscard]] virtual Result<std::uint64_t> memory_usage() = 0;

  // Memory, CPU time and tasks in it and below (v2: memory.current, cpu.stat usage_usec,
  // pids.current; v1: memory.usage_in_bytes, cpuacct.usage, pids.current).
  [[nodiscard]] virtual Result<CgroupUsage> usage() = 0;

  // The OOM-kill and fork-refusal counters (see CgroupEvents). A controller file that is missing
  // (a child of a child on v2 has no memory files) counts as 0.
  [[nodiscard]] virtual Result<CgroupEvents> events() = 0;

  // kill_all, then rmdir children (deepest first) and itself; idempotent (a second call, or a
  // call on an already-removed directory, succeeds).
  [[nodiscard]] virtual Status destroy() = 0;

  // Path(s), for messages.
  virtual std::string describe() const = 0;

  // A cgroup.procs file a pid can be written to (v2: the box's init leaf, or the child's own;
  // v1: the memory hierarchy's). Informational: prefer add_process().
  virtual std::string procs_path() const = 0;
};

class CgroupDriver {
 public:
  virtual ~CgroupDriver() = default;

  virtual std::string_view version() const = 0;  // "v1" | "v2"

  // Creates <hierarchy>/<parent>/<name> with limits (the parent is created on demand, with
  // controllers enabled on the way down on v2; a leftover of the same name is destroyed first).
  // name: [A-Za-z0-9._-]{1,128}, not "." / "..".
  [[nodiscard]] virtual Result<std::unique_ptr<Cgroup>> create(std::string_view name,
                                                               const CgroupLimits& limits) = 0;

  // Destroys leftovers of a killed daemon: every box cgroup under the parent (call it at startup,
  // before creating boxes). Returns how many.
  [[nodiscard]] virtual Result<std::size_t> remove_stale() = 0;

  // A clean daemon exit: remove_stale(), then the parent cgroup itself in every hierarchy
  // (only its last component: an ancestor may be a subtree delegated to the daemon). A parent
  // still in use (EBUSY, e.g. another daemon's box) or already gone is left alone.
  [[nodiscard]] virtual Status remove_parent() = 0;

  // The parent directory (v2) or the memory hierarchy's parent directory (v1), for messages.
  virtual std::string parent_path() const = 0;
};

// The two operations where cgroupfs differs from a plain directory tree: mkdir makes the kernel
// fill the new directory with the controllers' interface files, and rmdir removes a cgroup that
// still "contains" those files. Every other access (reading and writing interface files, listing
// subdirectories) is plain file I/O. Tests pass a fake to run a driver on an ordinary directory;
// nullptr means the real kernel. Both return 0 or an errno.
class CgroupFs {
 public:
  virtual ~CgroupFs() = default;
  virtual int make_dir(const std::string& path) = 0;
  virtual int remove_dir(const std::string& path) = 0;
};

// The parent cgroup, relative to each hierarchy's root. May be nested ("system.slice/x/boxes",
// e.g. a subtree delegated to the daemon); no empty, "." or ".." components.
inline constexpr std::string_view kDefaultCgroupParent = "agentbox";

// Picks v2 when <root> (or <root>/unified) is a cgroup2 hierarchy with the memory, cpu and pids
// controllers available (read from its cgroup.controllers; enabling them in subtree_control on the
// way down happens in create()), else v1 when the memory, cpu, pids and freezer v1 hierarchies are
// mounted under <root>/<controller>; else an error (kUnavailable) naming what is missing.
// Detection reads files only, so it also works on a fake layout in tests.
[[nodiscard]] Result<std::unique_ptr<CgroupDriver>> detect_cgroup_driver(
    const std::string& root = "/sys/fs/cgroup",
    std::string parent = std::string(kDefaultCgroupParent));

// Explicit drivers (tests build these on a plain-file layout with a fake CgroupFs). parent must
// be valid as above (checked with AB_CHECK: validate configuration with detect_cgroup_driver or
// before calling). One daemon per parent: remove_stale() takes everything under it.
std::unique_ptr<CgroupDriver> make_cgroup_v2_driver(
    std::string unified_root, std::string parent = std::string(kDefaultCgroupParent),
    std::shared_ptr<CgroupFs> fs = nullptr);
// The CPU time of processes (host pids) and of every child they reaped, from /proc/<pid>/stat
// (utime + stime + cutime + cstime): for a whole tree of processes (a box's cgroup, whose
// init reaps every orphan) the CPU time of all it ran, each exited process counted once in its
// reaper's. Where the kernel's own count (cpuacct) is not in reach. A pid gone meanwhile counts
// 0.
std::uint64_t proc_tree_cpu_usec(const std::vector<pid_t>& pids);

// Expects <v1_root>/{memory,cpu,pids,freezer}.
std::unique_ptr<CgroupDriver> make_cgroup_v1_driver(
    std::string v1_root, std::string parent = std::string(kDefaultCgroupParent),
    std::shared_ptr<CgroupFs> fs = nullptr);

}  // namespace agentbox::linux
