// The ns backend's warm pool (sandbox/internal/ns_pool.h).

#include "sandbox/internal/ns_pool.h"

#include <sys/resource.h>

#include "sandbox/internal/ns_box.h"

namespace agentbox::sandbox::ns_detail {
namespace {

// After a failed start, the refill waits this long (doubling up to the max) before the next.
constexpr std::chrono::milliseconds kRetryFirst{500};
constexpr std::chrono::milliseconds kRetryMax{30000};
// How much lower the refill thread (and so the setup of every pooled box) is scheduled.
constexpr int kRefillNice = 10;

void kill_pooled(PooledBox& pb) {
  if (pb.cgroup) (void)pb.cgroup->destroy();
  if (pb.box) pb.box->kill_and_reap();
}

Status write_etc_file(int root_fd, const char* rel, const std::string& data) {
  // SECURITY: resolved inside the box's root without symlinks (nothing of the agent has run in
  // the box yet, but the rule is the same as everywhere).
  auto fd = linux::sys::openat2(root_fd, rel, O_WRONLY | O_TRUNC | O_CLOEXEC,
                                RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
  if (!fd) return fail_errno(fd.error().sys_errno, std::string("open /") + rel + " in the box");
  if (::write(fd->get(), data.data(), data.size()) != static_cast<ssize_t>(data.size())) {
    return fail_errno(errno, std::string("write /") + rel + " in the box");
  }
  return {};
}

Status set_init_rlimit(pid_t pid, int resource, std::uint64_t value, const char* what) {
  rlimit lim{value, value};
  if (::prlimit(pid, static_cast<__rlimit_resource>(resource), &lim, nullptr) != 0) {
    return fail_errno(errno, std::string("prlimit(") + what + ") of the box's init");
  }
  return {};
}

}  // namespace

BoxPool::BoxPool(Core& core, std::size_t size)
    : core_(core),
      size_(size),
      base_nice_(::getpriority(PRIO_PROCESS, 0)),
      thread_([this] { run(); }) {}

BoxPool::~BoxPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (PooledBox& pb : ready_) kill_pooled(pb);
}

std::optional<PooledBox> BoxPool::take() {
  std::optional<PooledBox> out;
  {
    std::lock_guard lock(mu_);
    if (!ready_.empty()) {
      out = std::move(ready_.front());
      ready_.pop_front();
    }
  }
  cv_.notify_all();
  return out;
}

std::size_t BoxPool::ready() const {
  std::lock_guard lock(mu_);
  return ready_.size();
}

void BoxPool::run() {
  // This thread only starts pooled boxes: at a lower priority, so that a refill never takes the
  // CPU from the exec path. The box children inherit it; binding gives the init base_nice_.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), base_nice_ + kRefillNice);
  std::chrono::milliseconds retry = kRetryFirst;
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || ready_.size() < size_; });
    if (stop_) return;
    lock.unlock();
    Result<PooledBox> pb = start_one();
    lock.lock();
    if (pb) {
      retry = kRetryFirst;
      if (stop_) {
        kill_pooled(*pb);
        return;
      }
      ready_.push_back(std::move(*pb));
      continue;
    }
    spdlog::warn("ns backend: starting a box for the pool failed (retry in {} ms): {}",
                 retry.count(), pb.error().message);
    cv_.wait_for(lock, retry, [this] { return stop_; });
    retry = std::min(retry * 2, kRetryMax);
  }
}

Result<PooledBox> BoxPool::start_one() {
  if (!core_.usable) return std::unexpected(core_.usable.error());
  const std::string key = "pool-" + std::to_string(++seq_);
  linux::BoxFsSpec fs;
  fs.uid = fs.gid = 65534;  // "agent" is nobody until the box is bound
  fs.tmp_bytes = core_.opts.tmp_bytes;
  fs.tmp_inodes = core_.opts.tmp_inodes;
  fs.cache_bytes = core_.opts.cache_bytes;
  auto plan = linux::plan_pooled_box_fs(fs);
  if (!plan) return std::unexpected(with_context(plan.error(), key));

  linux::CgroupLimits limits;
  limits.memory_bytes = kDefaultMemoryMb << 20;
  limits.cpu_percent = kDefaultCpuPercent;
  limits.max_pids = kDefaultMaxPids;
  PooledBox pb;
  pb.cgroup = AB_TRY(core_.driver->create(key, limits));

  linux::BoxSpec spec;
  spec.key = key;
  spec.root_mountpoint = core_.root_mountpoint;
  spec.init_fd = core_.init_fd.get();
  spec.fs = &*plan;
  spec.seccomp = &core_.seccomp;
  spec.cgroup = pb.cgroup.get();
  spec.rlimits.nofile = kDefaultOpenFiles;
  spec.init_oom_score_adj = core_.opts.init_oom_score_adj;
  spec.root_read_only = false;
  // On this thread, which lives as long as the core: the box's PDEATHSIG is tied to it.
  auto box = linux::Box::create(spec);
  if (!box) {
    kill_pooled(pb);
    return std::unexpected(box.error());
  }
  pb.box = std::move(*box);
  const std::string proc = "/proc/" + std::to_string(pb.box->init_pid());
  pb.root = UniqueFd(::open((proc + "/root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  pb.mntns = UniqueFd(::open((proc + "/ns/mnt").c_str(), O_RDONLY | O_CLOEXEC));
  if (!pb.root || !pb.mntns) {
    Error e = Error::from_errno(errno, "open(" + proc + "/root, ns/mnt)");
    kill_pooled(pb);
    return std::unexpected(std::move(e));
  }
  return pb;
}

Result<linux::SessionMounts> prepare_session_mounts(const linux::BoxFsSpec& fs) {
  linux::SessionMounts out;
  // The checks and messages of plan_box_fs.
  if (fs.workspace_dir.empty() || fs.workspace_dir[0] != '/') {
    return fail(Code::kInvalid, "workspace dir '" + fs.workspace_dir + "' must be absolute");
  }
  if (fs.workspace_on_host) {
    out.workspace = AB_TRY(
        linux::prepare_workspace_bind(fs.workspace_dir, fs.workspace_read_only, fs.uid, fs.gid));
  } else {
    struct stat st;
    if (::stat(fs.workspace_dir.c_str(), &st) != 0) {
      return fail_errno(errno, "stat(" + fs.workspace_dir + ")");
    }
    if (!S_ISDIR(st.st_mode)) {
      return fail(Code::kNotDir, "workspace " + fs.workspace_dir + " is not a directory");
    }
    out.workspace = AB_TRY(linux::prepare_box_workspace(fs.workspace_dir));
  }
  for (const linux::BoxBind& b : fs.binds) {
    out.binds.push_back(AB_TRY(linux::prepare_bind(b, fs.uid, fs.gid)));
  }
  out.tmp_bytes = fs.tmp_bytes;
  return out;
}

Status bind_pooled_box(PooledBox& pb, linux::SessionMounts mounts, const PoolBinding& b, int nice) {
  const int root = pb.root.get();
  AB_TRY(write_etc_file(root, "etc/passwd", linux::box_passwd_file(b.fs)));
  AB_TRY(write_etc_file(root, "etc/group", linux::box_group_file(b.fs)));
  AB_TRY(linux::attach_session(pb.mntns.get(), root, mounts));
  AB_TRY(pb.cgroup->set_limits(b.limits));
  const pid_t init = pb.box->init_pid();
  AB_TRY(set_init_rlimit(init, RLIMIT_NOFILE, b.rlimits.nofile, "nofile"));
  AB_TRY(set_init_rlimit(init, RLIMIT_FSIZE, b.rlimits.fsize_bytes, "fsize"));
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(init), nice) != 0) {
    return fail_errno(errno, "setpriority of the box's init");
  }
  return {};
}

}  // namespace agentbox::sandbox::ns_detail
