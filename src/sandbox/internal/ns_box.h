#pragma once
// What the files of the ns backend share (sandbox/ns_backend.h is the interface):
// ns_backend.cc  the host checks, the backend and a box's creation;
// ns_box_io.cc   the control-socket reader of a box's init (child admission, exits);
// ns_exec.cc     a box's exec path and process launches (NsSandbox's out-of-line methods);
// here           the shared state (Core), one exec in flight (Pending), the connection to the
//                init (Conn), the Process handed out, and the sandbox itself.

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/openat2.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/experimental/concurrent_channel.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/fnv.h"
#include "common/log.h"
#include "common/log_errors.h"
#include "common/validate.h"
#include "linux/box.h"
#include "linux/caps.h"
#include "linux/cgroup.h"
#include "linux/host_binds.h"
#include "linux/image_root.h"
#include "linux/mounts.h"
#include "linux/rlimits.h"
#include "linux/seccomp_policy.h"
#include "linux/sys.h"
#include "net/box_egress.h"
#include "net/open_egress.h"
#include "sandbox/artifacts.h"
#include "sandbox/blocking.h"
#include "sandbox/default_limits.h"
#include "sandbox/exec_runner.h"
#include "sandbox/internal/ns_pool.h"
#include "sandbox/ns_backend.h"
#include "sandbox/ns_network.h"
#include "sandbox/path.h"
#include "sandbox/process.h"
#include "sandbox/process_table.h"
#include "sandbox/rooted_fs.h"

namespace agentbox::sandbox::ns_detail {

namespace lx = agentbox::linux;
namespace proto = agentbox::linux::initproto;
using ExitChannel =
    asio::experimental::concurrent_channel<void(boost::system::error_code, ExitStatus)>;
// A process's start: its pid in the box once ChildReady came; an error if it never will.
using StartChannel = asio::experimental::concurrent_channel<void(boost::system::error_code, int)>;

inline constexpr std::string_view kWorkspace = lx::kBoxWorkspacePath;
// How long an exec request may wait for room in a busy init's queue.
inline constexpr std::chrono::seconds kSendTimeout{10};

inline Error with_context(Error e, std::string_view context) {
  e.message = std::string(context) + ": " + e.message;
  return e;
}

inline ExitStatus exit_status_of(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    return ExitStatus{128 + WTERMSIG(wait_status), WTERMSIG(wait_status)};
  }
  return ExitStatus{WEXITSTATUS(wait_status), std::nullopt};
}

// A command that died with its box (shutdown, the init killed): reported as SIGKILLed.
inline constexpr ExitStatus kKilledWithBox{128 + SIGKILL, SIGKILL};

inline std::string last_component(const std::string& abs) {
  const std::size_t slash = abs.rfind('/');
  return slash == std::string::npos ? abs : abs.substr(slash + 1);
}

// ---- Threads ------------------------------------------------------------------------------------

// Runs jobs one at a time on its own long-lived thread (see ns_backend.h: PDEATHSIG).
class Spawner {
 public:
  Spawner() : thread_([this] { loop(); }) {}
  ~Spawner() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Runs `fn` on the spawner thread and waits for it.
  void run(const std::function<void()>& fn) {
    Job job{&fn, false};
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(&job);
    }
    cv_.notify_all();
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&job] { return job.done; });
  }

 private:
  struct Job {
    const std::function<void()>* fn;
    bool done;
  };
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_
      Job* job = jobs_.front();
      jobs_.pop_front();
      lock.unlock();
      (*job->fn)();
      lock.lock();
      job->done = true;
      done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  std::deque<Job*> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

// A box command's PATH (NsBackendOptions::path_prefix goes first).
constexpr char kBoxPath[] =
    "/workspace/.venv/bin:/workspace/node_modules/.bin:"  // seed 004: the workspace's installs
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
// The part of kBoxPath that goes before a --toolchain-path prefix.
constexpr std::string_view kWorkspaceBins = "/workspace/.venv/bin:/workspace/node_modules/.bin";
static_assert(std::string_view(kBoxPath).starts_with(kWorkspaceBins) &&
              kBoxPath[kWorkspaceBins.size()] == ':');

// What the backend and all its sandboxes share; sandboxes keep it alive.
struct Core {
  NsBackendOptions opts;
  std::string init_path;
  Status usable;
  std::unique_ptr<lx::CgroupDriver> driver;
  UniqueFd init_fd;
  lx::SeccompProgram seccomp;
  std::string root_mountpoint;

  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::thread io_thread;
  Spawner spawner;
  // Boxes started ahead (ns_pool.h); null when NsBackendOptions::pool_size is 0. Its thread
  // started every pooled box, bound ones included: it goes with the core, after every box.
  std::unique_ptr<BoxPool> pool;

  Core() : io_thread([this] { run_io(); }) {}
  ~Core() {
    pool.reset();  // its boxes not taken die, their cgroups go before the parent below
    work.reset();
    io.stop();
    io_thread.join();
    // The backend and every box are gone (boxes hold the core): a clean exit leaves no
    // agentbox-<hash> cgroup dirs behind (DESIGN.md "Lifecycle"; kill -9 leftovers are
    // removed at the next start by remove_stale()).
    if (driver && usable) {
      if (auto st = driver->remove_parent(); !st) {
        spdlog::warn("ns backend: removing cgroup {}: {}", driver->parent_path(),
                     st.error().message);
      }
    }
  }

  // Where box control sockets are read (NsBackendOptions::control, else the io thread).
  asio::any_io_executor control_executor() {
    return opts.control ? opts.control : asio::any_io_executor(io.get_executor());
  }
  // Where a ChildReady without self-join is handled: off the network thread when the control
  // sockets are read there (Conn::admit_on); empty = inline.
  asio::any_io_executor admit_executor() const {
    return opts.control ? opts.blocking : asio::any_io_executor();
  }

  void run_io() {
    for (;;) {
      try {
        io.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("ns backend io thread: {}", e.what());
      }
    }
  }
};

// ---- One exec, as the control-socket reader sees it --------------------------------------------

struct Pending {
  explicit Pending(const asio::any_io_executor& ex) : exit(ex, 1) {}
  std::mutex mu;                       // guards the fields below (not `exit`: thread-safe itself)
  std::unique_ptr<lx::Cgroup> cgroup;  // the exec's child cgroup
  UniqueFd go;                         // write end of the go pipe; closed once used or cancelled
  bool self_join = false;              // the command joins its cgroup itself (no go pipe)
  bool killed = false;                 // kill_tree() ran: the command must not be let go
  bool started = false;
  pid_t host_pid = 0;
  std::string start_error;     // why the daemon refused to let it start, if it did
  std::uint64_t cpu_usec = 0;  // the leader's CPU time, from its Exited report
  // The kill-cause counters of the exec's cgroup and of the box's before the command started
  // (execs only), for killed_by. Set before the request is sent; read after the exit.
  lx::CgroupEvents exec_events;
  lx::CgroupEvents box_events;
  bool have_events = false;
  ExitChannel exit;
  std::uint64_t id = 0;
  // Processes only (not execs): told the box pid at ChildReady, or an error if it never came.
  std::unique_ptr<StartChannel> started_ch;

  // Under mu.
  void report_start(bool ok, int box_pid) {
    if (!started_ch) return;
    (void)started_ch->try_send(ok ? boost::system::error_code{}
                                  : asio::error::make_error_code(asio::error::operation_aborted),
                               box_pid);
  }
};

// The daemon's side of one box's control socket. Holds no Asio object: the reader's descriptor
// lives in read_loop()'s frame on the control executor, so a Conn may outlive that executor's
// io_context (the daemon's network context goes before its sessions; see NsBackendOptions).
struct Conn {
  Conn(UniqueFd recv, UniqueFd send, asio::any_io_executor admit)
      : recv_fd(std::move(recv)), send_fd(std::move(send)), admit_on(std::move(admit)) {}

  // A dup of the box's control fd for the reader; read_loop() takes it.
  UniqueFd recv_fd;
  // Another dup, for Signal requests from any thread; open as long as the Conn lives (its
  // number is not reused while a process still holds the Conn).
  const UniqueFd send_fd;
  // Where a ChildReady that needs the daemon to move the child into its cgroup (no self-join:
  // a cgroup migration, which can wait for an RCU grace period) is handled: the blocking pool
  // when the reader runs on the network thread. Empty: inline, on the reader's thread.
  const asio::any_io_executor admit_on;

  std::mutex mu;
  std::unordered_map<std::uint64_t, std::shared_ptr<Pending>> pending;  // guarded by mu
  bool dead = false;                                                    // guarded by mu

  // Registers an exec; false when the box is gone.
  bool add(std::uint64_t id, std::shared_ptr<Pending> p) {
    std::lock_guard lock(mu);
    if (dead) return false;
    pending.emplace(id, std::move(p));
    return true;
  }
  std::shared_ptr<Pending> find(std::uint64_t id, bool erase) {
    std::lock_guard lock(mu);
    auto it = pending.find(id);
    if (it == pending.end()) return nullptr;
    auto p = it->second;
    if (erase) pending.erase(it);
    return p;
  }
  // The box is gone: every waiting exec completes as killed.
  void fail_all() {
    std::unordered_map<std::uint64_t, std::shared_ptr<Pending>> gone;
    {
      std::lock_guard lock(mu);
      dead = true;
      gone.swap(pending);
    }
    for (auto& [id, p] : gone) {
      {
        std::lock_guard lock(p->mu);
        p->go.reset();  // a child still waiting for its go exits 127
        if (!p->started) p->report_start(false, 0);
      }
      (void)p->exit.try_send(boost::system::error_code{}, kKilledWithBox);
    }
  }
  // Any thread: the reader sees EOF and ends (shutdown(2) on the shared socket, no post to its
  // executor, which may not run any more).
  void stop_reading() { (void)::shutdown(send_fd.get(), SHUT_RD); }
};

// The control-socket reader (ns_box_io.cc): one per box, on the network thread, until the init's
// socket closes; then every exec still waiting fails.
void admit_child(Pending& p, const lx::BoxMessage& m);
void on_child_ready(Conn& conn, const lx::BoxMessage& m);
void on_exited(Conn& conn, const lx::BoxMessage& m);
asio::awaitable<void> read_loop(std::shared_ptr<Conn> conn);

// ---- The Process handed to the exec runner ----------------------------------------------------

class NsProcess final : public Process {
 public:
  explicit NsProcess(std::shared_ptr<Pending> p) : p_(std::move(p)) {}
  // A process of the process table: can be signalled through the init, and releases its cgroup.
  NsProcess(std::shared_ptr<Pending> p, std::shared_ptr<Conn> conn, std::shared_ptr<Core> core)
      : p_(std::move(p)), conn_(std::move(conn)), core_(std::move(core)) {}

  Status signal(int signo) override {
    if (!conn_) return Process::signal(signo);
    // Through the init: it signals the leader only while it has not reaped it, so the pid
    // cannot be another process's (initproto Signal).
    int err = lx::send_signal_request(conn_->send_fd.get(), p_->id, signo);
    if (err == 0) return {};
    if (err == EAGAIN || err == ENOBUFS) {
      return fail(Code::kUnavailable, "signal: the box's init is busy; try again");
    }
    return fail_errno(err, "signal: send to the box's init");
  }

  asio::awaitable<void> release() override {
    if (!core_) co_return;
    std::shared_ptr<Pending> p = p_;
    auto job = run_blocking(core_->opts.blocking, [p]() -> Status {
      (void)p->cgroup->kill_all();
      return p->cgroup->destroy();
    });
    Status s = co_await std::move(job);
    // After a shutdown the box cgroup (and this child of it) is gone already.
    if (!s) spdlog::debug("ns process: releasing its cgroup: {}", s.error().message);
  }

  asio::awaitable<ExitStatus> wait() override {
    auto [ec, status] = co_await p_->exit.async_receive(asio::as_tuple(asio::use_awaitable));
    if (ec) co_return kKilledWithBox;
    co_return status;
  }

  void kill_tree() override {
    {
      std::lock_guard lock(p_->mu);
      p_->killed = true;
      p_->go.reset();  // not started yet: it never will be
    }
    // The cgroup holds every process the command started, whatever it did (setsid, double
    // fork, SIGTERM ignored).
    if (auto s = p_->cgroup->kill_all(); !s) {
      spdlog::warn("ns backend: kill_tree: {}", s.error().message);
    }
  }

 private:
  std::shared_ptr<Pending> p_;
  std::shared_ptr<Conn> conn_;  // processes only: Signal requests go through it
  std::shared_ptr<Core> core_;  // processes only: the blocking pool for release()
};

// Runs with the session's fsuid/fsgid on this thread for its lifetime: file operations get the
// permissions the session user has in its box (and create files it owns). The kernel drops the
// filesystem capabilities (DAC override, chown, ...) from the effective set while fsuid != 0 and
// restores them when it is back to 0. setfsuid/setfsgid are per thread (raw syscalls: glibc does
// not broadcast them).
class ScopedFsIdentity {
 public:
  ScopedFsIdentity(uid_t uid, gid_t gid) {
    // A credential change clears the thread's parent-death signal; a supervisor (or the test
    // fixture) that set one must keep it, so it is put back when the identity is restored.
    if (::prctl(PR_GET_PDEATHSIG, &pdeathsig_) != 0) pdeathsig_ = 0;
    old_gid_ = static_cast<gid_t>(::syscall(SYS_setfsgid, gid));
    old_uid_ = static_cast<uid_t>(::syscall(SYS_setfsuid, uid));
    // setfsuid reports the previous value; asking again (-1 changes nothing) tells the current.
    ok_ = static_cast<uid_t>(::syscall(SYS_setfsuid, -1)) == uid &&
          static_cast<gid_t>(::syscall(SYS_setfsgid, -1)) == gid;
  }
  ~ScopedFsIdentity() {
    ::syscall(SYS_setfsuid, old_uid_);
    ::syscall(SYS_setfsgid, old_gid_);
    if (pdeathsig_ != 0) ::prctl(PR_SET_PDEATHSIG, pdeathsig_);
  }
  bool ok() const { return ok_; }

 private:
  uid_t old_uid_;
  gid_t old_gid_;
  int pdeathsig_ = 0;
  bool ok_ = false;
};

// ---- The sandbox -------------------------------------------------------------------------------

class NsSandbox final : public Sandbox, private ProcessLauncher {
 public:
  NsSandbox(std::shared_ptr<Core> core, std::string key, uid_t uid, gid_t gid,
            std::uint32_t cpu_time_sec, std::map<std::string, std::string> env,
            std::unique_ptr<lx::Cgroup> cgroup, std::unique_ptr<lx::Box> box, UniqueFd root,
            UniqueFd mntns, UniqueFd control_dup)
      : core_(std::move(core)),
        key_(std::move(key)),
        uid_(uid),
        gid_(gid),
        cpu_time_sec_(cpu_time_sec),
        env_(std::move(env)),
        cgroup_(std::move(cgroup)),
        box_(std::move(box)),
        net_(std::make_unique<BoxNetwork>(core_->io, box_->init_pid(), core_->opts.network, key_)),
        mntns_(std::move(mntns)),
        fs_(std::move(root), RootMode::kInRoot, Owner{uid, gid}),
        conn_(std::make_shared<Conn>(std::move(control_dup),
                                     UniqueFd(::fcntl(box_->control_fd(), F_DUPFD_CLOEXEC, 3)),
                                     core_->admit_executor())) {
    asio::co_spawn(core_->control_executor(), read_loop(conn_), LogErrors{"box control reader"});
  }

  ~NsSandbox() override { shutdown(); }

  std::string_view name() const override { return "ns"; }
  std::string workspace() const override { return std::string(kWorkspace); }
  std::optional<uid_t> uid() const override { return uid_; }

  asio::awaitable<Result<ExecResult>> exec(ExecSpec spec, OutputSink* sink) override;

  ProcessTable* processes() override { return &procs_; }

  // The network mode the box starts in (a live change is set_network); blocking.
  Status start_network(const NetworkMode& mode) { return net_->set_mode(mode); }

  Status set_network(const NetworkMode& mode) override { return net_->set_mode(mode); }

  Status set_egress_policy(std::shared_ptr<const net::Policy> policy) override {
    return net_->set_policy(std::move(policy));
  }

  std::optional<net::ProxyCounters> egress_counters() const override { return net_->counters(); }

  Result<BoxUsage> usage() override {
    std::lock_guard lock(cgroup_mu_);
    if (shut_down_cgroups_) return fail(Code::kUnavailable, "box " + key_ + " is shut down");
    auto u = cgroup_->usage();
    if (!u) return std::unexpected(with_context(u.error(), "box " + key_ + ": usage"));
    BoxUsage out{u->memory_bytes, u->cpu_usec, u->tasks};
    if (!out.cpu_usec) {
      // A v1 host whose cpuacct is not mounted with cpu: the box's processes and what they
      // reaped (the box init reaps every orphan, so that is all the box ran).
      if (auto pids = cgroup_->pids()) out.cpu_usec = lx::proc_tree_cpu_usec(*pids);
    }
    return out;
  }

  // memory, cpu and pids into the box cgroup (limits on it bound every exec child below it);
  // cpu_time_sec for the commands started from now on.
  Status set_limits(const Limits& limits) override {
    lx::CgroupLimits cl;
    cl.memory_bytes = limits.memory_mb.value_or(kDefaultMemoryMb) << 20;
    cl.cpu_percent = limits.cpu_percent.value_or(kDefaultCpuPercent);
    cl.max_pids = limits.max_pids.value_or(kDefaultMaxPids);
    {
      std::lock_guard lock(cgroup_mu_);
      if (shut_down_cgroups_) return fail(Code::kUnavailable, "box " + key_ + " is shut down");
      if (auto st = cgroup_->set_limits(cl); !st) {
        return std::unexpected(with_context(st.error(), "box " + key_ + ": limits"));
      }
    }
    cpu_time_sec_.store(limits.cpu_time_sec.value_or(0));
    return {};
  }

  // Mounts into the running box (linux/host_binds.h): prepared here as for a start (idmapped
  // when rw), attached from a helper thread in the box's mount namespace. Not live (false) when
  // a mountpoint cannot be made in the running box or the box is going down.
  Result<bool> add_mounts(const std::vector<BindMount>& mounts) override {
    std::vector<lx::PreparedBind> prepared;
    for (const BindMount& m : mounts) {
      prepared.push_back(
          AB_TRY(lx::prepare_bind({m.host_path, m.box_path, m.read_only, m.what}, uid_, gid_)));
    }
    std::lock_guard live(live_mounts_mu_);
    if (is_shut_down()) return false;
    lx::AttachOutcome out = AB_TRY(lx::attach_binds(mntns_.get(), fs_.root_fd(), prepared));
    if (!out.attached) {
      spdlog::info("ns box {}: mounts left for the next start: {}", key_, out.not_now);
      return false;
    }
    // Shut down meanwhile: the namespace they went into is gone; the next start has them.
    return !is_shut_down();
  }

  Result<FileReader> open_file(const std::string& path) override {
    auto abs = map_path(path);
    if (!abs) return std::unexpected(abs.error());
    ScopedFsIdentity as_user(uid_, gid_);
    if (!as_user.ok()) return identity_error();
    return fs_.open_file(*abs);
  }

  Result<std::unique_ptr<FileWriter>> create_file(const std::string& path,
                                                  WriteOptions opts) override {
    auto abs = map_path(path);
    if (!abs) return std::unexpected(abs.error());
    ScopedFsIdentity as_user(uid_, gid_);
    if (!as_user.ok()) return identity_error();
    auto w = fs_.create_file(*abs, opts);
    if (!w) return w;
    // The writer's later write()/commit() calls may run on another thread: keep the identity
    // for them too.
    return std::unique_ptr<FileWriter>(new AsUserWriter(std::move(*w), uid_, gid_));
  }

  Result<FileInfo> stat(const std::string& path) override {
    auto abs = map_path(path);
    if (!abs) return std::unexpected(abs.error());
    ScopedFsIdentity as_user(uid_, gid_);
    if (!as_user.ok()) return identity_error();
    auto info = fs_.stat(*abs);
    if (!info) return info;
    info->name = last_component(*abs);
    info->path = *abs;
    return info;
  }

  Result<std::vector<DirEntry>> read_dir(const std::string& path) override {
    auto abs = map_path(path);
    if (!abs) return std::unexpected(abs.error());
    ScopedFsIdentity as_user(uid_, gid_);
    if (!as_user.ok()) return identity_error();
    return fs_.read_dir(*abs);
  }

  Status mkdir_all(const std::string& path) override {
    auto abs = map_path(path);
    if (!abs) return std::unexpected(abs.error());
    ScopedFsIdentity as_user(uid_, gid_);
    if (!as_user.ok()) return identity_error();
    return fs_.mkdir_all(*abs);
  }

  Status remove(const std::string& path) override {
    auto abs = map_path(path);
    if (!abs) return std::unexpected(abs.error());
    if (auto s = refuse_special(*abs, "remove"); !s) return s;
    ScopedFsIdentity as_user(uid_, gid_);
    if (!as_user.ok()) return identity_error();
    return fs_.remove(*abs);
  }

  Status remove_all(const std::string& path) override {
    auto abs = map_path(path);
    if (!abs) return std::unexpected(abs.error());
    if (auto s = refuse_special(*abs, "remove_all"); !s) return s;
    ScopedFsIdentity as_user(uid_, gid_);
    if (!as_user.ok()) return identity_error();
    return fs_.remove_all(*abs);
  }

  Status rename(const std::string& from, const std::string& to) override {
    auto f = map_path(from);
    if (!f) return std::unexpected(f.error());
    auto t = map_path(to);
    if (!t) return std::unexpected(t.error());
    if (auto s = refuse_special(*f, "rename"); !s) return s;
    if (auto s = refuse_special(*t, "rename"); !s) return s;
    ScopedFsIdentity as_user(uid_, gid_);
    if (!as_user.ok()) return identity_error();
    return fs_.rename(*f, *t);
  }

  Result<UniqueFd> open_dir(const std::string& path) override {
    auto abs = map_path(path);
    if (!abs) return std::unexpected(abs.error());
    ScopedFsIdentity as_user(uid_, gid_);
    if (!as_user.ok()) return identity_error();
    return fs_.open_dir(*abs);
  }

  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      if (shut_down_) return;
      shut_down_ = true;
    }
    // The box can no longer reach out: its proxy stops listening, its route out goes.
    net_->stop();
    // Their ends are reported as asked for (no supervisor restarts them).
    procs_.shutdown();
    // SECURITY: every process of the box dies: the cgroup first (it holds the init and every
    // command), then the init itself through its pidfd (which takes the pid namespace with it).
    {
      std::lock_guard lock(cgroup_mu_);
      // The spares are children of cgroup_: its destroy() removes their directories.
      shut_down_cgroups_ = true;
      spare_cgroups_.clear();
      if (auto s = cgroup_->destroy(); !s) {
        spdlog::warn("ns box {}: destroy cgroup: {}", key_, s.error().message);
      }
    }
    box_->kill_and_reap();
    conn_->fail_all();
    // The reader ends on its own thread (the init's death closed the socket's other end too).
    conn_->stop_reading();
  }

 private:
  // An exec between its validation and its run: what exec() needs across its co_awaits. The
  // synchronous parts live in prepare_exec()/finish_exec(), which keeps the coroutine small.
  struct Prepared {
    std::uint64_t id = 0;
    std::string msg;  // the encoded ExecRequest
    std::optional<Pipe> in;
    Pipe out;
    Pipe err;
    UniqueFd go_read;                // without self-join
    std::vector<UniqueFd> join_fds;  // with self-join: the exec cgroup's `tasks` files
    std::shared_ptr<Pending> pending;
    std::optional<std::string> artifact_dir;  // normalised in-box path
    TreeSnapshot before;
    UniqueFd pty_master;  // with a pty: no pipes; the slave goes as stdin, stdout and stderr
    UniqueFd pty_slave;

    // The fds for the init, in ExecRequest order.
    std::vector<int> box_fds() const {
      std::vector<int> fds;
      if (pty_slave) {
        fds = {pty_slave.get(), pty_slave.get(), pty_slave.get()};
      } else {
        if (in) fds.push_back(in->read.get());
        fds.push_back(out.write.get());
        fds.push_back(err.write.get());
      }
      if (pending->self_join) {
        for (const UniqueFd& fd : join_fds) fds.push_back(fd.get());
      } else {
        fds.push_back(go_read.get());
      }
      return fds;
    }
    // Once sent: the box's ends are the init's now.
    void close_box_ends() {
      if (in) in->read.reset();
      out.write.reset();
      err.write.reset();
      pty_slave.reset();
      go_read.reset();
      join_fds.clear();
    }
  };
  Result<Prepared> prepare_exec(ExecSpec& spec, const asio::any_io_executor& ex, bool with_stdin,
                                const std::optional<PtySize>& pty);
  // A pty in the box's own devpts, opened as the session user (who then owns the slave).
  Status open_pty(Prepared& prep, PtySize size);
  // ProcessLauncher: the process table's way to start a command in this box.
  asio::awaitable<Result<Launched>> launch(ProcessSpec spec) override;
  // The cwd (into cmd), resolved in the box with the session user's permissions.
  Status check_paths(const ExecSpec& spec, lx::ExecCommand& cmd);
  // The artifact dir's state before a command, as the session user sees it. Blocking (a
  // directory walk): runs on the pool.
  Result<TreeSnapshot> snapshot_artifact_dir(const std::string& dir_path);
  // After a run: the exec cgroup released and the artifacts scanned. Blocking: runs on the pool.
  void finish_exec(Prepared& prep, ExecResult& result);
  // exec() with the caller's throw-on-cancellation switched off.
  asio::awaitable<Result<ExecResult>> exec_uncancellable(ExecSpec spec, OutputSink* sink);
  // The kill-cause counters before an exec (Pending::exec_events/box_events). Best effort: a
  // failed read leaves have_events false, and the exec then names no limit as its cause.
  void record_events_before(Pending& p);
  // Why a finished exec was stopped, from its exit and the counters (API.md killed_by). Before
  // its cgroup is released.
  KilledBy killed_by(Pending& p, const ExecResult& r);

  // A FileWriter whose calls run with the session's fs identity (see ScopedFsIdentity).
  class AsUserWriter final : public FileWriter {
   public:
    AsUserWriter(std::unique_ptr<FileWriter> w, uid_t uid, gid_t gid)
        : w_(std::move(w)), uid_(uid), gid_(gid) {}
    ~AsUserWriter() override {
      ScopedFsIdentity as_user(uid_, gid_);
      w_.reset();  // removes the temp file of an uncommitted write
    }
    Status write(std::string_view chunk) override {
      ScopedFsIdentity as_user(uid_, gid_);
      return w_->write(chunk);
    }
    Result<std::uint64_t> commit() override {
      ScopedFsIdentity as_user(uid_, gid_);
      if (!as_user.ok()) return identity_error();
      return w_->commit();
    }

   private:
    std::unique_ptr<FileWriter> w_;
    uid_t uid_;
    gid_t gid_;
  };

  static std::unexpected<Error> identity_error() {
    return fail(Code::kInternal, "could not switch to the session's file identity");
  }

  bool is_shut_down() const {
    std::lock_guard lock(mu_);
    return shut_down_;
  }

  Result<std::string> map_path(std::string_view path) const {
    {
      std::lock_guard lock(mu_);
      if (shut_down_) return fail(Code::kUnavailable, "box " + key_ + " is shut down");
    }
    return normalize_box_path(path, kWorkspace);
  }

  // "/" and "/workspace" cannot be removed or renamed (they are the box, not its files).
  static Status refuse_special(const std::string& abs, const char* op) {
    if (abs == "/" || abs == kWorkspace) {
      return fail(Code::kAccess, std::string(op) + "(" + abs + "): not allowed on " +
                                     (abs == "/" ? "the root" : "the workspace itself"));
    }
    return {};
  }

  // An empty child cgroup for one exec: a spare one an earlier exec left empty, else a new one.
  // Recycling keeps mkdir and rmdir in four v1 hierarchies (memcg creation and offlining the
  // costliest) off every exec's path.
  Result<std::unique_ptr<lx::Cgroup>> make_exec_cgroup(std::uint64_t id) {
    std::lock_guard lock(cgroup_mu_);
    if (!spare_cgroups_.empty()) {
      std::unique_ptr<lx::Cgroup> cg = std::move(spare_cgroups_.back());
      spare_cgroups_.pop_back();
      return cg;
    }
    return cgroup_->make_child("x" + std::to_string(id));
  }

  // Keeps an exec cgroup for the next exec if it is empty (nothing of the exec left in it, so
  // the next exec's kill reaches only its own processes), else removes it. True if recycled.
  bool recycle_exec_cgroup(std::unique_ptr<lx::Cgroup>& cg) {
    auto pids = cg->pids();
    if (!pids || !pids->empty()) return false;
    std::lock_guard lock(cgroup_mu_);
    if (spare_cgroups_.size() >= kSpareExecCgroups || shut_down_cgroups_) return false;
    spare_cgroups_.push_back(std::move(cg));
    return true;
  }

  // The common end of an exec, done inline on the io thread: nothing of the command is left
  // (its cgroup is empty) and there is no artifact scan. False: finish_exec() on the pool.
  bool finish_exec_fast(Prepared& prep) {
    if (prep.artifact_dir) return false;
    {
      std::lock_guard lock(prep.pending->mu);
      if (prep.pending->killed || !prep.pending->start_error.empty()) return false;
    }
    return recycle_exec_cgroup(prep.pending->cgroup);
  }

  // After a run: background jobs the command left (when it was not killed) move to the box
  // cgroup, where they live until shutdown; then the exec's cgroup goes. The exec cgroup is
  // frozen for the move (Cgroup::move_processes_to): moving pids from a listing while they run
  // would miss children forked between the listing and the move, and the removal below would
  // then kill them (and with them a job that keeps re-forking itself).
  void release_exec_cgroup(Pending& p) {
    bool killed;
    {
      std::lock_guard lock(p.mu);
      killed = p.killed;
    }
    if (!killed) {
      {
        std::lock_guard lock(cgroup_mu_);
        if (auto s = p.cgroup->move_processes_to(*cgroup_); !s) {
          spdlog::warn("ns box {}: keeping background processes: {}", key_, s.error().message);
        }
      }
      if (recycle_exec_cgroup(p.cgroup)) return;
    }
    if (auto s = p.cgroup->destroy(); !s) {
      spdlog::warn("ns box {}: exec cgroup: {}", key_, s.error().message);
    }
  }

  // Sends a prepared exec to the init and closes the box's ends of its fds; on failure the
  // exec is forgotten and its cgroup goes. `prep` lives in the caller's frame.
  asio::awaitable<Status> send_prepared(Prepared* prep);

  asio::awaitable<Status> send_request(std::string msg, std::vector<int> fds) {
    const auto deadline = std::chrono::steady_clock::now() + kSendTimeout;
    auto ex = co_await asio::this_coro::executor;
    for (;;) {
      int err = lx::send_exec_request(box_->control_fd(), msg, fds.data(),
                                      static_cast<int>(fds.size()), true);
      if (err == 0) co_return Status{};
      if (err != EAGAIN && err != ENOBUFS) {
        co_return fail(err == EPIPE || err == ECONNRESET ? Code::kUnavailable : code_for_errno(err),
                       "box " + key_ + ": send exec request: " + std::strerror(err));
      }
      // The init's queue is full (it is busy forking): wait a little. Rare; a timer is simpler
      // than a second descriptor on the io thread for write readiness.
      if (std::chrono::steady_clock::now() >= deadline) {
        co_return fail(Code::kUnavailable, "box " + key_ + ": the init does not take requests");
      }
      // as_tuple: a cancelled wait (the caller gave up) just retries; run_process then kills
      // the command at once.
      asio::steady_timer t(ex, std::chrono::milliseconds(1));
      auto [ec] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      (void)ec;
    }
  }

  std::shared_ptr<Core> core_;
  const std::string key_;
  const uid_t uid_;
  const gid_t gid_;
  // RLIMIT_CPU of every command (limits.cpu_time_sec); 0 none. set_limits() changes it.
  std::atomic<std::uint32_t> cpu_time_sec_;
  const std::map<std::string, std::string> env_;
  std::mutex cgroup_mu_;  // serialises use of cgroup_ (thread-compatible)
  std::unique_ptr<lx::Cgroup> cgroup_;
  // Empty exec cgroups kept for reuse, and whether shutdown() took them; under cgroup_mu_.
  static constexpr std::size_t kSpareExecCgroups = 4;
  std::vector<std::unique_ptr<lx::Cgroup>> spare_cgroups_;
  bool shut_down_cgroups_ = false;
  std::unique_ptr<lx::Box> box_;
  std::unique_ptr<BoxNetwork> net_;  // its proxy or veth, as its network mode has it
  // The box's mount namespace (/proc/<init>/ns/mnt), for mounts added while it runs; opened
  // while the init was surely ours (not yet reaped). live_mounts_mu_ serialises those adds.
  const UniqueFd mntns_;
  std::mutex live_mounts_mu_;
  const RootedFs fs_;
  std::shared_ptr<Conn> conn_;
  std::atomic<std::uint64_t> next_id_{0};
  mutable std::mutex mu_;
  bool shut_down_ = false;     // guarded by mu_
  ProcessTable procs_{*this};  // last: shut down (in ~NsSandbox) before the rest goes
};

}  // namespace agentbox::sandbox::ns_detail
