// cgroup v1 driver: the box is mirrored in the memory, cpu, pids and freezer hierarchies.
// Limits: memory.limit_in_bytes (+ memory.memsw.limit_in_bytes), cpu.cfs_quota_us, pids.max;
// kill_all freezes with the freezer so nothing forks while it kills.
#include <fcntl.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <string>
#include <thread>
#include <utility>

#include "linux/cgroup.h"
#include "linux/internal/cgroup_fs.h"

namespace agentbox::linux {
namespace {

using detail::join;
using Clock = std::chrono::steady_clock;

// Order matters for add_process(): freezer and pids first, so a process whose move fails half
// way is at least frozen/killed by kill_all() and counted against pids.max.
enum Hier : std::size_t { kFreezer, kPids, kMemory, kCpu, kHierCount };
constexpr std::array<std::string_view, kHierCount> kHierNames = {"freezer", "pids", "memory",
                                                                 "cpu"};
using Dirs = std::array<std::string, kHierCount>;

Dirs dirs_under(const std::string& root, std::string_view rel) {
  Dirs d;
  for (std::size_t i = 0; i < kHierCount; ++i) d[i] = join(join(root, kHierNames[i]), rel);
  return d;
}

class V1Cgroup final : public Cgroup {
 public:
  V1Cgroup(std::shared_ptr<CgroupFs> fs, Dirs dirs) : fs_(std::move(fs)), dirs_(std::move(dirs)) {}

  Status add_process(pid_t host_pid) override {
    for (const auto& d : dirs_) {
      if (auto st = detail::move_process(join(d, "cgroup.procs"), host_pid); !st) return st;
    }
    return {};
  }

  Result<std::vector<UniqueFd>> open_self_join() override {
    std::vector<UniqueFd> fds;
    for (const auto& d : dirs_) {
      std::string path = join(d, "tasks");
      UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
      if (!fd) return fail_errno(errno, "open(" + path + ")");
      fds.push_back(std::move(fd));
    }
    return fds;
  }

  Result<std::unique_ptr<Cgroup>> make_child(std::string_view name) override {
    if (!detail::valid_name(name, 64)) {
      return fail(Code::kInvalid,
                  "cgroup child name \"" + std::string(name) + "\" in " + dirs_[kMemory]);
    }
    Dirs kid;
    for (std::size_t i = 0; i < kHierCount; ++i) kid[i] = join(dirs_[i], name);
    auto child = std::make_unique<V1Cgroup>(fs_, std::move(kid));
    if (auto st = child->destroy(); !st) return std::unexpected(std::move(st.error()));  // leftover
    // Nothing to configure: v1 memory, cpu and pids limits are hierarchical, so a child counts
    // against the box's limits; the child exists to track and kill one exec's processes.
    if (auto st = child->make_dirs(); !st) return std::unexpected(std::move(st.error()));
    return child;
  }

  Status kill_all() override {
    const auto deadline = Clock::now() + detail::kKillTimeout;
    const std::string state = join(dirs_[kFreezer], "freezer.state");
    for (;;) {
      // Frozen tasks cannot fork, exit or be reaped, so the listing below is complete and every
      // listed pid stays valid until THAWED. A SIGKILLed frozen task dies once thawed.
      if (auto st = detail::write_file(state, "FROZEN"); !st) return st;
      wait_frozen(state, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
      std::vector<pid_t> pids;
      Status listed = collect(pids);
      if (listed && !pids.empty()) detail::kill_listed(pids, {dirs_.begin(), dirs_.end()});
      if (auto st = detail::write_file(state, "THAWED"); !st) return st;
      if (!listed) return listed;
      if (pids.empty()) return {};
      if (Clock::now() >= deadline) {
        return fail(Code::kTimedOut, "kill_all(" + dirs_[kFreezer] +
                                         "): " + std::to_string(pids.size()) +
                                         " processes still present after SIGKILL");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  Status move_processes_to(Cgroup& target) override {
    auto* dst = dynamic_cast<V1Cgroup*>(&target);
    if (dst == nullptr) {
      return fail(Code::kInvalid, "move processes from " + dirs_[kFreezer] + " to " +
                                      target.describe() + ": not a cgroup v1 target");
    }
    // Fast path, the common end of an exec: nothing left to move, so no freeze round trip. A
    // cgroup that is empty stays empty: only its members' forks could populate it.
    if (std::vector<pid_t> left; collect(left) && left.empty()) return {};
    const auto deadline = Clock::now() + detail::kKillTimeout;
    const std::string state = join(dirs_[kFreezer], "freezer.state");
    if (auto st = detail::write_file(state, "FROZEN"); !st) return st;
    Status result;
    for (;;) {
      // A task still FREEZING may fork once more: its child lands in this (freezing) cgroup and
      // is found by the next listing.
      wait_frozen(state, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
      std::vector<pid_t> pids;
      if (result = collect(pids); !result || pids.empty()) break;
      if (Clock::now() >= deadline) {
        result = fail(Code::kTimedOut, "move processes from " + dirs_[kFreezer] + ": " +
                                           std::to_string(pids.size()) + " processes left");
        break;
      }
      for (pid_t pid : pids) {
        result = dst->add_process_freezer_last(pid);
        if (!result && result.error().code == Code::kNotFound) result = {};  // exited meanwhile
        if (!result) break;
      }
      if (!result) break;
    }
    // Never leave the exec frozen, also on failure: its owner kills or removes it next.
    if (auto st = detail::write_file(state, "THAWED"); !st && result) result = st;
    return result;
  }

  Result<std::vector<pid_t>> pids() override {
    std::vector<pid_t> out;
    if (auto st = collect(out); !st) return std::unexpected(std::move(st.error()));
    return out;
  }

  Status set_limits(const CgroupLimits& limits) override {
    const std::string& mem = dirs_[kMemory];
    const std::string bytes = limits.memory_bytes == 0 ? "-1" : std::to_string(limits.memory_bytes);
    const std::string limit_file = join(mem, "memory.limit_in_bytes");
    const std::string memsw = join(mem, "memory.memsw.limit_in_bytes");
    const bool has_memsw = detail::exists(memsw);
    // The kernel requires memsw.limit >= limit at every step: raising writes memsw first,
    // lowering (and a fresh cgroup, unlimited in both) writes the limit first.
    bool raising = false;
    if (has_memsw) {
      // Unreadable (a fake layout in tests) counts as unlimited, as a fresh cgroup is.
      auto cur = detail::read_u64(limit_file);
      raising = cur && (limits.memory_bytes == 0 || limits.memory_bytes > *cur);
    }
    // SECURITY: no swap escape. memsw limits RAM + swap together, so setting it to the RAM limit
    // means not one page beyond the limit can live in swap.
    if (raising) {
      if (auto st = detail::write_file(memsw, bytes); !st) return st;
    }
    if (auto st = detail::write_file(limit_file, bytes); !st) {
      // EBUSY: v1 reclaimed what it could and the box still uses more; it does not OOM-kill.
      if (st.error().sys_errno == EBUSY) {
        auto used = detail::read_u64(join(mem, "memory.usage_in_bytes"));
        return fail(Code::kExists,
                    "memory limit " + std::to_string(limits.memory_bytes >> 20) +
                        " MiB: the box uses " + (used ? std::to_string(*used >> 20) : "?") +
                        " MiB that the kernel could not reclaim (cgroup v1 refuses the lower "
                        "limit rather than OOM-kill; the old limit stays)");
      }
      return st;
    }
    if (has_memsw && !raising) {
      if (auto st = detail::write_file(memsw, bytes); !st) return st;
    } else if (!has_memsw) {
      if (const std::string sw = join(mem, "memory.swappiness"); detail::exists(sw)) {
        // Kernel without swap accounting (CONFIG_MEMCG_SWAP off or swapaccount=0): memsw is
        // absent and swap cannot be capped. swappiness 0 stops this cgroup's limit reclaim from
        // swapping anonymous memory, so hitting the limit means the OOM killer rather than
        // growth into swap. Global memory pressure may still swap the box's pages out; that is
        // the best v1 allows.
        if (auto st = detail::write_file(sw, "0"); !st) return st;
      }
    }
    const std::string& cpu = dirs_[kCpu];
    if (auto st = detail::write_file(join(cpu, "cpu.cfs_period_us"), "100000"); !st) return st;
    const std::string quota =
        limits.cpu_percent == 0 ? "-1" : std::to_string(std::uint64_t{limits.cpu_percent} * 1000);
    if (auto st = detail::write_file(join(cpu, "cpu.cfs_quota_us"), quota); !st) return st;
    const std::string pids = limits.max_pids == 0 ? "max" : std::to_string(limits.max_pids);
    return detail::write_file(join(dirs_[kPids], "pids.max"), pids);
  }

  Result<std::uint64_t> memory_usage() override {
    return detail::read_u64(join(dirs_[kMemory], "memory.usage_in_bytes"));
  }

  Result<CgroupUsage> usage() override {
    CgroupUsage u;
    auto mem = memory_usage();
    if (!mem) return std::unexpected(std::move(mem.error()));
    u.memory_bytes = *mem;
    // cpuacct shares the cpu hierarchy on the usual mounts ("cpu,cpuacct"); where it does not,
    // the box's CPU time is not counted.
    if (auto ns = detail::read_u64(join(dirs_[kCpu], "cpuacct.usage"))) u.cpu_usec = *ns / 1000;
    auto tasks = detail::read_u64(join(dirs_[kPids], "pids.current"));
    if (!tasks) return std::unexpected(std::move(tasks.error()));
    u.tasks = *tasks;
    return u;
  }

  Result<CgroupEvents> events() override {
    CgroupEvents ev;
    auto oom = detail::read_keyed_u64(join(dirs_[kMemory], "memory.oom_control"), "oom_kill");
    if (oom) {
      ev.oom_kills = *oom;
    } else if (oom.error().code == Code::kNotFound) {
      // Before Linux 4.13 memory.oom_control has no oom_kill: how often the limit was hit.
      auto failcnt = detail::read_u64(join(dirs_[kMemory], "memory.failcnt"));
      if (failcnt) ev.oom_kills = *failcnt;
    } else {
      return std::unexpected(std::move(oom.error()));
    }
    auto max = detail::read_keyed_u64(join(dirs_[kPids], "pids.events"), "max");
    if (max) {
      ev.pids_max = *max;
    } else if (max.error().code != Code::kNotFound) {
      return std::unexpected(std::move(max.error()));
    }
    return ev;
  }

  Status destroy() override {
    bool any = false;
    for (const auto& d : dirs_) any = any || detail::exists(d);
    if (!any) return {};
    // Fast path, the common end of an exec: nothing left inside, so no freeze/kill round trip.
    // rmdir fails (EBUSY) on a cgroup that holds a process or a child, so a process that slipped
    // in after the listing makes it fall through to the full path. The freezer goes last: the
    // full path needs it.
    if (std::vector<pid_t> left; collect(left) && left.empty()) {
      bool removed_all = true;
      for (auto it = dirs_.rbegin(); it != dirs_.rend() && removed_all; ++it) {
        int err = fs_->remove_dir(*it);
        removed_all = err == 0 || err == ENOENT;
      }
      if (removed_all) return {};
    }
    // Without the freezer dir there is nothing to freeze with; the other hierarchies' leftovers
    // (a half-made cgroup) hold no processes we could not kill by other means anyway.
    if (detail::exists(dirs_[kFreezer])) {
      if (auto st = kill_all(); !st) return st;
    }
    const auto deadline = Clock::now() + detail::kKillTimeout;
    for (const auto& d : dirs_) {
      if (auto st = detail::remove_tree(*fs_, d, deadline); !st) return st;
    }
    return {};
  }

  std::string describe() const override {
    std::string out;
    for (const auto& d : dirs_) {
      if (!out.empty()) out += ", ";
      out += d;
    }
    return out;
  }

  std::string procs_path() const override { return join(dirs_[kMemory], "cgroup.procs"); }

  // mkdir in every hierarchy; on failure removes what it made.
  Status make_dirs() {
    for (std::size_t i = 0; i < kHierCount; ++i) {
      if (auto st = detail::make_dir(*fs_, dirs_[i], false); !st) {
        for (std::size_t j = 0; j < i; ++j) (void)fs_->remove_dir(dirs_[j]);
        return st;
      }
    }
    return {};
  }

  const std::string& dir(Hier h) const { return dirs_[h]; }

  // add_process() with the freezer hierarchy last, for a frozen process: it stays frozen (so it
  // cannot fork into the hierarchies it has not left yet) until it is in every one of ours.
  Status add_process_freezer_last(pid_t host_pid) {
    for (std::size_t i = 0; i < kHierCount; ++i) {
      const std::size_t h = (i + 1) % kHierCount;  // pids, memory, cpu, then freezer
      if (auto st = detail::move_process(join(dirs_[h], "cgroup.procs"), host_pid); !st) {
        return st;
      }
    }
    return {};
  }

 private:
  // Every hierarchy: a process moved in only some of them (by a failed add_process, or by root
  // on the host) is still found.
  Status collect(std::vector<pid_t>& out) {
    for (const auto& d : dirs_) {
      if (auto st = detail::collect_pids(d, out); !st) return st;
    }
    detail::sort_unique(out);
    return {};
  }

  static void wait_frozen(const std::string& state, Clock::time_point until) {
    // FREEZING -> FROZEN takes a scheduling round for running tasks. Not reaching FROZEN in time
    // is tolerated: the kill loop repeats until the cgroup is empty.
    for (;;) {
      auto s = detail::read_file(state);
      if (!s || s->starts_with("FROZEN") || Clock::now() >= until) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  std::shared_ptr<CgroupFs> fs_;
  Dirs dirs_;
};

class V1Driver final : public CgroupDriver {
 public:
  V1Driver(std::string root, std::string parent, std::shared_ptr<CgroupFs> fs)
      : root_(std::move(root)), parent_(std::move(parent)), fs_(std::move(fs)) {}

  std::string_view version() const override { return "v1"; }
  std::string parent_path() const override {
    return join(join(root_, kHierNames[kMemory]), parent_);
  }

  Result<std::unique_ptr<Cgroup>> create(std::string_view name,
                                         const CgroupLimits& limits) override {
    if (!detail::valid_name(name, 128)) {
      return fail(Code::kInvalid, "cgroup name \"" + std::string(name) + "\"");
    }
    if (auto st = ensure_parent(); !st) return std::unexpected(std::move(st.error()));
    auto box =
        std::make_unique<V1Cgroup>(fs_, dirs_under(root_, parent_ + "/" + std::string(name)));
    if (auto st = box->destroy(); !st) return std::unexpected(std::move(st.error()));  // leftover
    if (auto st = box->make_dirs(); !st) return std::unexpected(std::move(st.error()));
    if (auto st = box->set_limits(limits); !st) {
      (void)box->destroy();
      return std::unexpected(std::move(st.error()));
    }
    return box;
  }

  Status remove_parent() override {
    if (auto n = remove_stale(); !n) return std::unexpected(std::move(n.error()));
    for (const std::string& d : dirs_under(root_, parent_)) {
      int err = fs_->remove_dir(d);
      if (err != 0 && err != ENOENT && err != EBUSY && err != ENOTEMPTY) {
        return fail_errno(err, "rmdir(" + d + ")");
      }
    }
    return {};
  }

  Result<std::size_t> remove_stale() override {
    // A killed daemon may have left a box in only some hierarchies (killed mid-create).
    std::vector<std::string> names;
    for (const auto& d : dirs_under(root_, parent_)) {
      auto n = detail::subdirs(d);
      if (!n) return std::unexpected(std::move(n.error()));
      names.insert(names.end(), n->begin(), n->end());
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    for (const auto& n : names) {
      if (auto st = V1Cgroup(fs_, dirs_under(root_, parent_ + "/" + n)).destroy(); !st) {
        return std::unexpected(std::move(st.error()));
      }
    }
    return names.size();
  }

 private:
  Status ensure_parent() {
    for (std::size_t i = 0; i < kHierCount; ++i) {
      std::string dir = join(root_, kHierNames[i]);
      std::string_view rest = parent_;
      while (!rest.empty()) {
        std::size_t slash = rest.find('/');
        dir = join(dir, rest.substr(0, slash));
        rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
        int err = fs_->make_dir(dir);
        if (err == EEXIST) continue;
        if (err != 0) return fail_errno(err, "mkdir(" + dir + ")");
        // Before Linux 5.11 (and on kernels booted without the v1 default flip), a new memcg did
        // not charge its children to itself unless use_hierarchy was set while it had none.
        // Since 5.11 the file reads 1 and only accepts 1, so writing it is always correct.
        if (i == kMemory) {
          const std::string uh = join(dir, "memory.use_hierarchy");
          if (detail::exists(uh)) {
            if (auto st = detail::write_file(uh, "1"); !st) return st;
          }
        }
      }
    }
    return {};
  }

  std::string root_;
  std::string parent_;
  std::shared_ptr<CgroupFs> fs_;
};

}  // namespace

std::unique_ptr<CgroupDriver> make_cgroup_v1_driver(std::string v1_root, std::string parent,
                                                    std::shared_ptr<CgroupFs> fs) {
  AB_CHECK(detail::valid_parent(parent));  // configuration is validated before this point
  if (!fs) fs = detail::real_cgroup_fs();
  return std::make_unique<V1Driver>(std::move(v1_root), std::move(parent), std::move(fs));
}

}  // namespace agentbox::linux
