// The supervision of the processes of a ProcessTable (process_table.h, "Managed processes"):
// waiting for a process's end, the exit record and hook, and the restarts of a managed one
// after its backoff.

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/log.h"
#include "sandbox/internal/process_entry.h"
#include "sandbox/process_table.h"

namespace agentbox::sandbox {

using detail::kDrainGrace;
using detail::log_exception;
using detail::Managed;
using detail::name_of;
using detail::ProcEntry;
using EntryPtr = std::shared_ptr<ProcEntry>;

asio::awaitable<void> ProcessTable::supervise(EntryPtr e) {
  ExitStatus st = co_await e->proc->wait();
  // SECURITY: a process is its tree: nothing it started outlives it (kill reaches every
  // descendant in its cgroup on ns, its process group on host).
  e->proc->kill_tree();
  if (e->open_readers > 0) {
    e->readers_done.expires_after(kDrainGrace);
    auto [ec] = co_await e->readers_done.async_wait(asio::as_tuple(asio::use_awaitable));
    (void)ec;
  }
  boost::system::error_code ignored;
  e->out_sd.close(ignored);
  e->err_sd.close(ignored);
  e->in_sd.close(ignored);
  e->pty_fd = -1;
  ProcessInfo final_info;
  ProcessEnd end;
  {
    std::lock_guard lock(e->mu);
    e->ended = true;
    e->exit = st;
    e->info.state = st.signal ? ProcessState::kKilled : ProcessState::kExited;
    e->info.exit_code = st.exit_code;
    e->info.signal = st.signal;
    e->info.ended_at = std::chrono::system_clock::now();
    e->info.stdin_open = false;
    e->stdin_q.clear();
    e->stdin_bytes = 0;
    e->notify_locked();
    final_info = e->info;
    end.requested = e->requested_end;
    end.shutdown = e->shutdown_end;
  }
  std::optional<std::chrono::seconds> backoff;
  std::shared_ptr<void> drop;  // a supervision's keepalive, let go last
  if (Managed* m = e->managed.get()) {
    std::lock_guard lock(m->mu);
    m->last = final_info;
    if (!m->stopped && !end.requested) backoff = next_backoff_locked(*m, final_info);
    if (backoff) {
      m->waiting = true;
    } else {
      drop = m->stop_locked(end.shutdown);
    }
    end.restarting = backoff.has_value();
  }
  if (e->on_exit) {
    try {
      e->on_exit(final_info, end);
    } catch (const std::exception& ex) {
      spdlog::error("process {}: exit callback: {}", name_of(final_info), ex.what());
    }
  }
  co_await e->proc->release();
  if (backoff) {
    spdlog::info("process {}: {} (exit code {}); restarting it in {} s", name_of(final_info),
                 state_name(final_info.state), final_info.exit_code.value_or(-1), backoff->count());
    co_spawn(e->ex, restart_after(e->managed, *backoff),
             [](std::exception_ptr p) { log_exception(p, "restart"); });
  }
}

std::optional<std::chrono::seconds> ProcessTable::next_backoff_locked(Managed& m,
                                                                      const ProcessInfo& ended) {
  const bool failed = ended.signal.has_value() || ended.exit_code.value_or(0) != 0;
  if (m.spec.restart == ProcessSpec::Restart::kNever ||
      (m.spec.restart == ProcessSpec::Restart::kOnFailure && !failed)) {
    return std::nullopt;
  }
  if (ended.ended_at && *ended.ended_at - ended.started_at >= kGoodRun) m.backoff = kFirstBackoff;
  const std::chrono::seconds delay = m.backoff;
  m.backoff = std::min(m.backoff * 2, kMaxBackoff);
  return delay;
}

asio::awaitable<void> ProcessTable::restart_after(ManagedPtr m, std::chrono::milliseconds delay) {
  for (;;) {
    bool stopped;
    {
      std::lock_guard lock(m->mu);
      stopped = m->stopped;
    }
    // Checked and armed without a suspension between: a cancel posted by kill() or shutdown()
    // runs either before the check or after the wait started.
    if (!stopped) {
      m->timer.expires_after(delay);
      auto [ec] = co_await m->timer.async_wait(asio::as_tuple(asio::use_awaitable));
      (void)ec;
    }
    std::shared_ptr<void> keep;
    ProcessTable* table = nullptr;
    ProcessSpec spec;
    ProcessInfo last;
    bool by_shutdown = false;
    {
      std::lock_guard lock(m->mu);
      m->waiting = false;
      if (m->stopped) {
        last = m->last;
        by_shutdown = m->stopped_by_shutdown;
      } else {
        keep = m->keepalive;  // the table lives while this is held
        table = m->table;
        ++m->spec.restarts;
        spec = m->spec;
      }
    }
    if (!keep) {
      // Killed during the backoff: the hook learns that the supervision is over.
      if (!by_shutdown && m->on_exit) {
        ProcessEnd end;
        end.requested = true;
        try {
          m->on_exit(last, end);
        } catch (const std::exception& ex) {
          spdlog::error("process {}: exit callback: {}", name_of(last), ex.what());
        }
      }
      co_return;
    }
    auto started = co_await table->start_entry(spec, m->on_exit, m);
    if (started) co_return;  // its supervise() takes over
    // Not started (the box is going down, its cwd is gone, ...): try again after the next backoff,
    // unless the supervision ended meanwhile.
    spdlog::warn("process {}: restart failed: {}", name_of(m->last), started.error().message);
    std::lock_guard lock(m->mu);
    if (m->stopped) co_return;
    delay = m->backoff;
    m->backoff = std::min(m->backoff * 2, kMaxBackoff);
    m->waiting = true;
  }
}

}  // namespace agentbox::sandbox
