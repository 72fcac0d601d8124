#include "sandbox/ns_backend.h"

#include "sandbox/internal/ns_box.h"

namespace agentbox::sandbox {
namespace {

using namespace ns_detail;  // NOLINT: the backend's own internals

// ---- Host capability checks (check_usable) ------------------------------------------------------

bool has_cap_sys_admin() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    std::uint64_t eff = std::stoull(line.substr(7), nullptr, 16);
    return (eff & (std::uint64_t{1} << CAP_SYS_ADMIN)) != 0;
  }
  return false;
}

// Every missing piece, "; "-separated; empty when the host can run boxes.
std::string missing_features(const std::string& init_path) {
  std::vector<std::string> missing;
  if (::geteuid() != 0 && !has_cap_sys_admin()) {
    missing.push_back("root or CAP_SYS_ADMIN (running as uid " + std::to_string(::geteuid()) + ")");
  }
  // clone3 with a too-small size: EINVAL if the syscall exists (5.3+).
  if (::syscall(SYS_clone3, nullptr, 0) < 0 && errno == ENOSYS) {
    missing.push_back("clone3 (Linux 5.3+)");
  }
  for (const char* ns : {"mnt", "pid", "ipc", "uts", "net", "cgroup"}) {
    if (::access((std::string("/proc/self/ns/") + ns).c_str(), F_OK) != 0) {
      missing.push_back(std::string(ns) + " namespaces");
    }
  }
  if (!linux::sys::openat2(AT_FDCWD, "/", O_PATH, RESOLVE_IN_ROOT)) {
    missing.push_back("openat2 (Linux 5.6+)");
  }
  // The new mount API with mount_setattr (5.12+): an invalid call fails with EINVAL/EBADF when
  // the syscall exists.
  if (::mount_setattr(-1, "", 0, nullptr, 0) != 0 && errno == ENOSYS) {
    missing.push_back("mount_setattr (Linux 5.12+)");
  }
  if (::prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0 && errno == EINVAL) {
    missing.push_back("seccomp (CONFIG_SECCOMP)");
  }
  if (::access(init_path.c_str(), X_OK) != 0) {
    missing.push_back("the init binary " + init_path + " (" + std::strerror(errno) + ")");
  }
  std::string out;
  for (const auto& m : missing) out += (out.empty() ? "" : "; ") + m;
  return out;
}

// ---- The backend -------------------------------------------------------------------------------

class NsBackend final : public Backend {
 public:
  explicit NsBackend(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  std::string_view name() const override { return "ns"; }
  bool isolated() const override { return true; }
  bool measures_usage() const override { return true; }
  Status check_usable() override { return core_->usable; }
  // Prepares each bind as create() would (linux/host_binds.h) and drops it.
  Status check_mounts(const std::vector<BindMount>& mounts, uid_t uid, gid_t gid) override {
    for (const BindMount& m : mounts) {
      AB_TRY(lx::prepare_bind({m.host_path, m.box_path, m.read_only, m.what}, uid, gid));
    }
    return {};
  }
  bool supports_image_root() const override { return true; }
  Result<std::unique_ptr<Sandbox>> create(BoxConfig config) override;

 private:
  // A box started now for `key`: its cgroup, the box, its root and mount namespace.
  // `root_tree`: an image root (borrowed; -1: the host root), `root_writable` its "/".
  Result<PooledBox> start_fresh(const std::string& key, const lx::BoxFsSpec& fs_spec,
                                const lx::CgroupLimits& limits, const lx::BoxRlimits& rlimits,
                                int root_tree = -1, bool root_writable = false);
  // A box of the pool bound to the session; nothing when the pool ran dry meanwhile or the
  // binding failed (logged; the caller then starts a fresh box). Errors: the session's own.
  Result<std::optional<PooledBox>> take_pooled(const std::string& key, const lx::BoxFsSpec& fs_spec,
                                               const lx::CgroupLimits& limits,
                                               const lx::BoxRlimits& rlimits);

  std::shared_ptr<Core> core_;
};

Result<PooledBox> NsBackend::start_fresh(const std::string& key, const lx::BoxFsSpec& fs_spec,
                                         const lx::CgroupLimits& limits,
                                         const lx::BoxRlimits& rlimits, int root_tree,
                                         bool root_writable) {
  auto plan = lx::plan_box_fs(fs_spec);
  if (!plan) return std::unexpected(with_context(plan.error(), "box " + key));

  auto cgroup = core_->driver->create(key, limits);
  if (!cgroup) return std::unexpected(with_context(cgroup.error(), "box " + key));

  lx::BoxSpec spec;
  spec.key = key;
  spec.root_mountpoint = core_->root_mountpoint;
  spec.root_tree = root_tree;
  spec.root_writable = root_writable;
  spec.init_fd = core_->init_fd.get();
  spec.fs = &*plan;
  spec.seccomp = &core_->seccomp;
  spec.cgroup = cgroup->get();
  spec.rlimits = rlimits;
  spec.init_oom_score_adj = core_->opts.init_oom_score_adj;

  // On the spawner thread: the box's PDEATHSIG is tied to it.
  Result<std::unique_ptr<lx::Box>> box = fail(Code::kInternal, "box not created");
  core_->spawner.run([&] { box = lx::Box::create(spec); });
  if (!box) {
    (void)(*cgroup)->destroy();
    return std::unexpected(box.error());
  }

  auto fail_box = [&](Error e) -> std::unexpected<Error> {
    (void)(*cgroup)->destroy();
    (*box)->kill_and_reap();
    return std::unexpected(std::move(e));
  };
  // The box's root as the file API's root: resolves inside the box's mount tree.
  const std::string root_path = "/proc/" + std::to_string((*box)->init_pid()) + "/root";
  UniqueFd root(::open(root_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return fail_box(Error::from_errno(errno, "open(" + root_path + ")"));
  const std::string mntns_path = "/proc/" + std::to_string((*box)->init_pid()) + "/ns/mnt";
  UniqueFd mntns(::open(mntns_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!mntns) return fail_box(Error::from_errno(errno, "open(" + mntns_path + ")"));
  return PooledBox{std::move(*cgroup), std::move(*box), std::move(root), std::move(mntns)};
}

Result<std::optional<PooledBox>> NsBackend::take_pooled(const std::string& key,
                                                        const lx::BoxFsSpec& fs_spec,
                                                        const lx::CgroupLimits& limits,
                                                        const lx::BoxRlimits& rlimits) {
  // Prepared before a box is taken: a bad bind fails the create as a fresh start would.
  auto mounts = prepare_session_mounts(fs_spec);
  if (!mounts) return std::unexpected(with_context(mounts.error(), "box " + key));
  std::optional<PooledBox> pb = core_->pool->take();
  if (!pb) return std::optional<PooledBox>();
  PoolBinding binding{fs_spec, limits, rlimits};
  if (auto st = bind_pooled_box(*pb, std::move(*mounts), binding, core_->pool->base_nice()); !st) {
    spdlog::warn("box {}: binding a pooled box failed, starting a fresh one: {}", key,
                 st.error().message);
    (void)pb->cgroup->destroy();
    pb->box->kill_and_reap();
    return std::optional<PooledBox>();
  }
  return pb;
}

Result<std::unique_ptr<Sandbox>> NsBackend::create(BoxConfig config) {
  if (!core_->usable) return std::unexpected(core_->usable.error());
  const uid_t uid = config.uid != 0 ? config.uid : default_box_uid(config.key);
  const gid_t gid = config.gid != 0 ? config.gid : uid;

  lx::BoxFsSpec fs_spec;
  fs_spec.workspace_dir = config.workspace_dir;
  fs_spec.workspace_on_host = config.workspace_on_host;
  fs_spec.workspace_read_only = config.workspace_read_only;
  fs_spec.uid = uid;
  fs_spec.gid = gid;
  fs_spec.tmp_bytes = config.limits.tmp_mb ? *config.limits.tmp_mb << 20 : core_->opts.tmp_bytes;
  fs_spec.tmp_inodes = core_->opts.tmp_inodes;
  fs_spec.cache_bytes = core_->opts.cache_bytes;
  if (fs_spec.cache_bytes != 0) {
    // Package caches on /cache, not in the workspace (the session's env may point them elsewhere).
    const std::string cache = lx::kBoxCachePath;
    for (auto [k, v] :
         {std::pair{"XDG_CACHE_HOME", cache}, std::pair{"PIP_CACHE_DIR", cache + "/pip"},
          std::pair{"UV_CACHE_DIR", cache + "/uv"}, std::pair{"npm_config_cache", cache + "/npm"},
          std::pair{"BUN_INSTALL_CACHE_DIR", cache + "/bun"}}) {
      config.env.emplace(k, std::move(v));
    }
  }
  for (const auto& m : config.mounts) {
    fs_spec.binds.push_back({m.host_path, m.box_path, m.read_only, m.what});
  }
  // An image root (API.md "Images"): a detached overlay the box attaches as "/". Such a box is
  // always started fresh (a pooled box has the host root).
  UniqueFd image_root;
  if (!config.root_layers.empty()) {
    auto made = lx::make_image_root({config.root_layers, config.root_dir, config.root_upper,
                                     config.root_work, config.root_id_base, config.root_id_count,
                                     config.root_owner});
    if (!made) return std::unexpected(with_context(made.error(), "box " + config.key));
    image_root = std::move(*made);
    fs_spec.image_root = true;
  }

  lx::CgroupLimits limits;
  limits.memory_bytes = config.limits.memory_mb.value_or(kDefaultMemoryMb) << 20;
  limits.cpu_percent = config.limits.cpu_percent.value_or(kDefaultCpuPercent);
  limits.max_pids = config.limits.max_pids.value_or(kDefaultMaxPids);
  lx::BoxRlimits rlimits;
  rlimits.nofile = config.limits.max_open_files.value_or(kDefaultOpenFiles);
  // No single file may outgrow the workspace's cap (a write past it fails with EFBIG).
  if (config.limits.disk_mb) rlimits.fsize_bytes = *config.limits.disk_mb << 20;

  // A box of the pool when one is ready (ns_pool.h), else one started now.
  std::optional<PooledBox> started;
  if (core_->pool && !image_root && core_->pool->ready() > 0) {
    started = AB_TRY(take_pooled(config.key, fs_spec, limits, rlimits));
  }
  if (!started) {
    started = AB_TRY(start_fresh(config.key, fs_spec, limits, rlimits, image_root.get(),
                                 image_root && config.root_writable));
  }
  PooledBox& sb_parts = *started;
  auto fail_box = [&](Error e) -> std::unexpected<Error> {
    (void)sb_parts.cgroup->destroy();
    sb_parts.box->kill_and_reap();
    return std::unexpected(std::move(e));
  };
  UniqueFd control_dup(::fcntl(sb_parts.box->control_fd(), F_DUPFD_CLOEXEC, 3));
  if (!control_dup) return fail_box(Error::from_errno(errno, "dup(box control socket)"));

  // --toolchain-path: first in PATH unless the session sets PATH itself.
  if (!core_->opts.path_prefix.empty() && config.env.find("PATH") == config.env.end()) {
    config.env["PATH"] = std::string(kWorkspaceBins) + ":" + core_->opts.path_prefix + ":" +
                         (kBoxPath + kWorkspaceBins.size() + 1);
  }
  auto sb = std::make_unique<NsSandbox>(
      core_, config.key, uid, gid, config.limits.cpu_time_sec.value_or(0), std::move(config.env),
      std::move(sb_parts.cgroup), std::move(sb_parts.box), std::move(sb_parts.root),
      std::move(sb_parts.mntns), std::move(control_dup));
  if (config.egress_policy || config.open_network) {
    // After the init exists: the listener (or veth) goes into its network namespace.
    NetworkMode mode{std::move(config.egress_policy), std::move(config.egress_hooks),
                     config.open_network};
    if (auto st = sb->start_network(mode); !st) {
      sb->shutdown();
      return std::unexpected(st.error());
    }
  }
  return sb;
}

}  // namespace

uid_t default_box_uid(std::string_view key) {
  return static_cast<uid_t>(fnv1_32(key) % 60000 + 10000);  // seed 001's FNV32 (FNV-1)
}

Result<std::unique_ptr<Backend>> make_ns_backend(NsBackendOptions opts) {
  if (opts.runtime_dir.empty() || opts.runtime_dir.front() != '/') {
    return fail(Code::kInvalid,
                "ns backend: runtime dir must be an absolute path: '" + opts.runtime_dir + "'");
  }
  auto core = std::make_shared<Core>();
  if (opts.init_path.empty()) {
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    opts.init_path = (self.parent_path() / proto::kInitName).string();
  }
  if (opts.cgroup_parent.empty()) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", fnv1a_32(opts.runtime_dir));
    opts.cgroup_parent = std::string("agentbox-") + hex;
  }
  core->opts = opts;

  std::string missing = missing_features(opts.init_path);
  auto driver = lx::detect_cgroup_driver(opts.cgroup_root, opts.cgroup_parent);
  if (!driver) {
    missing += (missing.empty() ? "" : "; ") + std::string("cgroups: ") + driver.error().message;
  } else {
    core->driver = std::move(*driver);
  }
  auto seccomp = lx::build_box_seccomp_program();
  if (!seccomp) {
    missing += (missing.empty() ? "" : "; ") + std::string("seccomp: ") + seccomp.error().message;
  } else {
    core->seccomp = std::move(*seccomp);
  }
  core->init_fd = UniqueFd(::open(opts.init_path.c_str(), O_PATH | O_CLOEXEC));
  core->root_mountpoint = opts.runtime_dir + "/box-root";
  std::error_code ec;
  std::filesystem::create_directories(core->root_mountpoint, ec);
  if (ec) {
    missing += (missing.empty() ? "" : "; ") + std::string("runtime dir ") + core->root_mountpoint +
               ": " + ec.message();
  }
  if (!missing.empty()) {
    core->usable = fail(Code::kUnavailable, "ns backend unusable, missing: " + missing);
    return std::unique_ptr<Backend>(new NsBackend(std::move(core)));
  }

  // Leftovers of a previous daemon (kill -9): their boxes died with it, their cgroups did not.
  if (auto n = core->driver->remove_stale(); !n) {
    spdlog::warn("ns backend: removing stale box cgroups: {}", n.error().message);
  } else if (*n > 0) {
    spdlog::info("ns backend: removed {} stale box cgroups", *n);
  }
  // The daemon must outlive any box under memory pressure.
  if (opts.protect_daemon_from_oom) {
    std::ofstream adj("/proc/self/oom_score_adj");
    adj << "-1000" << std::flush;
    if (!adj) {
      spdlog::warn(
          "ns backend: could not set the daemon's oom_score_adj to -1000 (needs "
          "CAP_SYS_RESOURCE); boxes still get +{}",
          opts.command_oom_score_adj);
    }
  }
  spdlog::info("ns backend: cgroup {} at {}, init {}", core->driver->version(),
               core->driver->parent_path(), opts.init_path);
  if (opts.pool_size > 0) {
    core->pool = std::make_unique<BoxPool>(*core, opts.pool_size);
    spdlog::info("ns backend: a pool of {} boxes started ahead", opts.pool_size);
  }
  return std::unique_ptr<Backend>(new NsBackend(std::move(core)));
}

}  // namespace agentbox::sandbox
