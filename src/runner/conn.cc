// agentbox-runner: a connection's requests (conn.h).

#include "runner/conn.h"

namespace agentbox::runner::detail {

void Conn::shutdown() {
  outbox.close();
  std::lock_guard l(mu_);
  closed_ = true;
  for (auto& [id, d] : downloads_) {
    std::lock_guard dl(d->mu);
    d->cancelled = true;
    d->cv.notify_all();
  }
  downloads_.clear();
  uploads_.clear();  // temp files go
  for (pid_t pg : execs_) kill_group(pg);
  for (auto& [id, t] : tasks_) {
    std::lock_guard tl(t->mu);
    if (t->status == "running") kill_group(t->pid);
  }
  for (auto& [id, s] : streams_) kill_group(s->pid);
  tasks_.clear();
  streams_.clear();
}

void Conn::dispatch(p::Envelope e) {
  const std::string& t = e.type;
  if (t == p::type::kStdioWrite || t == p::type::kPtyStdin || t == p::type::kPtyResize) {
    fire_and_forget(e);  // in order, no reply (xbot: pty_stdin's reply is dropped anyway)
    return;
  }
  if (version_ >= p::kChunkedVersion &&
      (t == p::type::kFileBegin || t == p::type::kFileChunk || t == p::type::kFileEnd ||
       t == p::type::kAck || t == p::type::kError)) {
    transfer_frame(e);  // in order, on the I/O thread
    return;
  }
  auto self = shared_from_this();
  std::thread([self, env = std::move(e)]() mutable { self->handle(std::move(env)); }).detach();
}

void Conn::reply_error(const std::string& id, const Error& err) {
  std::string_view c;
  if (err.sys_errno != 0) {
    c = version_ >= p::kBinaryVersion ? p::code_for_errno_exact(err.sys_errno)
                                      : p::code_for_errno(err.sys_errno);
  } else {
    switch (err.code) {
      case Code::kInvalid: c = p::code::kInvalid; break;
      case Code::kAccess: c = p::code::kPerm; break;
      case Code::kNotFound: c = p::code::kNotFound; break;
      case Code::kExists: c = p::code::kExists; break;
      case Code::kNotSupported: c = p::code::kNotSupported; break;
      case Code::kTooBig: c = p::code::kTooBig; break;
      default: c = p::code::kIO; break;
    }
  }
  outbox.send(p::error_frame(id, c, err.message));
}

std::optional<std::vector<UniqueFd>> Conn::join_box(const p::Envelope& e, std::string& box) {
  auto b = body<p::BoxLimits>(e);
  if (!b) return std::nullopt;
  auto fds = cgroups_->acquire(*b);
  if (!fds) {
    reply_error(e.id, fds.error());
    return std::nullopt;
  }
  if (!fds->empty()) box = b->box;
  return std::move(*fds);
}

void Conn::handle(p::Envelope e) {
  const std::string& t = e.type;
  const std::string& id = e.id;
  if (t == p::type::kExec) return exec(e);
  if (t == p::type::kReadFile) {
    auto b = body<p::PathRequest>(e);
    if (!b) return;
    if (version_ >= p::kChunkedVersion && send_chunked(id, b->path)) return;
    auto r = fs_.read_file(b->path);
    if (!r) return reply_error(id, r.error());
    return reply(id, p::type::kFileContent, p::to_json(p::FileContent{std::move(*r)}));
  }
  if (t == p::type::kWriteFile) {
    auto b = p::body_as<p::WriteFileRequest>(e);
    if (!b)
      return reply_error(id, b.error().code == Code::kInternal ? p::code::kIO : p::code::kInvalid,
                         b.error().message);
    auto r = fs_.write_file(b->path, b->data, b->perm);
    if (!r) return reply_error(id, r.error());
    return reply(id, p::type::kOk, std::nullopt);
  }
  if (t == p::type::kStat) {
    auto b = body<p::PathRequest>(e);
    if (!b) return;
    auto r = fs_.stat(b->path);
    if (!r) return reply_error(id, r.error());
    return reply(id, p::type::kFileInfo, p::to_json(*r));
  }
  if (t == p::type::kReadDir) {
    auto b = body<p::PathRequest>(e);
    if (!b) return;
    auto r = fs_.read_dir(b->path);
    if (!r) return reply_error(id, r.error());
    return reply(id, p::type::kDirEntries, p::to_json(*r));
  }
  if (t == p::type::kMkdirAll) {
    auto b = body<p::MkdirAllRequest>(e);
    if (!b) return;
    auto r = fs_.mkdir_all(b->path, b->perm);
    if (!r) return reply_error(id, r.error());
    return reply(id, p::type::kOk, std::nullopt);
  }
  if (t == p::type::kRemove || t == p::type::kRemoveAll) {
    auto b = body<p::PathRequest>(e);
    if (!b) return;
    auto r = t == p::type::kRemove ? fs_.remove(b->path) : fs_.remove_all(b->path);
    if (!r) return reply_error(id, r.error());
    return reply(id, p::type::kOk, std::nullopt);
  }
  if (t == p::type::kBgExec) return bg_exec(e);
  if (t == p::type::kBgStatus || t == p::type::kBgKill) return bg_other(e);
  if (t == p::type::kStdioStart) return stream_start(e, false);
  if (t == p::type::kPtyCreate) return stream_start(e, true);
  if (t == p::type::kStdioClose || t == p::type::kPtyClose) return stream_close(e);
  if (t == p::type::kStdioSignal && streams_v2_) return stream_signal(e);
  if (t == p::type::kLlmGenerate || t == p::type::kLlmModels) {
    return reply_error(id, p::code::kNotSupported, "local LLM not configured on this runner");
  }
  if (t == p::type::kDownloadFile) {
    auto b = body<p::DownloadRequest>(e);
    if (!b) return;
    auto r = download_file(b->url, fs_, b->output_path, tls_);
    if (!r) return reply_error(id, r.error());
    return reply(id, p::type::kOk, p::to_json(p::SizeBody{*r}));
  }
  reply_error(id, p::code::kInvalid, "unknown request type: " + t);
}

Result<UniqueFd> Conn::cwd_for(const std::string& dir) {
  auto fd = fs_.open_dir(dir.empty() ? fs_.path() : dir);
  // A missing dir stays ENOENT (404 through the API, as on the other backends).
  if (!fd && fd.error().code != Code::kAccess && fd.error().code != Code::kNotFound) {
    return fail(Code::kInternal, "exec error: " + fd.error().message);
  }
  return fd;
}

void Conn::exec(const p::Envelope& e) {
  auto b = body<p::ExecRequest>(e);
  if (!b) return;
  SpawnSpec spec;
  if (b->shell) {
    spec.argv = {"/bin/sh", "-c", b->command};
  } else {
    if (b->args.empty()) {
      return reply_error(e.id, p::code::kIO, "exec error: non-shell exec requires args to be set");
    }
    spec.argv = b->args;
  }
  if (!b->run_as_user.empty()) {
    std::vector<std::string> sudo = {"sudo", "-n", "-H", "-u", b->run_as_user, "--"};
    spec.argv.insert(spec.argv.begin(), sudo.begin(), sudo.end());
  }
  spec.env = environment_with(b->env);
  auto cwd = cwd_for(b->dir);
  if (!cwd) return reply_error(e.id, cwd.error());
  spec.cwd_fd = cwd->get();
  int out[2], err[2], in[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    return reply_error(e.id, p::code::kIO, "exec error: pipe");
  }
  UniqueFd out_r(out[0]), out_w(out[1]), err_r(err[0]), err_w(err[1]), in_r, in_w;
  if (!b->stdin_data.empty()) {
    if (pipe2(in, O_CLOEXEC) != 0) return reply_error(e.id, p::code::kIO, "exec error: pipe");
    in_r = UniqueFd(in[0]);
    in_w = UniqueFd(in[1]);
    spec.stdin_fd = in_r.get();
  }
  spec.stdout_fd = out_w.get();
  spec.stderr_fd = err_w.get();
  std::string box;
  auto joins = join_box(e, box);
  if (!joins) return;
  spec.join_fds = raw(*joins);
  auto pid = spawn(spec);
  joins->clear();
  if (!pid && !box.empty()) cgroups_->release(box);
  if (!pid && pid.error().sys_errno == ENOENT) {
    // No such program: exit 127 as a shell reports it (the other backends' contract).
    p::ExecResult missing;
    missing.exit_code = 127;
    missing.stderr_data = spec.argv[0] + ": " + std::strerror(ENOENT) + "\n";
    return reply(e.id, p::type::kExecResult, p::to_json(missing));
  }
  if (!pid) return reply_error(e.id, p::code::kIO, "exec error: " + pid.error().message);
  out_w.reset();
  err_w.reset();
  in_r.reset();
  if (!track_exec(*pid)) kill_group(*pid);
  std::thread feeder;
  if (in_w) {
    feeder = std::thread([fd = std::move(in_w), data = b->stdin_data]() {
      std::string_view v = data;
      while (!v.empty()) {
        ssize_t n = ::write(fd.get(), v.data(), v.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        v.remove_prefix(static_cast<std::size_t>(n));
      }
    });
  }
  std::int64_t secs = b->timeout <= 0 || b->timeout > 3600 ? 60 : b->timeout;
  p::ExecResult res;
  bool in_time = drain(out_r.get(), err_r.get(), res.stdout_data, res.stderr_data, kExecOutputCap,
                       std::chrono::steady_clock::now() + std::chrono::seconds(secs));
  if (!in_time) {
    // SECURITY/correctness: the whole group, not only the direct child (xbot's bug, 1.4).
    kill_group(*pid);
    drain(out_r.get(), err_r.get(), res.stdout_data, res.stderr_data, kExecOutputCap,
          std::chrono::steady_clock::now() + 1s);
  }
  int status = wait_for(*pid);
  untrack_exec(*pid);
  if (!box.empty()) cgroups_->release(box);
  if (feeder.joinable()) {
    if (!in_time) kill_group(*pid);
    feeder.join();
  }
  res.exit_code = in_time ? exit_code_of(status) : -1;
  res.timed_out = !in_time;
  reply(e.id, p::type::kExecResult, p::to_json(res));
}

void Conn::bg_exec(const p::Envelope& e) {
  auto b = body<p::BgExecRequest>(e);
  if (!b) return;
  SpawnSpec spec;
  if (b->shell) {
    spec.argv = {"sh", "-c", b->command};
  } else if (b->args.empty()) {
    return reply_error(e.id, p::code::kIO,
                       "bg_exec failed: non-shell exec requires args to be set");
  } else {
    spec.argv = b->args;
  }
  spec.env = environment_with(b->env);
  auto cwd = cwd_for(b->dir);
  if (!cwd) return reply_error(e.id, cwd.error());
  spec.cwd_fd = cwd->get();
  int out[2], err[2], in[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(in, O_CLOEXEC) != 0) {
    return reply_error(e.id, p::code::kIO, "bg_exec failed: pipe");
  }
  UniqueFd out_r(out[0]), out_w(out[1]), err_r(err[0]), err_w(err[1]), in_r(in[0]), in_w(in[1]);
  spec.stdout_fd = out_w.get();
  spec.stderr_fd = err_w.get();
  spec.stdin_fd = in_r.get();
  auto task = std::make_shared<BgTask>();
  {
    std::lock_guard l(mu_);
    if (closed_) return;
    if (tasks_.count(b->task_id)) {
      return reply_error(e.id, p::code::kExists, "bg_exec failed: task " + b->task_id + " exists");
    }
    auto pid = spawn(spec);
    if (!pid) return reply_error(e.id, p::code::kIO, "bg_exec failed: " + pid.error().message);
    task->pid = *pid;
    tasks_[b->task_id] = task;
  }
  out_w.reset();
  err_w.reset();
  in_r.reset();
  std::string data = b->stdin_data;
  std::thread([fd = std::move(in_w), data]() {
    std::string_view v = data;
    while (!v.empty()) {
      ssize_t n = ::write(fd.get(), v.data(), v.size());
      if (n <= 0 && errno != EINTR) break;
      if (n > 0) v.remove_prefix(static_cast<std::size_t>(n));
    }
  }).detach();
  std::thread([task, o = std::move(out_r), er = std::move(err_r)]() {
    char buf[65536];
    pollfd pf[2] = {{o.get(), POLLIN, 0}, {er.get(), POLLIN, 0}};
    while (pf[0].fd >= 0 || pf[1].fd >= 0) {
      if (poll(pf, 2, -1) < 0 && errno != EINTR) break;
      for (int i = 0; i < 2; ++i) {
        if (pf[i].fd < 0 || pf[i].revents == 0) continue;
        ssize_t n = ::read(pf[i].fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          pf[i].fd = -1;
          continue;
        }
        std::lock_guard l(task->mu);
        std::string& s = i == 0 ? task->out : task->err;
        if (s.size() < kBgOutputCap)
          s.append(buf, std::min<std::size_t>(n, kBgOutputCap - s.size()));
      }
    }
    int status = wait_for(task->pid);
    std::lock_guard l(task->mu);
    if (task->status == "running") {
      task->exit_code = exit_code_of(status);
      task->status = task->exit_code == 0 ? "completed" : "failed";
    }
  }).detach();
  reply(e.id, p::type::kBgStarted, p::to_json(p::TaskRequest{b->task_id}));
}

void Conn::bg_other(const p::Envelope& e) {
  auto b = body<p::TaskRequest>(e);
  if (!b) return;
  bool kill = e.type == p::type::kBgKill;
  std::shared_ptr<BgTask> task;
  {
    std::lock_guard l(mu_);
    if (auto it = tasks_.find(b->task_id); it != tasks_.end()) task = it->second;
  }
  std::string op = kill ? "bg_kill failed: " : "bg_status failed: ";
  if (!task) return reply_error(e.id, p::code::kIO, op + "task " + b->task_id + " not found");
  std::unique_lock l(task->mu);
  if (kill) {
    if (task->status != "running") {
      return reply_error(
          e.id, p::code::kIO,
          op + "task " + b->task_id + " is not running (status=" + task->status + ")");
    }
    kill_group(task->pid);
    task->status = "killed";
    task->exit_code = -1;
    l.unlock();
    return reply(e.id, p::type::kOk, std::nullopt);
  }
  p::BgOutput o{b->task_id, task->status, task->exit_code, task->out, task->err};
  l.unlock();
  reply(e.id, p::type::kBgOutput, p::to_json(o));
}

}  // namespace agentbox::runner::detail
