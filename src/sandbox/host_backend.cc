#include "sandbox/host_backend.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <stdlib.h>
#include <unistd.h>

#include <boost/asio/this_coro.hpp>
#include <cerrno>
#include <exception>
#include <optional>
#include <utility>

#include "common/log.h"
#include "common/validate.h"
#include "sandbox/artifacts.h"
#include "sandbox/blocking.h"
#include "sandbox/exec_runner.h"
#include "sandbox/host_exec.h"
#include "sandbox/path.h"

namespace agentbox::sandbox {
namespace {

// A command's PATH (HostBackend's path_prefix goes first).
constexpr char kHostPath[] = "/usr/local/bin:/usr/bin:/bin";

// An Error with its message prefixed by `context` (code and errno kept).
Error with_context(Error e, std::string_view context) {
  e.message = std::string(context) + ": " + e.message;
  return e;
}

std::string last_component(const std::string& abs) {
  const std::size_t slash = abs.rfind('/');
  return slash == std::string::npos ? abs : abs.substr(slash + 1);
}

}  // namespace

Result<std::unique_ptr<Sandbox>> HostBackend::create(BoxConfig config) {
  // SECURITY: host commands share the host's network; there is no namespace to confine them to
  // a proxy, so an allowlist cannot be honoured (and is never silently widened to "open").
  if (config.egress_policy) {
    return fail(Code::kNotSupported,
                "network.mode \"allowlist\" on the host backend (no network namespace)");
  }
  // Host commands already have the host's whole network, its loopback and the daemon included:
  // not what "open" promises.
  if (config.open_network) {
    return fail(Code::kNotSupported,
                "network.mode \"open\" on the host backend (no network namespace)");
  }
  // SECURITY: host commands run with the daemon's own rights in the dir itself; nothing could
  // keep them from writing a read-only host_path.
  if (config.workspace_read_only) {
    return fail(Code::kNotSupported,
                "host_path_mode \"ro\" on the host backend (no mount namespace to make the "
                "workspace read-only; use the ns backend, or host_path_mode \"rw\")");
  }
  const std::string& dir = config.workspace_dir;
  if (dir.empty() || dir.front() != '/') {
    return fail(Code::kInvalid, "host backend: workspace dir must be an absolute path: " + dir);
  }
  // Canonical, so that the paths commands see (`pwd -P`) and the ones the API accepts agree.
  std::unique_ptr<char, decltype(&::free)> real(::realpath(dir.c_str(), nullptr), &::free);
  if (!real) return fail_errno(errno, "realpath(" + dir + ")");
  UniqueFd root(::open(real.get(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return fail_errno(errno, "open(" + std::string(real.get()) + ")");
  if (!path_prefix_.empty() && config.env.find("PATH") == config.env.end()) {
    config.env["PATH"] = path_prefix_ + ":" + kHostPath;
  }
  return std::make_unique<HostSandbox>(real.get(), std::move(root), std::move(config.env),
                                       blocking_);
}

HostSandbox::HostSandbox(std::string workspace, UniqueFd root,
                         std::map<std::string, std::string> env, asio::any_io_executor blocking)
    : workspace_(std::move(workspace)),
      fs_(std::move(root), RootMode::kBeneath, std::nullopt, workspace_),
      env_(std::move(env)),
      blocking_(std::move(blocking)) {}

HostSandbox::~HostSandbox() {
  shutdown();
}

Status HostSandbox::check_open() const {
  std::lock_guard lock(mu_);
  if (shut_down_) return fail(Code::kUnavailable, "sandbox " + workspace_ + " is shut down");
  return {};
}

Result<HostSandbox::Mapped> HostSandbox::map_path(std::string_view path) const {
  auto abs = normalize_box_path(path, workspace_);
  if (!abs) return std::unexpected(abs.error());
  auto rel = workspace_relative(*abs, workspace_);
  if (!rel) return std::unexpected(rel.error());
  return Mapped{std::move(*abs), std::move(*rel)};
}

Result<LaunchSpec> HostSandbox::prepare_launch(std::vector<std::string> argv, std::string command,
                                              const std::string& cwd_path,
                                              std::map<std::string, std::string> spec_env,
                                              bool pty, UniqueFd* cwd_fd) {
  LaunchSpec launch;
  if (!argv.empty()) {
    if (argv.front().empty()) return fail(Code::kInvalid, "exec: argv[0] is empty");
    launch.argv = std::move(argv);
  } else if (!command.empty()) {
    launch.argv = {"/bin/sh", "-c", std::move(command)};
  } else {
    return fail(Code::kInvalid, "exec: give argv or command");
  }

  // The cwd is resolved like any API path and handed to the child as an fd: what we checked is
  // what it gets, even if the directory is renamed or swapped for a symlink meanwhile.
  Mapped cwd{workspace_, ""};
  if (!cwd_path.empty()) {
    auto m = map_path(cwd_path);
    if (!m) return std::unexpected(with_context(m.error(), "exec: cwd"));
    cwd = std::move(*m);
  }
  auto dir = fs_.open_dir(cwd.rel);
  if (!dir) return std::unexpected(with_context(dir.error(), "exec: cwd"));
  *cwd_fd = std::move(*dir);
  launch.cwd_fd = cwd_fd->get();
  launch.cwd = cwd.rel.empty() ? workspace_ : workspace_ + "/" + cwd.rel;

  if (auto s = validate::env(env_, "env"); !s) return std::unexpected(s.error());
  if (auto s = validate::env(spec_env, "env"); !s) return std::unexpected(s.error());
  std::map<std::string, std::string> env = {
      {"PATH", kHostPath},
      {"HOME", workspace_},
      {"LANG", "C.UTF-8"},
      {"TERM", pty ? "xterm-256color" : "dumb"},
  };
  for (const auto& [k, v] : env_) env[k] = v;
  for (auto& [k, v] : spec_env) env[k] = std::move(v);
  launch.env.reserve(env.size());
  for (const auto& [k, v] : env) launch.env.push_back(k + "=" + v);
  return launch;
}

asio::awaitable<Result<Launched>> HostSandbox::launch(ProcessSpec spec) {
  if (auto s = check_open(); !s) co_return std::unexpected(s.error());
  UniqueFd cwd_fd;
  auto prepared = prepare_launch(std::move(spec.argv), std::move(spec.command), spec.cwd,
                                 std::move(spec.env), spec.pty.has_value(), &cwd_fd);
  if (!prepared) co_return std::unexpected(prepared.error());
  LaunchSpec launch = std::move(*prepared);
  launch.with_stdin = spec.stdin_open;
  UniqueFd master;
  if (spec.pty) {
    master = UniqueFd(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!master) co_return fail_errno(errno, "process: posix_openpt");
    if (::grantpt(master.get()) != 0 || ::unlockpt(master.get()) != 0) {
      co_return fail_errno(errno, "process: grantpt/unlockpt");
    }
    winsize ws{};
    ws.ws_col = spec.pty->cols;
    ws.ws_row = spec.pty->rows;
    if (::ioctl(master.get(), TIOCSWINSZ, &ws) != 0) {
      co_return fail_errno(errno, "process: ioctl(TIOCSWINSZ)");
    }
    char name[64];
    if (::ptsname_r(master.get(), name, sizeof name) != 0) {
      co_return fail_errno(errno, "process: ptsname");
    }
    launch.pty_slave = name;
  }
  asio::any_io_executor ex = co_await asio::this_coro::executor;
  auto proc = launch_host_process(ex, std::move(launch));
  if (!proc) co_return std::unexpected(proc.error());
  Launched l;
  l.pid = (*proc)->pgid();
  l.proc = std::move(*proc);
  l.pty_master = std::move(master);
  co_return l;
}

asio::awaitable<Result<ExecResult>> HostSandbox::exec(ExecSpec spec, OutputSink* sink) {
  // Cancellation kills the command inside run_process; the clean-up after it must not be
  // abandoned midway (exec_runner.h, without_throw_on_cancel).
  asio::awaitable<Result<ExecResult>> run = exec_uncancellable(std::move(spec), sink);
  auto guarded = without_throw_on_cancel(std::move(run));
  co_return co_await std::move(guarded);
}

asio::awaitable<Result<ExecResult>> HostSandbox::exec_uncancellable(ExecSpec spec,
                                                                    OutputSink* sink) {
  if (auto s = check_open(); !s) co_return std::unexpected(s.error());

  UniqueFd cwd_fd_owned;
  auto prepared = prepare_launch(std::move(spec.argv), std::move(spec.command), spec.cwd,
                                 std::move(spec.env), false, &cwd_fd_owned);
  if (!prepared) co_return std::unexpected(prepared.error());
  LaunchSpec launch = std::move(*prepared);
  UniqueFd* cwd_fd = &cwd_fd_owned;

  // Artifacts: a dir that does not exist yet counts as empty, so files in a dir the command
  // creates are reported too. The walks run on the blocking pool: a big artifact dir must not
  // stall the network thread (and every other client) for the length of a directory walk.
  std::optional<Mapped> art;
  TreeSnapshot before;
  if (!spec.artifact_dir.empty()) {
    auto m = map_path(spec.artifact_dir);
    if (!m) co_return std::unexpected(with_context(m.error(), "exec: artifact_dir"));
    art = std::move(*m);
    const RootedFs* fs = &fs_;  // outlives the call: the caller holds the sandbox
    std::string rel = art->rel;
    auto job = run_blocking(blocking_, [fs, rel]() -> Result<TreeSnapshot> {
      auto dir = fs->open_dir(rel);
      if (dir) return snapshot_tree(dir->get());
      if (dir.error().code == Code::kNotFound) return TreeSnapshot{};
      return std::unexpected(dir.error());
    });
    auto snap = co_await std::move(job);
    if (!snap) co_return std::unexpected(with_context(snap.error(), "exec: artifact_dir"));
    before = std::move(*snap);
  }

  launch.with_stdin = !spec.stdin_data.empty();
  // g++ 12: no temporaries with destructors inside a co_await expression (they get destroyed
  // twice), so awaitables and their arguments are built as named locals first.
  asio::any_io_executor ex = co_await asio::this_coro::executor;
  auto proc = launch_host_process(ex, std::move(launch));
  cwd_fd->reset();
  if (!proc) co_return std::unexpected(proc.error());
  const pid_t pgid = (*proc)->pgid();
  if (pgid > 0 && !track_group(pgid)) {
    (*proc)->kill_tree();  // shut down while we were launching: it must not outlive the box
  }

  ExecResult result;
  try {
    RunOptions opts{.timeout = spec.timeout,
                    .max_output_bytes = spec.max_output_bytes,
                    .stdin_data = std::move(spec.stdin_data)};
    asio::awaitable<ExecResult> run = run_process(std::move(*proc), std::move(opts), sink);
    result = co_await std::move(run);
  } catch (const std::exception& e) {
    if (pgid > 0) command_finished(pgid);
    co_return fail(Code::kInternal, std::string("exec: ") + e.what());
  }
  if (pgid > 0) command_finished(pgid);

  if (art) {
    const RootedFs* fs = &fs_;
    std::string rel = art->rel;
    std::string abs = art->abs;
    auto job = run_blocking(
        blocking_, [fs, rel, abs, b = std::move(before)]() -> Result<std::vector<Artifact>> {
          auto dir = fs->open_dir(rel);
          if (!dir) return std::vector<Artifact>{};  // the command removed it: nothing new
          auto after = snapshot_tree(dir->get());
          if (!after) return std::unexpected(after.error());
          return diff_artifacts(b, *after, dir->get(), abs);
        });
    auto found = co_await std::move(job);
    if (found) {
      result.artifacts = std::move(*found);
    } else {
      spdlog::warn("exec in {}: artifact scan failed: {}", workspace_, found.error().message);
    }
  }
  co_return result;
}

Result<FileReader> HostSandbox::open_file(const std::string& path) {
  if (auto s = check_open(); !s) return std::unexpected(s.error());
  auto m = map_path(path);
  if (!m) return std::unexpected(m.error());
  return fs_.open_file(m->rel);
}

Result<std::unique_ptr<FileWriter>> HostSandbox::create_file(const std::string& path,
                                                             WriteOptions opts) {
  if (auto s = check_open(); !s) return std::unexpected(s.error());
  auto m = map_path(path);
  if (!m) return std::unexpected(m.error());
  return fs_.create_file(m->rel, opts);
}

Result<FileInfo> HostSandbox::stat(const std::string& path) {
  if (auto s = check_open(); !s) return std::unexpected(s.error());
  auto m = map_path(path);
  if (!m) return std::unexpected(m.error());
  auto info = fs_.stat(m->rel);
  if (!info) return info;
  info->name = last_component(m->abs);
  info->path = std::move(m->abs);
  return info;
}

Result<std::vector<DirEntry>> HostSandbox::read_dir(const std::string& path) {
  if (auto s = check_open(); !s) return std::unexpected(s.error());
  auto m = map_path(path);
  if (!m) return std::unexpected(m.error());
  return fs_.read_dir(m->rel);
}

Result<UniqueFd> HostSandbox::open_dir(const std::string& path) {
  if (auto s = check_open(); !s) return std::unexpected(s.error());
  auto m = map_path(path);
  if (!m) return std::unexpected(m.error());
  return fs_.open_dir(m->rel);
}

Status HostSandbox::mkdir_all(const std::string& path) {
  if (auto s = check_open(); !s) return s;
  auto m = map_path(path);
  if (!m) return std::unexpected(m.error());
  return fs_.mkdir_all(m->rel);
}

Status HostSandbox::remove(const std::string& path) {
  if (auto s = check_open(); !s) return s;
  auto m = map_path(path);
  if (!m) return std::unexpected(m.error());
  if (m->rel.empty()) return fail(Code::kAccess, "remove(" + m->abs + "): the workspace itself");
  return fs_.remove(m->rel);
}

Status HostSandbox::remove_all(const std::string& path) {
  if (auto s = check_open(); !s) return s;
  auto m = map_path(path);
  if (!m) return std::unexpected(m.error());
  if (m->rel.empty()) {
    return fail(Code::kAccess, "remove_all(" + m->abs + "): the workspace itself");
  }
  return fs_.remove_all(m->rel);
}

Status HostSandbox::rename(const std::string& from, const std::string& to) {
  if (auto s = check_open(); !s) return s;
  auto f = map_path(from);
  if (!f) return std::unexpected(f.error());
  auto t = map_path(to);
  if (!t) return std::unexpected(t.error());
  return fs_.rename(f->rel, t->rel);
}

void HostSandbox::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    kill_groups_locked();
  }
  procs_.shutdown();
}

bool HostSandbox::track_group(pid_t pgid) {
  std::lock_guard lock(mu_);
  // Forget groups of finished commands that have emptied since, so the set stays small and a
  // recycled group id is not signalled later.
  std::erase_if(
      groups_, [](const auto& g) { return g.second && ::kill(-g.first, 0) < 0 && errno == ESRCH; });
  if (shut_down_) return false;
  groups_[pgid] = false;
  return true;
}

void HostSandbox::command_finished(pid_t pgid) {
  std::lock_guard lock(mu_);
  auto it = groups_.find(pgid);
  if (it == groups_.end()) return;
  // The leader has been reaped (run_process destroys the Process). Members left over are
  // background children that shutdown() must still reach.
  if (::kill(-pgid, 0) < 0 && errno == ESRCH) {
    groups_.erase(it);
  } else {
    it->second = true;
  }
}

void HostSandbox::kill_groups_locked() {
  for (const auto& [pgid, leader_reaped] : groups_) {
    // A group whose leader we reaped lives on only through its other members, and its id cannot
    // be handed to a new process while they live. So if a process with pid == pgid exists now,
    // that pid was recycled, our group is gone, and the id names someone else's group: skip it.
    if (leader_reaped && ::kill(pgid, 0) == 0) continue;
    // SECURITY: everything the command started in its group dies with the box.
    ::kill(-pgid, SIGKILL);
  }
  groups_.clear();
}

}  // namespace agentbox::sandbox
