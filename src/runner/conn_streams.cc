// agentbox-runner: process streams and terminals of a connection (conn.h).

#include <poll.h>

#include "runner/conn.h"

namespace agentbox::runner::detail {

void Conn::stream_start(const p::Envelope& e, bool pty) {
  p::PtyCreate req;
  bool err_pipe = false;  // version 2: stderr pushed too (xbot drops it)
  if (pty) {
    auto b = body<p::PtyCreate>(e);
    if (!b) return;
    req = std::move(*b);
  } else {
    auto b = body<p::StdioStart>(e);
    if (!b) return;
    req.stream_id = b->stream_id;
    req.command = b->command;
    req.args = b->args;
    req.env = b->env;
    req.dir = b->dir;
    err_pipe = b->stderr_pipe && streams_v2_;
  }
  if (req.stream_id.empty()) return reply_error(e.id, p::code::kInvalid, "missing stream_id");
  std::string box;
  auto joins = join_box(e, box);
  if (!joins) return;
  // The cgroup is owed a release() unless the stream's child starts (report_exit does it).
  struct Owed {
    BoxCgroups* c;
    std::string* box;
    ~Owed() {
      if (!box->empty()) c->release(*box);
    }
  } owed{cgroups_.get(), &box};
  auto cwd = cwd_for(req.dir);
  if (!cwd) return reply_error(e.id, cwd.error());
  SpawnSpec spec;
  spec.cwd_fd = cwd->get();
  spec.join_fds = raw(*joins);
  if (pty && req.command.empty()) req.command = "bash";
  spec.argv = {req.command};
  spec.argv.insert(spec.argv.end(), req.args.begin(), req.args.end());
  auto st = std::make_shared<Stream>();
  st->pty = pty;
  UniqueFd read_end, slave, in_r, out_w, err_r, err_w;
  if (pty) {
    std::vector<std::string> env = {"TERM=xterm-256color"};
    for (const char* k : {"PATH", "HOME", "USER", "SHELL", "LANG"}) {
      if (const char* v = getenv(k)) env.push_back(std::string(k) + "=" + v);
    }
    env.insert(env.end(), req.env.begin(), req.env.end());
    spec.env = std::move(env);
    st->master = UniqueFd(posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!st->master || grantpt(st->master.get()) != 0 || unlockpt(st->master.get()) != 0) {
      return reply_error(e.id, p::code::kIO, "start pty: " + std::string(strerror(errno)));
    }
    char name[128];
    if (ptsname_r(st->master.get(), name, sizeof name) != 0) {
      return reply_error(e.id, p::code::kIO, "start pty: ptsname");
    }
    slave = UniqueFd(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!slave) return reply_error(e.id, p::code::kIO, "start pty: open " + std::string(name));
    winsize ws{};
    ws.ws_col = req.cols ? req.cols : 80;
    ws.ws_row = req.rows ? req.rows : 24;
    ioctl(st->master.get(), TIOCSWINSZ, &ws);
    spec.stdin_fd = spec.stdout_fd = spec.stderr_fd = slave.get();
    spec.pty = true;
  } else {
    spec.env = environment_with(req.env);
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
      return reply_error(e.id, p::code::kIO, "start process: pipe");
    }
    in_r = UniqueFd(in[0]);
    out_w = UniqueFd(out[1]);
    read_end = UniqueFd(out[0]);
    st->input = std::make_unique<InputQueue>(in[1], true);
    spec.stdin_fd = in_r.get();
    spec.stdout_fd = out_w.get();
    if (err_pipe) {
      int er[2];
      if (pipe2(er, O_CLOEXEC) != 0) {
        return reply_error(e.id, p::code::kIO, "start process: pipe");
      }
      err_r = UniqueFd(er[0]);
      err_w = UniqueFd(er[1]);
      spec.stderr_fd = err_w.get();
    }
  }
  {
    std::lock_guard l(mu_);
    if (closed_) return;
    if (auto it = streams_.find(req.stream_id); it != streams_.end()) {
      if (st->input) st->input->finish();
      return reply_error(e.id, p::code::kExists, "stream " + req.stream_id + " already exists");
    }
    auto pid = spawn(spec);
    if (!pid && pid.error().sys_errno == ENOENT && streams_v2_) {
      // Version 2: no such program still starts, as exit 127 with the message on stderr (a
      // shell's report; the other backends' contract for processes and exec).
      std::string msg = spec.argv[0] + ": " + std::strerror(ENOENT);
      spec.argv = {"/bin/sh", "-c", "printf '%s\\n' \"$1\" >&2; exit 127", "sh", msg};
      pid = spawn(spec);
    }
    if (!pid) {
      if (st->input) st->input->finish();
      return reply_error(
          e.id, p::code::kIO,
          std::string(pty ? "start pty: " : "start process: ") + pid.error().message);
    }
    st->pid = *pid;
    st->box = std::exchange(box, std::string());  // released by report_exit
    if (pty) {
      int wfd = fcntl(st->master.get(), F_DUPFD_CLOEXEC, 0);
      st->input = std::make_unique<InputQueue>(wfd, true);
      read_end = UniqueFd(fcntl(st->master.get(), F_DUPFD_CLOEXEC, 0));
    }
    streams_[req.stream_id] = st;
  }
  slave.reset();
  in_r.reset();
  out_w.reset();
  err_w.reset();
  auto self = shared_from_this();
  st->readers = err_r ? 2 : 1;
  for (int fd : {read_end.get(), err_r.get()}) {
    if (fd >= 0) st->probes.emplace_back(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  }
  std::thread([self, st, id = req.stream_id, fd = std::move(read_end)]() {
    self->forward(st, id, fd.get(), false);
  }).detach();
  if (err_r) {
    std::thread([self, st, id = req.stream_id, fd = std::move(err_r)]() {
      self->forward(st, id, fd.get(), true);
    }).detach();
  }
  const bool v2 = streams_v2_;
  std::thread([self, st, id = req.stream_id, v2]() { self->report_exit(st, id, v2); }).detach();
  p::StreamRequest ok{req.stream_id};
  if (v2) ok.pid = st->pid;  // version 2: the caller shows it and signals by stream
  reply(e.id, p::type::kOk, p::to_json(ok));
}

void Conn::forward(std::shared_ptr<Stream> st, std::string id, int fd, bool is_stderr) {
  std::string buf(kStreamRead, '\0');
  auto data_type = st->pty ? p::type::kPtyData : p::type::kStdioData;
  for (;;) {
    // Waits for output without the lock, then reads it with the lock held, so that what leaves
    // the pipe is counted in hand at once: report_exit() never sees an empty pipe and no chunk
    // in hand while a chunk the leader wrote before it exited is on its way (a reader put off
    // for longer than kExitDrain between its read and its push lost that output).
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    ssize_t n;
    {
      std::lock_guard l(st->mu);
      n = ::read(fd, buf.data(), buf.size());
      if (n > 0 && st->exited) continue;  // read and dropped: a background child's late output
      if (n > 0) ++st->in_hand;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    p::StreamData d{id, buf.substr(0, static_cast<std::size_t>(n))};
    d.is_stderr = is_stderr;
    outbox.push(p::frame("", data_type, p::to_json(d)));
    {
      std::lock_guard l(st->mu);
      --st->in_hand;
    }
    st->cv.notify_all();
  }
  {
    std::lock_guard l(st->mu);
    --st->readers;
  }
  st->cv.notify_all();
}

void Conn::report_exit(std::shared_ptr<Stream> st, std::string id, bool v2) {
  siginfo_t si{};
  while (::waitid(P_PID, static_cast<id_t>(st->pid), &si, WEXITED | WNOWAIT) != 0 &&
         errno == EINTR) {
  }
  {
    std::lock_guard l(st->mu);
    st->reaped = true;  // from here on stdio_signal reaches the group only
  }
  int status = wait_for(st->pid);
  if (!st->box.empty()) cgroups_->release(st->box);
  p::StreamExit x{id, exit_code_of(status), ""};
  if (WIFSIGNALED(status)) {
    x.error = std::string("signal: ") + strsignal(WTERMSIG(status));
    if (v2) x.signal = WTERMSIG(status);
  }
  {
    std::unique_lock l(st->mu);
    auto drained = [&] { return st->readers == 0 && st->in_hand == 0; };
    if (v2) {
      // The leader's own output is in the pipe when it exits: it is always pushed (however
      // late the readers run); only a background child still holding the pipe open with
      // nothing written is given up on, after kExitDrain of quiet.
      // (A background child that keeps writing holds the exit at most kExitDrainMax.)
      const auto give_up = std::chrono::steady_clock::now() + kExitDrainMax;
      auto quiet_since = std::chrono::steady_clock::now();
      while (!st->cv.wait_for(l, std::chrono::milliseconds(20), drained) &&
             std::chrono::steady_clock::now() < give_up) {
        if (st->unread_output() || st->in_hand > 0) {
          quiet_since = std::chrono::steady_clock::now();
        } else if (std::chrono::steady_clock::now() - quiet_since >= kExitDrain) {
          break;
        }
      }
    } else {
      st->cv.wait(l, drained);
    }
    st->exited = true;
  }
  outbox.push(p::frame("", st->pty ? p::type::kPtyExit : p::type::kStdioExit, p::to_json(x)));
  {
    std::lock_guard l(st->mu);
    st->finished = true;
  }
  st->cv.notify_all();
}

void Conn::stream_signal(const p::Envelope& e) {
  auto b = body<p::StreamSignal>(e);
  if (!b) return;
  if (b->stream_id.empty()) return reply_error(e.id, p::code::kInvalid, "missing stream_id");
  if (b->signal <= 0 || b->signal >= NSIG) {
    return reply_error(e.id, p::code::kInvalid, "signal " + std::to_string(b->signal));
  }
  auto st = find_stream(b->stream_id);
  if (!st) return reply_error(e.id, p::code::kNotFound, "stream " + b->stream_id + " not found");
  {
    std::lock_guard l(st->mu);
    // A reaped child's pid may be reused, its group's id not while the group has members.
    if (b->group) {
      ::kill(-st->pid, b->signal);
    } else if (!st->reaped) {
      ::kill(st->pid, b->signal);
    }
  }
  reply(e.id, p::type::kOk, std::nullopt);
}

void Conn::stream_close(const p::Envelope& e) {
  auto b = body<p::StreamRequest>(e);
  if (!b) return;
  if (b->stream_id.empty()) return reply_error(e.id, p::code::kInvalid, "missing stream_id");
  auto st = find_stream(b->stream_id);
  if (!st) return reply_error(e.id, p::code::kNotFound, "stream " + b->stream_id + " not found");
  if (st->pty) {
    kill_group(st->pid, SIGHUP);
  } else {
    st->input->finish();  // EOF on the child's stdin
  }
  if (!st->wait_finished(st->pty ? 3s : 5s)) {
    kill_group(st->pid, SIGTERM);
    if (!st->wait_finished(3s)) {
      kill_group(st->pid, SIGKILL);
      st->wait_finished(3s);
    }
  }
  {
    std::lock_guard l(mu_);
    streams_.erase(b->stream_id);
  }
  reply(e.id, p::type::kOk, std::nullopt);
}

void Conn::fire_and_forget(const p::Envelope& e) {
  if (e.type == p::type::kPtyResize) {
    auto b = p::body_as<p::PtyResize>(e);
    if (!b) return;
    auto st = find_stream(b->stream_id);
    if (!st || !st->pty) return;
    winsize ws{};
    ws.ws_col = b->cols ? b->cols : 80;
    ws.ws_row = b->rows ? b->rows : 24;
    ioctl(st->master.get(), TIOCSWINSZ, &ws);
    return;
  }
  auto b = p::body_as<p::StreamData>(e);
  if (!b) return;
  auto st = find_stream(b->stream_id);
  if (!st || st->pty != (e.type == p::type::kPtyStdin) || !st->input) return;
  st->input->add(std::move(b->data));
  if (b->eof && streams_v2_ && !st->pty) st->input->finish();  // version 2: close stdin
}

}  // namespace agentbox::runner::detail
