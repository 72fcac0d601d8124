#pragma once
// What process_table.cc and process_supervision.cc share: one process's entry, the supervision
// of a managed one, and the helpers both use. Private to sandbox/.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sandbox/process_table.h"

namespace agentbox::sandbox {

namespace asio = boost::asio;

namespace detail {

// How long the readers may still drain after the leader exited and its tree was killed. Only a
// writer outside the tree (host backend: a child that left the process group) makes it matter.
inline constexpr std::chrono::seconds kDrainGrace{2};


// One process. Its I/O objects belong to `ex` (see process_table.h, Threading); `mu` guards the
// state fields so that list()/get() may also be called from elsewhere.
struct ProcEntry {
  explicit ProcEntry(asio::any_io_executor executor)
      : ex(executor), out_sd(executor), err_sd(executor), in_sd(executor), readers_done(executor) {}

  asio::any_io_executor ex;
  std::mutex mu;
  ProcessInfo info;   // guarded by mu
  OutputRing ring;    // guarded by mu
  bool starting = true;   // launch in progress: the tag is reserved, the entry not listed
  bool ended = false;     // the exit record is in (info final)
  bool requested_end = false;  // kill() or shutdown() ended it
  bool shutdown_end = false;   // shutdown() ended it
  bool attached = false;
  ExitStatus exit;

  // Executor-only from here on.
  std::unique_ptr<Process> proc;
  asio::posix::stream_descriptor out_sd;  // stdout pipe, or the pty master
  asio::posix::stream_descriptor err_sd;  // stderr pipe (not with a pty)
  asio::posix::stream_descriptor in_sd;   // stdin pipe, or a dup of the pty master
  int pty_fd = -1;                        // out_sd's fd with a pty, while open
  int open_readers = 0;
  asio::steady_timer readers_done;  // cancelled when the last reader ends
  std::vector<asio::steady_timer*> waiters;  // follow() calls waiting for output; under mu
  std::deque<std::string> stdin_q;           // under mu
  std::size_t stdin_bytes = 0;               // under mu
  bool stdin_close = false;                  // close once the queue is written; under mu
  bool writer_running = false;               // under mu
  ProcessTable::ExitCallback on_exit;
  std::shared_ptr<Managed> managed;  // set for a managed process; immutable

  void notify_locked() {
    for (asio::steady_timer* t : waiters) t->cancel();
    waiters.clear();
  }
};

// The supervision of one managed process, across its incarnations. Outlives the table when a
// restart coroutine holds it; `table` is used only while `keepalive` is held (it owns the table).
struct Managed : std::enable_shared_from_this<Managed> {
  explicit Managed(asio::any_io_executor ex) : timer(ex) {}

  std::mutex mu;                       // guards what follows, up to `timer`
  ProcessSpec spec;                    // restarts: of the last incarnation started
  ProcessTable::ExitCallback on_exit;  // immutable
  std::shared_ptr<void> keepalive;     // held while supervised
  ProcessTable* table = nullptr;
  bool stopped = false;  // supervision over: no restart
  bool stopped_by_shutdown = false;
  bool waiting = false;  // a backoff runs (no incarnation lives)
  std::chrono::seconds backoff = ProcessTable::kFirstBackoff;
  ProcessInfo last;          // the last incarnation's final info
  asio::steady_timer timer;  // the backoff; executor-only (cancel is posted)

  // Ends the supervision; returns the keepalive for the caller to drop outside its locks. mu held.
  std::shared_ptr<void> stop_locked(bool by_shutdown) {
    if (!stopped) {
      stopped = true;
      stopped_by_shutdown = by_shutdown;
    }
    if (waiting) {
      asio::post(timer.get_executor(), [self = shared_from_this()] { self->timer.cancel(); });
    }
    return std::move(keepalive);
  }
};

// "tag (pid N)" or "pid N", for messages.
std::string name_of(const ProcessInfo& i);
// Logs an exception a process coroutine (`what`: "supervise", "stdin writer", ...) ended with.
void log_exception(std::exception_ptr p, const char* what);

}  // namespace detail

}  // namespace agentbox::sandbox
