#include "sandbox/ns_backend.h"

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
#include "sandbox/ns_network.h"
#include "sandbox/path.h"
#include "sandbox/process.h"
#include "sandbox/process_table.h"
#include "sandbox/rooted_fs.h"

namespace agentbox::sandbox {
namespace {

namespace lx = agentbox::linux;
namespace proto = agentbox::linux::initproto;
using ExitChannel =
    asio::experimental::concurrent_channel<void(boost::system::error_code, ExitStatus)>;
// A process's start: its pid in the box once ChildReady came; an error if it never will.
using StartChannel = asio::experimental::concurrent_channel<void(boost::system::error_code, int)>;

constexpr std::string_view kWorkspace = lx::kBoxWorkspacePath;
// How long an exec request may wait for room in a busy init's queue.
constexpr std::chrono::seconds kSendTimeout{10};

Error with_context(Error e, std::string_view context) {
  e.message = std::string(context) + ": " + e.message;
  return e;
}

ExitStatus exit_status_of(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    return ExitStatus{128 + WTERMSIG(wait_status), WTERMSIG(wait_status)};
  }
  return ExitStatus{WEXITSTATUS(wait_status), std::nullopt};
}

// A command that died with its box (shutdown, the init killed): reported as SIGKILLed.
constexpr ExitStatus kKilledWithBox{128 + SIGKILL, SIGKILL};

std::string last_component(const std::string& abs) {
  const std::size_t slash = abs.rfind('/');
  return slash == std::string::npos ? abs : abs.substr(slash + 1);
}

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

  Core() : io_thread([this] { run_io(); }) {}
  ~Core() {
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
  std::string start_error;  // why the daemon refused to let it start, if it did
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

// No self-join: the daemon moves the child into its cgroup, then lets it go (see Conn::admit_on).
void admit_child(Pending& p, const lx::BoxMessage& m) {
  std::lock_guard lock(p.mu);
  if (!p.go) return;  // ended or cancelled meanwhile
  // SECURITY: the sender must be the freshly forked child, still root and not yet the command
  // (only the init and its pre-exec children hold the control socket).
  if (m.sender_pid <= 0 || m.sender_uid != 0) {
    p.start_error = "bad start report from the box (pid " + std::to_string(m.sender_pid) +
                    ", uid " + std::to_string(m.sender_uid) + ")";
    p.go.reset();
    return;
  }
  if (p.killed) {
    p.go.reset();
    return;
  }
  // SECURITY: into the exec's cgroup before it may exec, so nothing it starts escapes kill_tree.
  if (auto s = p.cgroup->add_process(m.sender_pid); !s) {
    p.start_error = "could not put the command into its cgroup: " + s.error().message;
    p.go.reset();
    return;
  }
  p.host_pid = m.sender_pid;
  p.started = true;
  p.report_start(true, m.box_pid);
  const char go = 'g';
  (void)!::write(p.go.get(), &go, 1);
  p.go.reset();
}

void on_child_ready(Conn& conn, const lx::BoxMessage& m) {
  auto p = conn.find(m.id, false);
  if (!p) return;  // unknown or already finished: the child reads EOF on its go pipe... if any
  {
    std::lock_guard lock(p->mu);
    if (p->self_join) {
      // The child is in its cgroup already and on its way to exec.
      p->host_pid = m.sender_pid;
      p->started = true;
      p->report_start(true, m.box_pid);
      // SECURITY: a kill_tree() that ran before the child joined found an empty cgroup; the
      // child joined before sending this, so killing again now reaches it and all it started.
      if (p->killed) {
        if (auto s = p->cgroup->kill_all(); !s) {
          spdlog::warn("ns backend: kill after a racing start: {}", s.error().message);
        }
      }
      return;
    }
    if (!p->go) return;
  }
  if (!conn.admit_on) {
    admit_child(*p, m);
    return;
  }
  asio::post(conn.admit_on, [p, m] { admit_child(*p, m); });
}

void on_exited(Conn& conn, const lx::BoxMessage& m) {
  auto p = conn.find(m.id, true);
  if (!p) return;
  {
    std::lock_guard lock(p->mu);
    p->go.reset();
    if (!p->started) p->report_start(false, 0);
    p->cpu_usec = m.cpu_usec;
  }
  (void)p->exit.try_send(boost::system::error_code{}, exit_status_of(m.status));
}

// Reads the box's control socket until it closes (the init is gone) or is shut down
// (Conn::stop_reading). Runs on the control executor: the daemon's network thread, where the
// execs and processes that wait for these reports run, so a report reaches them with no thread
// hop. The descriptor is this frame's: destroyed here, or with the frame when its io_context goes.
asio::awaitable<void> read_loop(std::shared_ptr<Conn> conn) {
  auto ex = co_await asio::this_coro::executor;
  asio::posix::stream_descriptor sd(ex, conn->recv_fd.release());
  for (;;) {
    auto [ec] = co_await sd.async_wait(asio::posix::stream_descriptor::wait_read,
                                       asio::as_tuple(asio::use_awaitable));
    if (ec) break;
    bool eof = false;
    // Bounded per wakeup, so one busy box cannot starve the others (or the network) on this
    // thread.
    for (int i = 0; i < 64; ++i) {
      lx::BoxMessage m;
      int n = lx::recv_box_message(sd.native_handle(), true, &m);
      if (n < 0 && errno == EAGAIN) break;
      if (n < 0 && errno == EBADMSG) {
        spdlog::warn("ns backend: dropped a malformed message from a box");
        continue;
      }
      if (n <= 0) {
        eof = true;
        break;
      }
      if (m.type == proto::MsgType::kChildReady) {
        on_child_ready(*conn, m);
      } else if (m.type == proto::MsgType::kExited) {
        on_exited(*conn, m);
      }
    }
    if (eof) break;
  }
  conn->fail_all();
}

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
  bool shut_down_ = false;  // guarded by mu_
  ProcessTable procs_{*this};  // last: shut down (in ~NsSandbox) before the rest goes
};

Status NsSandbox::check_paths(const ExecSpec& spec, lx::ExecCommand& cmd) {
  ScopedFsIdentity as_user(uid_, gid_);
  if (!as_user.ok()) return identity_error();
  // The cwd must be a directory the session user can enter, checked the way the command will
  // see it (an error naming it, never a silent fallback).
  auto cwd = normalize_box_path(spec.cwd.empty() ? std::string(kWorkspace) : spec.cwd, kWorkspace);
  if (!cwd) return std::unexpected(with_context(cwd.error(), "exec: cwd"));
  if (auto dir = fs_.open_dir(*cwd); !dir) {
    return std::unexpected(with_context(dir.error(), "exec: cwd"));
  }
  cmd.cwd = std::move(*cwd);
  return {};
}

Result<TreeSnapshot> NsSandbox::snapshot_artifact_dir(const std::string& dir_path) {
  ScopedFsIdentity as_user(uid_, gid_);
  if (!as_user.ok()) return identity_error();
  // A dir that does not exist yet counts as empty, so files in a dir the command creates are
  // reported too.
  auto dir = fs_.open_dir(dir_path);
  if (dir) return snapshot_tree(dir->get());
  if (dir.error().code == Code::kNotFound) return TreeSnapshot{};
  return std::unexpected(dir.error());
}

Result<NsSandbox::Prepared> NsSandbox::prepare_exec(ExecSpec& spec, const asio::any_io_executor& ex,
                                                    bool with_stdin,
                                                    const std::optional<PtySize>& pty) {
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return fail(Code::kUnavailable, "box " + key_ + " is shut down");
  }
  Prepared prep;
  lx::ExecCommand cmd;
  cmd.id = ++next_id_;
  cmd.uid = uid_;
  cmd.gid = gid_;
  cmd.oom_score_adj = core_->opts.command_oom_score_adj;
  cmd.cpu_time_sec = cpu_time_sec_.load();
  if (!spec.argv.empty()) {
    if (spec.argv.front().empty()) return fail(Code::kInvalid, "exec: argv[0] is empty");
    cmd.argv = std::move(spec.argv);
  } else if (!spec.command.empty()) {
    cmd.argv = {"/bin/sh", "-c", std::move(spec.command)};
  } else {
    return fail(Code::kInvalid, "exec: give argv or command");
  }

  if (auto s = validate::env(env_, "env"); !s) return std::unexpected(s.error());
  if (auto s = validate::env(spec.env, "env"); !s) return std::unexpected(s.error());
  std::map<std::string, std::string> env = {
      {"PATH", kBoxPath},
      {"HOME", std::string(kWorkspace)},
      {"USER", lx::kBoxUserName},
      {"LOGNAME", lx::kBoxUserName},
      {"LANG", "C.UTF-8"},
      {"TERM", pty ? "xterm-256color" : "dumb"},
  };
  for (const auto& [k, v] : env_) env[k] = v;
  if (net_->has_proxy()) {
    // The proxy is the box's only way out; its variables win over the session's env.
    for (auto& [k, v] : net::BoxEgress::box_env()) env[k] = std::move(v);
  }
  for (auto& [k, v] : spec.env) env[k] = std::move(v);
  cmd.env.reserve(env.size());
  for (const auto& [k, v] : env) cmd.env.push_back(k + "=" + v);

  if (auto s = check_paths(spec, cmd); !s) return std::unexpected(s.error());

  auto cg = make_exec_cgroup(cmd.id);
  if (!cg) return std::unexpected(with_context(cg.error(), "exec: box " + key_));
  prep.pending = std::make_shared<Pending>(ex);
  prep.pending->id = cmd.id;
  prep.pending->cgroup = std::move(*cg);
  auto drop = [&](Error e) -> std::unexpected<Error> {
    (void)prep.pending->cgroup->destroy();
    return std::unexpected(std::move(e));
  };
  // Where the driver allows it, the command joins its cgroup itself (initproto.h, "Self-join"):
  // one RCU grace period less per exec than the daemon moving it.
  auto join = prep.pending->cgroup->open_self_join();
  if (!join) return drop(join.error());
  prep.join_fds = std::move(*join);
  prep.pending->self_join = !prep.join_fds.empty();
  cmd.self_join_fds = static_cast<std::uint32_t>(prep.join_fds.size());

  cmd.pty = pty.has_value();
  auto msg = lx::encode_exec_request(cmd, with_stdin);
  if (!msg) return drop(msg.error());
  prep.id = cmd.id;
  prep.msg = std::move(*msg);

  // Pipes: the daemon keeps one end of each; the box ends go to the init and are closed once
  // sent.
  if (pty) {
    if (auto s = open_pty(prep, *pty); !s) return drop(s.error());
  } else {
    if (with_stdin) {
      auto p = linux::sys::pipe();
      if (!p) return drop(p.error());
      prep.in = std::move(*p);
    }
    auto out = linux::sys::pipe();
    if (!out) return drop(out.error());
    prep.out = std::move(*out);
    auto err = linux::sys::pipe();
    if (!err) return drop(err.error());
    prep.err = std::move(*err);
  }
  if (!prep.pending->self_join) {
    auto go = linux::sys::pipe();
    if (!go) return drop(go.error());
    prep.go_read = std::move(go->read);
    prep.pending->go = std::move(go->write);
  }
  if (!conn_->add(cmd.id, prep.pending)) {
    return drop(Error::make(Code::kUnavailable, "box " + key_ + " is gone"));
  }
  return prep;
}

void NsSandbox::record_events_before(Pending& p) {
  auto exec_ev = p.cgroup->events();
  Result<lx::CgroupEvents> box_ev = fail(Code::kUnavailable, "shut down");
  {
    std::lock_guard lock(cgroup_mu_);
    if (!shut_down_cgroups_) box_ev = cgroup_->events();
  }
  if (!exec_ev || !box_ev) {
    spdlog::debug("ns box {}: reading cgroup events: {}", key_,
                  (!exec_ev ? exec_ev.error() : box_ev.error()).message);
    return;
  }
  p.exec_events = *exec_ev;
  p.box_events = *box_ev;
  p.have_events = true;
}

KilledBy NsSandbox::killed_by(Pending& p, const ExecResult& r) {
  if (r.timed_out) return KilledBy::kTimeout;
  // Ended on its own with success, or stopped by the daemon (client gone): no limit to name.
  if (!r.signal && r.exit_code == 0) return KilledBy::kNone;
  std::uint64_t cpu_usec = 0;
  {
    std::lock_guard lock(p.mu);
    if (p.killed) return KilledBy::kNone;
    cpu_usec = p.cpu_usec;
  }
  // RLIMIT_CPU: SIGXCPU at the soft limit; SIGKILL at the hard one (the leader handled SIGXCPU);
  // or a shell leader that reports its command's SIGXCPU death as 128+SIGXCPU.
  if (cpu_time_sec_ != 0) {
    const bool xcpu = r.signal == SIGXCPU || (!r.signal && r.exit_code == 128 + SIGXCPU);
    const bool hard =
        r.signal == SIGKILL && cpu_usec >= static_cast<std::uint64_t>(cpu_time_sec_) * 1000000u;
    if (xcpu || hard) return KilledBy::kCpuTime;
  }
  if (!p.have_events) return KilledBy::kNone;
  auto exec_ev = p.cgroup->events();
  Result<lx::CgroupEvents> box_ev = fail(Code::kUnavailable, "shut down");
  {
    std::lock_guard lock(cgroup_mu_);
    if (!shut_down_cgroups_) box_ev = cgroup_->events();
  }
  // The OOM killer took a process of this exec (v1 counts it in the exec's memcg, v2 there and
  // above).
  if (exec_ev && exec_ev->oom_kills > p.exec_events.oom_kills) return KilledBy::kMemory;
  // A fork refused at the box's pids.max while it ran (counted in the exec's cgroup or the
  // box's, by kernel version: linux/cgroup.h CgroupEvents).
  if ((exec_ev && exec_ev->pids_max > p.exec_events.pids_max) ||
      (box_ev && box_ev->pids_max > p.box_events.pids_max)) {
    return KilledBy::kPids;
  }
  return KilledBy::kNone;
}

void NsSandbox::finish_exec(Prepared& prep, ExecResult& result) {
  release_exec_cgroup(*prep.pending);
  {
    std::lock_guard lock(prep.pending->mu);
    if (!prep.pending->start_error.empty()) {
      spdlog::warn("ns box {}: exec {}: {}", key_, prep.id, prep.pending->start_error);
    }
  }
  if (!prep.artifact_dir) return;
  ScopedFsIdentity as_user(uid_, gid_);
  if (auto dir = fs_.open_dir(*prep.artifact_dir)) {
    auto after = snapshot_tree(dir->get());
    if (after) {
      result.artifacts = diff_artifacts(prep.before, *after, dir->get(), *prep.artifact_dir);
    } else {
      spdlog::warn("ns box {}: artifact scan failed: {}", key_, after.error().message);
    }
  }
}

// g++ 12 reports a false -Wmismatched-new-delete on coroutine frames here: Asio's frame
// operator new (aligned_alloc through its recycling allocator) and its operator delete (free
// through the same allocator) are a matching pair the inliner loses track of.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
asio::awaitable<Result<ExecResult>> NsSandbox::exec(ExecSpec spec, OutputSink* sink) {
  // Cancellation kills the command inside run_process; the clean-up after it must not be
  // abandoned midway (exec_runner.h, without_throw_on_cancel).
  asio::awaitable<Result<ExecResult>> run = exec_uncancellable(std::move(spec), sink);
  auto guarded = without_throw_on_cancel(std::move(run));
  co_return co_await std::move(guarded);
}

asio::awaitable<Result<ExecResult>> NsSandbox::exec_uncancellable(ExecSpec spec, OutputSink* sink) {
  // The artifact dir's first snapshot, on the pool: a big dir must not stall the network
  // thread (and every other client) for the length of a directory walk.
  std::optional<std::string> artifact_dir;
  TreeSnapshot before;
  if (!spec.artifact_dir.empty()) {
    auto a = map_path(spec.artifact_dir);  // EUNAVAILABLE once shut down
    if (!a) co_return std::unexpected(with_context(a.error(), "exec: artifact_dir"));
    artifact_dir = std::move(*a);
    NsSandbox* self = this;  // the caller holds the sandbox for the whole exec
    std::string dir = *artifact_dir;
    auto job = run_blocking(core_->opts.blocking,
                            [self, dir] { return self->snapshot_artifact_dir(dir); });
    auto snap = co_await std::move(job);
    if (!snap) co_return std::unexpected(with_context(snap.error(), "exec: artifact_dir"));
    before = std::move(*snap);
  }

  asio::any_io_executor ex = co_await asio::this_coro::executor;
  auto prep = prepare_exec(spec, ex, !spec.stdin_data.empty(), std::nullopt);
  if (!prep) co_return std::unexpected(prep.error());
  prep->artifact_dir = std::move(artifact_dir);
  prep->before = std::move(before);
  record_events_before(*prep->pending);

  Status sent = co_await send_request(std::move(prep->msg), prep->box_fds());
  if (!sent) {
    conn_->find(prep->id, true);
    (void)prep->pending->cgroup->destroy();
    co_return std::unexpected(sent.error());
  }
  prep->close_box_ends();

  auto proc = std::make_unique<NsProcess>(prep->pending);
  if (prep->in) proc->stdin_fd = std::move(prep->in->write);
  proc->stdout_fd = std::move(prep->out.read);
  proc->stderr_fd = std::move(prep->err.read);

  // A named RunOptions, not a temporary in the co_await expression: g++ 12 mishandles the
  // lifetime of aggregate temporaries holding a std::string across co_await (double free).
  RunOptions opts;
  opts.timeout = spec.timeout;
  opts.max_output_bytes = spec.max_output_bytes;
  opts.stdin_data = std::move(spec.stdin_data);
  ExecResult result;
  std::string failure;
  try {
    result = co_await run_process(std::move(proc), std::move(opts), sink);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (failure.empty()) result.killed_by = killed_by(*prep->pending, result);
  if (!finish_exec_fast(*prep)) {
    NsSandbox* self = this;
    Prepared* p = &*prep;  // both live in this frame until the job has completed
    ExecResult* res = &result;
    auto finish = run_blocking(core_->opts.blocking, [self, p, res]() -> Status {
      self->finish_exec(*p, *res);
      return {};
    });
    Status finished = co_await std::move(finish);
    (void)finished;  // finish_exec reports its own problems (warnings); it cannot fail
  }
  if (!failure.empty()) co_return fail(Code::kInternal, "exec: " + failure);
  co_return result;
}

Status NsSandbox::open_pty(Prepared& prep, PtySize size) {
  // SECURITY: the box's own devpts instance (mounts.cc: newinstance), reached through the box
  // root without following any link, and opened as the session user: the pty lives in the box
  // (`tty` says /dev/pts/N there), belongs to the session user, and nothing of the host's ptys
  // is involved.
  ScopedFsIdentity as_user(uid_, gid_);
  if (!as_user.ok()) return identity_error();
  UniqueFd master(linux::sys::openat2_raw(fs_.root_fd(), "dev/pts/ptmx", O_RDWR | O_NOCTTY,
                                          RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS |
                                              RESOLVE_NO_SYMLINKS));
  if (!master) return fail_errno(errno, "process: open the box's /dev/pts/ptmx");
  int unlock = 0;
  if (::ioctl(master.get(), TIOCSPTLCK, &unlock) != 0) return fail_errno(errno, "unlockpt");
  winsize ws{};
  ws.ws_col = size.cols;
  ws.ws_row = size.rows;
  if (::ioctl(master.get(), TIOCSWINSZ, &ws) != 0) return fail_errno(errno, "ioctl(TIOCSWINSZ)");
  // The slave through the master (Linux 4.13+): no path of the box is walked again.
  UniqueFd slave(::ioctl(master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!slave) return fail_errno(errno, "ioctl(TIOCGPTPEER)");
  prep.pty_master = std::move(master);
  prep.pty_slave = std::move(slave);
  return {};
}

asio::awaitable<Result<Launched>> NsSandbox::launch(ProcessSpec spec) {
  ExecSpec es;
  es.argv = std::move(spec.argv);
  es.command = std::move(spec.command);
  es.cwd = std::move(spec.cwd);
  es.env = std::move(spec.env);
  asio::any_io_executor ex = co_await asio::this_coro::executor;
  auto prep = prepare_exec(es, ex, spec.stdin_open && !spec.pty, spec.pty);
  if (!prep) co_return std::unexpected(prep.error());
  prep->pending->started_ch = std::make_unique<StartChannel>(ex, 1);
  Status sent = co_await send_request(std::move(prep->msg), prep->box_fds());
  if (!sent) {
    conn_->find(prep->id, true);
    (void)prep->pending->cgroup->destroy();
    co_return std::unexpected(sent.error());
  }
  prep->close_box_ends();

  auto proc = std::make_unique<NsProcess>(prep->pending, conn_, core_);
  if (prep->in) proc->stdin_fd = std::move(prep->in->write);
  proc->stdout_fd = std::move(prep->out.read);
  proc->stderr_fd = std::move(prep->err.read);
  // The pid the box gives it, from its ChildReady (sent before it execs).
  auto [ec, box_pid] =
      co_await prep->pending->started_ch->async_receive(asio::as_tuple(asio::use_awaitable));
  if (ec) {
    std::string why;
    {
      std::lock_guard lock(prep->pending->mu);
      why = prep->pending->start_error;
    }
    proc->kill_tree();
    asio::awaitable<void> rel = proc->release();
    co_await std::move(rel);
    co_return fail(Code::kUnavailable,
                   "process: the box could not start it" + (why.empty() ? "" : ": " + why));
  }
  Launched l;
  l.proc = std::move(proc);
  l.pid = box_pid;
  l.pty_master = std::move(prep->pty_master);
  co_return l;
}
#pragma GCC diagnostic pop

// ---- The backend -------------------------------------------------------------------------------

class NsBackend final : public Backend {
 public:
  explicit NsBackend(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  std::string_view name() const override { return "ns"; }
  bool isolated() const override { return true; }
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
  std::shared_ptr<Core> core_;
};

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
    for (auto [k, v] : {std::pair{"XDG_CACHE_HOME", cache}, std::pair{"PIP_CACHE_DIR", cache + "/pip"},
                        std::pair{"UV_CACHE_DIR", cache + "/uv"},
                        std::pair{"npm_config_cache", cache + "/npm"},
                        std::pair{"BUN_INSTALL_CACHE_DIR", cache + "/bun"}}) {
      config.env.emplace(k, std::move(v));
    }
  }
  for (const auto& m : config.mounts) {
    fs_spec.binds.push_back({m.host_path, m.box_path, m.read_only, m.what});
  }
  // An image root (API.md "Images"): a detached overlay the box attaches as "/".
  UniqueFd image_root;
  if (!config.root_layers.empty()) {
    auto made = lx::make_image_root({config.root_layers, config.root_upper, config.root_work,
                                     config.root_id_base, config.root_id_count});
    if (!made) return std::unexpected(with_context(made.error(), "box " + config.key));
    image_root = std::move(*made);
    fs_spec.image_root = true;
  }
  auto plan = lx::plan_box_fs(fs_spec);
  if (!plan) return std::unexpected(with_context(plan.error(), "box " + config.key));

  lx::CgroupLimits limits;
  limits.memory_bytes = config.limits.memory_mb.value_or(kDefaultMemoryMb) << 20;
  limits.cpu_percent = config.limits.cpu_percent.value_or(kDefaultCpuPercent);
  limits.max_pids = config.limits.max_pids.value_or(kDefaultMaxPids);
  auto cgroup = core_->driver->create(config.key, limits);
  if (!cgroup) return std::unexpected(with_context(cgroup.error(), "box " + config.key));

  lx::BoxSpec spec;
  spec.key = config.key;
  spec.root_mountpoint = core_->root_mountpoint;
  spec.root_tree = image_root.get();
  spec.root_writable = image_root && config.root_writable;
  spec.init_fd = core_->init_fd.get();
  spec.fs = &*plan;
  spec.seccomp = &core_->seccomp;
  spec.cgroup = cgroup->get();
  spec.rlimits.nofile = config.limits.max_open_files.value_or(kDefaultOpenFiles);
  // No single file may outgrow the workspace's cap (a write past it fails with EFBIG).
  if (config.limits.disk_mb) spec.rlimits.fsize_bytes = *config.limits.disk_mb << 20;
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
  UniqueFd control_dup(::fcntl((*box)->control_fd(), F_DUPFD_CLOEXEC, 3));
  if (!control_dup) return fail_box(Error::from_errno(errno, "dup(box control socket)"));

  // --toolchain-path: first in PATH unless the session sets PATH itself.
  if (!core_->opts.path_prefix.empty() && config.env.find("PATH") == config.env.end()) {
    config.env["PATH"] = std::string(kWorkspaceBins) + ":" + core_->opts.path_prefix + ":" +
                         (kBoxPath + kWorkspaceBins.size() + 1);
  }
  auto sb = std::make_unique<NsSandbox>(
      core_, config.key, uid, gid, config.limits.cpu_time_sec.value_or(0), std::move(config.env),
      std::move(*cgroup), std::move(*box), std::move(root), std::move(mntns),
      std::move(control_dup));
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
  return std::unique_ptr<Backend>(new NsBackend(std::move(core)));
}

}  // namespace agentbox::sandbox
