// The ns backend: a box's exec path and process launches (internal/ns_box.h).

#include "sandbox/internal/ns_box.h"

namespace agentbox::sandbox::ns_detail {

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
      {"PATH", kBoxPath},         {"HOME", std::string(kWorkspace)},
      {"USER", lx::kBoxUserName}, {"LOGNAME", lx::kBoxUserName},
      {"LANG", "C.UTF-8"},        {"TERM", pty ? "xterm-256color" : "dumb"},
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

  Status sent = co_await send_prepared(&*prep);
  if (!sent) co_return std::unexpected(sent.error());

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

asio::awaitable<Status> NsSandbox::send_prepared(Prepared* prep) {
  Status sent = co_await send_request(std::move(prep->msg), prep->box_fds());
  if (!sent) {
    conn_->find(prep->id, true);
    (void)prep->pending->cgroup->destroy();
    co_return sent;
  }
  prep->close_box_ends();
  co_return Status{};
}

Status NsSandbox::open_pty(Prepared& prep, PtySize size) {
  // SECURITY: the box's own devpts instance (mounts.cc: newinstance), reached through the box
  // root without following any link, and opened as the session user: the pty lives in the box
  // (`tty` says /dev/pts/N there), belongs to the session user, and nothing of the host's ptys
  // is involved.
  ScopedFsIdentity as_user(uid_, gid_);
  if (!as_user.ok()) return identity_error();
  UniqueFd master(
      linux::sys::openat2_raw(fs_.root_fd(), "dev/pts/ptmx", O_RDWR | O_NOCTTY,
                              RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS));
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
  Status sent = co_await send_prepared(&*prep);
  if (!sent) co_return std::unexpected(sent.error());

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

}  // namespace agentbox::sandbox::ns_detail
