// The ns backend: the control-socket reader of a box's init (internal/ns_box.h).

#include "sandbox/internal/ns_box.h"

namespace agentbox::sandbox::ns_detail {

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

}  // namespace agentbox::sandbox::ns_detail
