// cgroup v2 driver: one unified hierarchy, limits in memory.max / memory.swap.max / cpu.max /
// pids.max, kill with cgroup.kill (Linux 5.14+) or freeze + kill loop.
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

constexpr std::string_view kInitLeaf = "init";
constexpr std::uint64_t kCpuPeriodUs = 100000;

class V2Cgroup final : public Cgroup {
 public:
  // is_box: the box cgroup made by CgroupDriver::create(); it distributes controllers to its
  // children, so by the no-internal-process rule its own processes live in <dir>/init.
  V2Cgroup(std::shared_ptr<CgroupFs> fs, std::string dir, bool is_box)
      : fs_(std::move(fs)),
        dir_(std::move(dir)),
        leaf_(is_box ? join(dir_, kInitLeaf) : dir_),
        is_box_(is_box) {}

  Status add_process(pid_t host_pid) override {
    return detail::move_process(join(leaf_, "cgroup.procs"), host_pid);
  }

  Result<std::unique_ptr<Cgroup>> make_child(std::string_view name) override {
    if (!detail::valid_name(name, 64) || (is_box_ && name == kInitLeaf)) {
      return fail(Code::kInvalid, "cgroup child name \"" + std::string(name) + "\" in " + dir_);
    }
    auto child = std::make_unique<V2Cgroup>(fs_, join(dir_, name), false);
    if (auto st = child->destroy(); !st) return std::unexpected(std::move(st.error()));  // leftover
    if (auto st = detail::make_dir(*fs_, child->dir_, false); !st) {
      return std::unexpected(std::move(st.error()));
    }
    // An OOM inside one exec kills that exec's whole process tree, not a random victim that
    // leaves half a pipeline behind. The file exists when the parent hands down the memory
    // controller (a box does; a child of a child does not).
    const std::string oom_group = join(child->dir_, "memory.oom.group");
    if (detail::exists(oom_group)) {
      if (auto st = detail::write_file(oom_group, "1"); !st) {
        (void)child->destroy();
        return std::unexpected(std::move(st.error()));
      }
    }
    return child;
  }

  Status kill_all() override {
    const auto deadline = Clock::now() + detail::kKillTimeout;
    const std::string kill_file = join(dir_, "cgroup.kill");
    const std::string freeze_file = join(dir_, "cgroup.freeze");
    const bool has_kill = detail::exists(kill_file);
    for (;;) {
      std::vector<pid_t> pids;
      if (auto st = detail::collect_pids(dir_, pids); !st) return st;
      if (pids.empty()) {
        if (!has_kill && detail::exists(freeze_file)) return detail::write_file(freeze_file, "0");
        return {};
      }
      if (Clock::now() >= deadline) {
        // Never leave a box frozen behind a failed kill: its owner may still want to use it.
        if (!has_kill && detail::exists(freeze_file)) (void)detail::write_file(freeze_file, "0");
        return fail(Code::kTimedOut, "kill_all(" + dir_ + "): " + std::to_string(pids.size()) +
                                         " processes still present after SIGKILL");
      }
      if (has_kill) {
        // The kernel SIGKILLs the whole subtree and races correctly with concurrent forks.
        if (auto st = detail::write_file(kill_file, "1"); !st) return st;
      } else {
        // Pre-5.14: freeze so nothing forks between listing and killing; SIGKILL reaches frozen
        // tasks on v2, so no thaw is needed before they die.
        if (detail::exists(freeze_file)) {
          if (auto st = detail::write_file(freeze_file, "1"); !st) return st;
        }
        detail::kill_listed(pids, {dir_});
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  Status move_processes_to(Cgroup& target) override {
    if (dynamic_cast<V2Cgroup*>(&target) == nullptr) {
      return fail(Code::kInvalid, "move processes from " + dir_ + " to " + target.describe() +
                                      ": not a cgroup v2 target");
    }
    // Fast path: nothing left to move (an empty cgroup stays empty: only its members' forks
    // could populate it).
    if (std::vector<pid_t> left; detail::collect_pids(dir_, left) && left.empty()) return {};
    const auto deadline = Clock::now() + detail::kKillTimeout;
    const std::string freeze_file = join(dir_, "cgroup.freeze");
    const bool can_freeze = detail::exists(freeze_file);
    if (can_freeze) {
      if (auto st = detail::write_file(freeze_file, "1"); !st) return st;
      wait_frozen(std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
    }
    Status result;
    for (;;) {
      std::vector<pid_t> pids;
      if (result = detail::collect_pids(dir_, pids); !result || pids.empty()) break;
      if (Clock::now() >= deadline) {
        result = fail(Code::kTimedOut, "move processes from " + dir_ + ": " +
                                           std::to_string(pids.size()) + " processes left");
        break;
      }
      detail::sort_unique(pids);
      // One write moves a process wholly (one hierarchy); a frozen one is thawed on arrival.
      for (pid_t pid : pids) {
        result = target.add_process(pid);
        if (!result && result.error().code == Code::kNotFound) result = {};  // exited meanwhile
        if (!result) break;
      }
      if (!result) break;
    }
    if (can_freeze) {
      if (auto st = detail::write_file(freeze_file, "0"); !st && result) result = st;
    }
    return result;
  }

  Result<std::vector<pid_t>> pids() override {
    std::vector<pid_t> out;
    if (auto st = detail::collect_pids(dir_, out); !st)
      return std::unexpected(std::move(st.error()));
    detail::sort_unique(out);
    return out;
  }

  Status set_limits(const CgroupLimits& limits) override {
    if (!is_box_) return Cgroup::set_limits(limits);
    // memory.max below memory.current: the kernel reclaims, then OOM-kills (the write returns
    // once usage is under the new limit).
    const std::string mem = limits.memory_bytes == 0 ? "max" : std::to_string(limits.memory_bytes);
    if (auto st = detail::write_file(join(dir_, "memory.max"), mem); !st) return st;
    // SECURITY: no swap escape: swapped-out pages would not count against memory.max. The file is
    // absent when the kernel has no swap accounting (CONFIG_MEMCG_SWAP off, swapaccount=0); then
    // the host has no per-cgroup swap control at all and memory.max is the only bound.
    if (const std::string swap = join(dir_, "memory.swap.max"); detail::exists(swap)) {
      if (auto st = detail::write_file(swap, "0"); !st) return st;
    }
    const std::string cpu =
        (limits.cpu_percent == 0 ? std::string("max")
                                 : std::to_string(std::uint64_t{limits.cpu_percent} * 1000)) +
        " " + std::to_string(kCpuPeriodUs);
    if (auto st = detail::write_file(join(dir_, "cpu.max"), cpu); !st) return st;
    const std::string pids = limits.max_pids == 0 ? "max" : std::to_string(limits.max_pids);
    return detail::write_file(join(dir_, "pids.max"), pids);
  }

  Result<std::uint64_t> memory_usage() override {
    return detail::read_u64(join(dir_, "memory.current"));
  }

  Result<CgroupUsage> usage() override {
    CgroupUsage u;
    auto mem = memory_usage();
    if (!mem) return std::unexpected(std::move(mem.error()));
    u.memory_bytes = *mem;
    if (auto us = detail::read_keyed_u64(join(dir_, "cpu.stat"), "usage_usec")) u.cpu_usec = *us;
    auto tasks = detail::read_u64(join(dir_, "pids.current"));
    if (!tasks) return std::unexpected(std::move(tasks.error()));
    u.tasks = *tasks;
    return u;
  }

  Result<CgroupEvents> events() override {
    CgroupEvents ev;
    auto oom = detail::read_keyed_u64(join(dir_, "memory.events"), "oom_kill");
    if (oom) {
      ev.oom_kills = *oom;
    } else if (oom.error().code != Code::kNotFound) {
      return std::unexpected(std::move(oom.error()));
    }
    auto max = detail::read_keyed_u64(join(dir_, "pids.events"), "max");
    if (max) {
      ev.pids_max = *max;
    } else if (max.error().code != Code::kNotFound) {
      return std::unexpected(std::move(max.error()));
    }
    return ev;
  }

  Status destroy() override {
    if (!detail::exists(dir_)) return {};
    if (auto st = kill_all(); !st) return st;
    return detail::remove_tree(*fs_, dir_, Clock::now() + detail::kKillTimeout);
  }

  std::string describe() const override { return dir_; }
  std::string procs_path() const override { return join(leaf_, "cgroup.procs"); }

 private:
  // cgroup.events says "frozen 1" once every task below has stopped. Not reaching it in time is
  // tolerated: the move loop repeats until the cgroup is empty.
  void wait_frozen(Clock::time_point until) const {
    const std::string events = join(dir_, "cgroup.events");
    for (;;) {
      auto s = detail::read_file(events);
      if (!s || s->find("frozen 1") != std::string::npos || Clock::now() >= until) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  std::shared_ptr<CgroupFs> fs_;
  std::string dir_;
  std::string leaf_;  // where add_process() puts pids
  bool is_box_;
};

class V2Driver final : public CgroupDriver {
 public:
  V2Driver(std::string root, std::string parent, std::shared_ptr<CgroupFs> fs)
      : root_(std::move(root)), parent_(std::move(parent)), fs_(std::move(fs)) {}

  std::string_view version() const override { return "v2"; }
  std::string parent_path() const override { return join(root_, parent_); }

  Result<std::unique_ptr<Cgroup>> create(std::string_view name,
                                         const CgroupLimits& limits) override {
    if (!detail::valid_name(name, 128)) {
      return fail(Code::kInvalid, "cgroup name \"" + std::string(name) + "\"");
    }
    if (auto st = ensure_parent(); !st) return std::unexpected(std::move(st.error()));
    auto box = std::make_unique<V2Cgroup>(fs_, join(parent_path(), name), true);
    if (auto st = box->destroy(); !st) return std::unexpected(std::move(st.error()));  // leftover
    if (auto st = detail::make_dir(*fs_, box->describe(), false); !st) {
      return std::unexpected(std::move(st.error()));
    }
    if (auto st = configure(*box, limits); !st) {
      (void)box->destroy();
      return std::unexpected(std::move(st.error()));
    }
    return box;
  }

  Status remove_parent() override {
    if (auto n = remove_stale(); !n) return std::unexpected(std::move(n.error()));
    for (const std::string& d : {parent_path()}) {
      int err = fs_->remove_dir(d);
      if (err != 0 && err != ENOENT && err != EBUSY && err != ENOTEMPTY) {
        return fail_errno(err, "rmdir(" + d + ")");
      }
    }
    return {};
  }

  Result<std::size_t> remove_stale() override {
    auto names = detail::subdirs(parent_path());
    if (!names) return std::unexpected(std::move(names.error()));
    for (const auto& n : *names) {
      if (auto st = V2Cgroup(fs_, join(parent_path(), n), true).destroy(); !st) {
        return std::unexpected(std::move(st.error()));
      }
    }
    return names->size();
  }

 private:
  // Limits on the box, controllers handed down to its children, and the init leaf.
  Status configure(V2Cgroup& box, const CgroupLimits& limits) {
    if (auto st = box.set_limits(limits); !st) return st;
    const std::string dir = box.describe();
    if (auto st = enable_controllers(dir); !st) return st;
    return detail::make_dir(*fs_, join(dir, kInitLeaf), false);
  }

  // <root>, then each component of the parent path: created if missing, and each hands the
  // memory, cpu and pids controllers down to its children.
  Status ensure_parent() {
    std::string dir = root_;
    if (auto st = enable_controllers(dir); !st) return st;
    std::string_view rest = parent_;
    while (!rest.empty()) {
      std::size_t slash = rest.find('/');
      dir = join(dir, rest.substr(0, slash));
      rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
      if (auto st = detail::make_dir(*fs_, dir, true); !st) return st;
      if (auto st = enable_controllers(dir); !st) return st;
    }
    return {};
  }

  Status enable_controllers(const std::string& dir) {
    auto available = detail::read_file(join(dir, "cgroup.controllers"));
    if (!available) return std::unexpected(std::move(available.error()));
    auto enabled = detail::read_file(join(dir, "cgroup.subtree_control"));
    if (!enabled) return std::unexpected(std::move(enabled.error()));
    std::string request;
    for (std::string_view c : {"memory", "cpu", "pids"}) {
      if (!detail::contains_word(*available, c)) {
        return fail(Code::kUnavailable, "cgroup controller " + std::string(c) +
                                            " not available in " + dir + "/cgroup.controllers");
      }
      if (detail::contains_word(*enabled, c)) continue;
      if (!request.empty()) request += ' ';
      request += '+';
      request += c;
    }
    if (request.empty()) return {};
    auto st = detail::write_file(join(dir, "cgroup.subtree_control"), request);
    if (!st && st.error().sys_errno == EBUSY) {
      st.error().message +=
          " (cgroup v2 no-internal-process rule: " + dir +
          " holds processes; run agentboxd in a leaf cgroup or give it a delegated subtree)";
    }
    return st;
  }

  std::string root_;
  std::string parent_;
  std::shared_ptr<CgroupFs> fs_;
};

}  // namespace

std::unique_ptr<CgroupDriver> make_cgroup_v2_driver(std::string unified_root, std::string parent,
                                                    std::shared_ptr<CgroupFs> fs) {
  AB_CHECK(detail::valid_parent(parent));  // configuration is validated before this point
  if (!fs) fs = detail::real_cgroup_fs();
  return std::make_unique<V2Driver>(std::move(unified_root), std::move(parent), std::move(fs));
}

}  // namespace agentbox::linux
