#include "sandbox/process_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cctype>
#include <deque>
#include <exception>

#include "common/log.h"
#include "common/no_sigpipe.h"
#include "common/validate.h"
#include "sandbox/internal/process_entry.h"

namespace agentbox::sandbox {

namespace asio = boost::asio;

namespace detail {

std::string name_of(const ProcessInfo& i) {
  return i.tag.empty() ? "pid " + std::to_string(i.pid) : "'" + i.tag + "'";
}

void log_exception(std::exception_ptr p, const char* what) {
  if (!p) return;
  try {
    std::rethrow_exception(p);
  } catch (const std::exception& e) {
    spdlog::error("process {}: {}", what, e.what());
  }
}

}  // namespace detail

namespace {

using detail::kDrainGrace;
using detail::log_exception;
using detail::Managed;
using detail::name_of;
using detail::ProcEntry;
using EntryPtr = std::shared_ptr<ProcEntry>;

constexpr std::size_t kReadBytes = 64 * 1024;
constexpr std::uint16_t kMaxPtyDim = 1000;

std::optional<int> parse_pid(std::string_view ref) {
  if (ref.empty() || ref.size() > 9) return std::nullopt;
  int v = 0;
  for (char c : ref) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

Status check_pty_size(PtySize s) {
  if (s.cols == 0 || s.rows == 0 || s.cols > kMaxPtyDim || s.rows > kMaxPtyDim) {
    return fail(Code::kInvalid, "pty: cols and rows must be 1.." + std::to_string(kMaxPtyDim) +
                                    " (got " + std::to_string(s.cols) + "x" +
                                    std::to_string(s.rows) + ")");
  }
  return {};
}

// Reads one stream until EOF (a pty master reports EIO once no slave is left): waits for
// readability, then reads what is there into a per-thread buffer, so an idle process costs no
// buffer at all.
asio::awaitable<void> read_stream(EntryPtr e, asio::posix::stream_descriptor* sd,
                                  OutputStream stream) {
  thread_local char buf[kReadBytes];
  for (bool eof = false; !eof;) {
    auto [ec] = co_await sd->async_wait(asio::posix::stream_descriptor::wait_read,
                                        asio::as_tuple(asio::use_awaitable));
    if (ec || !sd->is_open()) break;
    for (int i = 0; i < 16; ++i) {  // bounded per wakeup: a flood cannot starve the thread
      ssize_t n = ::read(sd->native_handle(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) break;
      if (n <= 0) {
        eof = true;
        break;
      }
      std::lock_guard lock(e->mu);
      if (e->ended) break;
      e->ring.append(stream, std::string_view(buf, static_cast<std::size_t>(n)));
      e->notify_locked();
    }
  }
  if (--e->open_readers == 0) e->readers_done.cancel();
}

asio::awaitable<void> write_stdin_loop(EntryPtr e) {
  for (;;) {
    std::string chunk;
    bool close_now = false;
    {
      std::lock_guard lock(e->mu);
      if (e->stdin_q.empty()) {
        if (!e->stdin_close || e->ended) {
          e->writer_running = false;
          co_return;
        }
        close_now = true;
      } else {
        chunk = std::move(e->stdin_q.front());
        e->stdin_q.pop_front();
        e->stdin_bytes -= chunk.size();
      }
    }
    if (close_now) {
      boost::system::error_code ignored;
      e->in_sd.close(ignored);
      std::lock_guard lock(e->mu);
      e->writer_running = false;
      co_return;
    }
    // write(2) with SIGPIPE blocked in this thread (common/no_sigpipe.h): a process that closed
    // its stdin is an EPIPE here, never a signal to the daemon.
    bool failed = false;
    for (std::size_t done = 0; done < chunk.size() && !failed;) {
      ssize_t n = call_without_sigpipe([&] {
        return ::write(e->in_sd.native_handle(), chunk.data() + done, chunk.size() - done);
      });
      if (n > 0) {
        done += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {
        auto [ec] = co_await e->in_sd.async_wait(asio::posix::stream_descriptor::wait_write,
                                                 asio::as_tuple(asio::use_awaitable));
        failed = static_cast<bool>(ec) || !e->in_sd.is_open();
      } else {
        failed = true;
      }
    }
    if (failed) {
      // EPIPE: the process closed its stdin or ended. Nothing queued can be delivered.
      std::lock_guard lock(e->mu);
      e->stdin_q.clear();
      e->stdin_bytes = 0;
      e->info.stdin_open = false;
      e->writer_running = false;
      co_return;
    }
  }
}

OutputRecord::Type record_type(OutputStream s) {
  switch (s) {
    case OutputStream::kStdout: return OutputRecord::Type::kStdout;
    case OutputStream::kStderr: return OutputRecord::Type::kStderr;
    case OutputStream::kPty: return OutputRecord::Type::kPty;
  }
  return OutputRecord::Type::kStdout;
}

}  // namespace

// Waits for the leader, ends the tree, lets the readers drain, then records the exit.
std::string_view state_name(ProcessState s) {
  switch (s) {
    case ProcessState::kRunning: return "running";
    case ProcessState::kExited: return "exited";
    case ProcessState::kKilled: return "killed";
  }
  return "running";
}

std::string_view restart_name(ProcessSpec::Restart r) {
  switch (r) {
    case ProcessSpec::Restart::kNever: return "never";
    case ProcessSpec::Restart::kOnFailure: return "on-failure";
    case ProcessSpec::Restart::kAlways: return "always";
  }
  return "never";
}

std::string_view record_type_name(OutputRecord::Type t) {
  switch (t) {
    case OutputRecord::Type::kStdout: return "stdout";
    case OutputRecord::Type::kStderr: return "stderr";
    case OutputRecord::Type::kPty: return "pty";
    case OutputRecord::Type::kExit: return "exit";
  }
  return "stdout";
}

std::optional<int> parse_signal(std::string_view name) {
  static constexpr struct {
    std::string_view name;
    int signo;
  } kAllowed[] = {{"INT", SIGINT},   {"TERM", SIGTERM}, {"KILL", SIGKILL},
                  {"HUP", SIGHUP},   {"USR1", SIGUSR1}, {"USR2", SIGUSR2}};
  if (auto n = parse_pid(name)) {
    for (const auto& a : kAllowed) {
      if (a.signo == *n) return *n;
    }
    return std::nullopt;
  }
  if (name.starts_with("SIG")) name.remove_prefix(3);
  for (const auto& a : kAllowed) {
    if (a.name == name) return a.signo;
  }
  return std::nullopt;
}

AttachLease& AttachLease::operator=(AttachLease&& o) noexcept {
  if (this != &o) {
    release();
    e_ = std::move(o.e_);
  }
  return *this;
}

AttachLease::~AttachLease() { release(); }

void AttachLease::release() {
  if (!e_) return;
  std::lock_guard lock(e_->mu);
  e_->attached = false;
  e_.reset();
}

ProcessTable::~ProcessTable() { shutdown(); }

void ProcessTable::prune_locked() {
  std::erase_if(managed_, [](const ManagedPtr& m) {
    std::lock_guard lock(m->mu);
    return m->stopped;
  });
  const auto now = std::chrono::system_clock::now();
  std::size_t ended = 0;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    std::lock_guard lock((*it)->mu);
    if ((*it)->ended) ++ended;
  }
  std::erase_if(entries_, [&](const EntryPtr& e) {
    std::lock_guard lock(e->mu);
    if (!e->ended) return false;
    if (ended > kMaxEnded || now - *e->info.ended_at > kKeepEnded) {
      --ended;
      return true;
    }
    return false;
  });
}

Result<ProcessTable::EntryPtr> ProcessTable::find_locked(std::string_view ref) {
  prune_locked();
  if (auto pid = parse_pid(ref)) {
    EntryPtr newest_ended;
    for (const EntryPtr& e : entries_) {
      std::lock_guard lock(e->mu);
      if (e->starting || e->info.pid != *pid) continue;
      if (!e->ended) return e;
      newest_ended = e;
    }
    if (newest_ended) return newest_ended;
  } else {
    EntryPtr newest_ended;
    for (const EntryPtr& e : entries_) {
      std::lock_guard lock(e->mu);
      if (e->starting || e->info.tag != ref) continue;
      if (!e->ended) return e;
      newest_ended = e;
    }
    if (newest_ended) return newest_ended;
  }
  return fail(Code::kNotFound, "no process '" + std::string(ref) + "'");
}

asio::awaitable<Result<ProcessInfo>> ProcessTable::start(ProcessSpec spec, ExitCallback on_exit,
                                                         std::shared_ptr<void> keepalive) {
  if (spec.argv.empty() && spec.command.empty()) {
    co_return fail(Code::kInvalid, "process: give argv or command");
  }
  if (!spec.argv.empty() && spec.argv.front().empty()) {
    co_return fail(Code::kInvalid, "process: argv[0] is empty");
  }
  if (!spec.tag.empty() && !validate::is_process_tag(spec.tag)) {
    co_return fail(Code::kInvalid, "process: tag '" + spec.tag +
                                       "' must be 1-64 of [A-Za-z0-9._-] and not all digits");
  }
  if (spec.pty) {
    if (auto s = check_pty_size(*spec.pty); !s) co_return std::unexpected(s.error());
  }
  ManagedPtr m;
  if (spec.restart != ProcessSpec::Restart::kNever) {
    if (!keepalive) co_return fail(Code::kInvalid, "process: a managed process needs its owner");
    if (spec.key.empty()) spec.key = spec.tag;
    m = std::make_shared<Managed>(co_await asio::this_coro::executor);
    m->spec = spec;
    m->on_exit = on_exit;
    m->keepalive = std::move(keepalive);
    m->table = this;
  }
  auto r = co_await start_entry(std::move(spec), std::move(on_exit), m);
  if (!r && m) {
    std::shared_ptr<void> drop;
    std::lock_guard lock(m->mu);
    drop = m->stop_locked(/*by_shutdown=*/false);
  }
  co_return r;
}

bool ProcessTable::supervising() {
  std::lock_guard lock(mu_);
  prune_locked();
  return !managed_.empty();
}

Status ProcessTable::check_tag(std::string_view tag) {
  if (tag.empty()) return {};
  std::lock_guard lock(mu_);
  prune_locked();
  for (const EntryPtr& o : entries_) {
    std::lock_guard olock(o->mu);
    if (!o->ended && o->info.tag == tag) {
      return fail(Code::kExists,
                  "process: tag '" + std::string(tag) + "' is taken by a live process");
    }
  }
  for (const ManagedPtr& o : managed_) {
    std::lock_guard olock(o->mu);
    if (!o->stopped && o->spec.tag == tag) {
      return fail(Code::kExists,
                  "process: tag '" + std::string(tag) + "' is taken by a managed process");
    }
  }
  return {};
}

asio::awaitable<Result<ProcessInfo>> ProcessTable::start_entry(ProcessSpec spec,
                                                               ExitCallback on_exit, ManagedPtr m) {
  asio::any_io_executor ex = co_await asio::this_coro::executor;
  auto e = std::make_shared<ProcEntry>(ex);
  e->info.tag = spec.tag;
  e->info.argv = spec.argv;
  e->info.command = spec.argv.empty() ? spec.command : std::string();
  e->info.cwd = spec.cwd;
  e->info.pty = spec.pty;
  e->info.managed = m != nullptr;
  e->info.restarts = spec.restarts;
  e->info.stdin_open = spec.stdin_open || spec.pty.has_value();
  e->on_exit = std::move(on_exit);
  e->managed = m;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) co_return fail(Code::kUnavailable, "process: the box is shut down");
    prune_locked();
    std::size_t live = 0;
    for (const EntryPtr& o : entries_) {
      std::lock_guard olock(o->mu);
      if (o->ended) continue;
      ++live;
      if (!spec.tag.empty() && o->info.tag == spec.tag) {
        co_return fail(Code::kExists, "process: tag '" + spec.tag + "' is taken by a live process");
      }
    }
    // A supervised process keeps its tag (and key) through its backoffs.
    bool registered = false;
    for (const ManagedPtr& o : managed_) {
      if (o == m) {
        registered = true;
        continue;
      }
      std::lock_guard olock(o->mu);
      if (o->stopped) continue;
      if (!spec.tag.empty() && o->spec.tag == spec.tag) {
        co_return fail(Code::kExists,
                       "process: tag '" + spec.tag + "' is taken by a managed process");
      }
      if (m && !spec.key.empty() && o->spec.key == spec.key) {
        co_return fail(Code::kExists,
                       "process: managed process '" + spec.key + "' is supervised already");
      }
    }
    if (live >= kMaxLive) {
      co_return fail(Code::kTooBig,
                     "process: " + std::to_string(kMaxLive) + " live processes already");
    }
    entries_.push_back(e);  // reserves the tag while the backend starts it
    if (m && !registered) managed_.push_back(m);
  }
  auto drop = [this, &e] {
    std::lock_guard lock(mu_);
    std::erase(entries_, e);
  };

  auto launched = co_await launcher_.launch(std::move(spec));
  if (!launched) {
    drop();
    co_return std::unexpected(launched.error());
  }
  e->proc = std::move(launched->proc);
  boost::system::error_code ec;
  if (launched->pty_master) {
    UniqueFd in(::fcntl(launched->pty_master.get(), F_DUPFD_CLOEXEC, 3));
    if (in) e->in_sd.assign(in.release(), ec);
    if (!ec) e->out_sd.assign(launched->pty_master.release(), ec);
    e->pty_fd = e->out_sd.is_open() ? e->out_sd.native_handle() : -1;
  } else {
    if (e->proc->stdout_fd) e->out_sd.assign(e->proc->stdout_fd.release(), ec);
    if (!ec && e->proc->stderr_fd) e->err_sd.assign(e->proc->stderr_fd.release(), ec);
    if (!ec && e->proc->stdin_fd) e->in_sd.assign(e->proc->stdin_fd.release(), ec);
  }
  for (auto* sd : {&e->out_sd, &e->err_sd, &e->in_sd}) {
    if (!ec && sd->is_open()) sd->non_blocking(true, ec);
  }
  if (ec) {
    // The process runs but we cannot watch it: it must not run unwatched.
    e->proc->kill_tree();
    co_spawn(ex, supervise(e), [](std::exception_ptr p) { log_exception(p, "supervise"); });
    drop();
    co_return fail(Code::kInternal, "process: registering its pipes: " + ec.message());
  }
  ProcessInfo info;
  bool shut_down;
  {
    std::lock_guard lock(mu_);
    shut_down = shut_down_;
  }
  {
    std::lock_guard lock(e->mu);
    e->info.pid = launched->pid;
    e->info.started_at = std::chrono::system_clock::now();
    e->starting = false;
    // shutdown() ran while the backend was starting it (and skipped it): it must not outlive
    // the box either; nor a restart whose supervision was killed meanwhile.
    bool stopped = false;
    if (m) {
      std::lock_guard mlock(m->mu);
      stopped = m->stopped;
    }
    e->shutdown_end = shut_down;
    if (shut_down || stopped) {
      e->requested_end = true;
      e->proc->kill_tree();
    }
    info = e->info;
  }
  if (e->out_sd.is_open()) {
    ++e->open_readers;
    co_spawn(ex, read_stream(e, &e->out_sd, e->pty_fd >= 0 ? OutputStream::kPty : OutputStream::kStdout),
             [](std::exception_ptr p) { log_exception(p, "stdout reader"); });
  }
  if (e->err_sd.is_open()) {
    ++e->open_readers;
    co_spawn(ex, read_stream(e, &e->err_sd, OutputStream::kStderr),
             [](std::exception_ptr p) { log_exception(p, "stderr reader"); });
  }
  co_spawn(ex, supervise(e), [](std::exception_ptr p) { log_exception(p, "supervise"); });
  co_return info;
}

std::vector<ProcessInfo> ProcessTable::list() {
  std::lock_guard lock(mu_);
  prune_locked();
  std::vector<ProcessInfo> out;
  for (const EntryPtr& e : entries_) {
    std::lock_guard elock(e->mu);
    if (!e->starting) out.push_back(e->info);
  }
  return out;
}

bool ProcessTable::starting(std::string_view ref) {
  std::lock_guard lock(mu_);
  for (const EntryPtr& e : entries_) {
    std::lock_guard elock(e->mu);
    if (e->starting && !e->info.tag.empty() && e->info.tag == ref) return true;
  }
  return false;
}

Result<ProcessInfo> ProcessTable::get(std::string_view ref) {
  std::lock_guard lock(mu_);
  auto e = find_locked(ref);
  if (!e) return std::unexpected(e.error());
  std::lock_guard elock((*e)->mu);
  return (*e)->info;
}

Result<OutputBatch> ProcessTable::output(std::string_view ref, std::optional<std::uint64_t> since,
                                         std::size_t max_bytes) {
  std::lock_guard lock(mu_);
  auto found = find_locked(ref);
  if (!found) return std::unexpected(found.error());
  ProcEntry& e = **found;
  std::lock_guard elock(e.mu);
  const std::uint64_t from = since.value_or(e.ring.oldest());
  OutputBatch b;
  b.next = from;
  for (OutputChunk& c : e.ring.read(from, max_bytes)) {
    b.next = c.offset + c.data.size();
    b.records.push_back(OutputRecord{record_type(c.stream), c.offset, std::move(c.data)});
  }
  if (e.ended && b.next >= e.ring.total()) {
    OutputRecord x;
    x.type = OutputRecord::Type::kExit;
    x.offset = e.ring.total();
    x.exit_code = e.exit.exit_code;
    x.signal = e.exit.signal;
    b.records.push_back(std::move(x));
    b.ended = true;
    b.next = std::max(b.next, e.ring.total());
  }
  return b;
}

asio::awaitable<Result<OutputBatch>> ProcessTable::follow(std::string ref,
                                                          std::optional<std::uint64_t> since,
                                                          std::size_t max_bytes) {
  auto ex = co_await asio::this_coro::executor;
  for (;;) {
    auto b = output(ref, since, max_bytes);
    if (!b || !b->records.empty() || b->ended) co_return b;
    since = b->next;
    EntryPtr e;
    {
      std::lock_guard lock(mu_);
      auto found = find_locked(ref);
      if (!found) co_return std::unexpected(found.error());
      e = *found;
    }
    asio::steady_timer t(ex, asio::steady_timer::time_point::max());
    {
      std::lock_guard lock(e->mu);
      if (e->ended || e->ring.total() > *since) continue;  // arrived meanwhile
      e->waiters.push_back(&t);
    }
    auto [ec] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
    (void)ec;
    {
      std::lock_guard lock(e->mu);
      std::erase(e->waiters, &t);
    }
    auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none) {
      OutputBatch empty;
      empty.next = *since;
      co_return empty;
    }
  }
}

Status ProcessTable::write_stdin(std::string_view ref, std::string_view data, bool close) {
  std::lock_guard lock(mu_);
  auto found = find_locked(ref);
  if (!found) return std::unexpected(found.error());
  EntryPtr e = *found;
  std::lock_guard elock(e->mu);
  const bool pty = e->info.pty.has_value();
  if (e->ended) {
    return std::unexpected(Error{Code::kExists, EPIPE,
                                 "stdin: process " + name_of(e->info) + " has ended"});
  }
  if (!e->info.stdin_open) {
    if (!pty && !e->stdin_close && e->stdin_q.empty() && !e->in_sd.is_open()) {
      return fail(Code::kInvalid, "stdin: process " + name_of(e->info) +
                                      " was started without stdin (\"stdin\": true)");
    }
    return std::unexpected(Error{Code::kExists, EPIPE,
                                 "stdin: process " + name_of(e->info) + ": stdin is closed"});
  }
  if (e->stdin_bytes + data.size() > kMaxStdinQueued) {
    return fail(Code::kTooBig, "stdin: process " + name_of(e->info) + " is not reading (" +
                                   std::to_string(e->stdin_bytes) + " bytes wait)");
  }
  if (!data.empty()) {
    e->stdin_q.emplace_back(data);
    e->stdin_bytes += data.size();
  }
  if (close) {
    if (pty) {
      e->stdin_q.emplace_back("\x04");  // a terminal has no EOF of its own: ^D
      e->stdin_bytes += 1;
    } else {
      e->stdin_close = true;
      e->info.stdin_open = false;
    }
  }
  if (!e->writer_running) {
    e->writer_running = true;
    // Posted, not spawned here: co_spawn dispatches, so called on the table's executor (the
    // daemon's network thread) the writer would run inline and take e->mu, held above.
    asio::post(e->ex, [e] {
      co_spawn(e->ex, write_stdin_loop(e),
               [](std::exception_ptr p) { log_exception(p, "stdin writer"); });
    });
  }
  return {};
}

Status ProcessTable::signal(std::string_view ref, int signo) {
  if (!parse_signal(std::to_string(signo))) {
    return fail(Code::kInvalid, "signal: " + std::to_string(signo) +
                                    " is not one of SIGINT SIGTERM SIGKILL SIGHUP SIGUSR1 SIGUSR2");
  }
  std::lock_guard lock(mu_);
  auto found = find_locked(ref);
  if (!found) return std::unexpected(found.error());
  std::lock_guard elock((*found)->mu);
  if ((*found)->ended) {
    return fail(Code::kExists, "signal: process " + name_of((*found)->info) + " has ended");
  }
  return (*found)->proc->signal(signo);
}

Status ProcessTable::resize(std::string_view ref, PtySize size) {
  std::lock_guard lock(mu_);
  auto found = find_locked(ref);
  if (!found) return std::unexpected(found.error());
  ProcEntry& e = **found;
  std::lock_guard elock(e.mu);
  if (!e.info.pty) {
    return fail(Code::kInvalid, "resize: process " + name_of(e.info) + " has no pty");
  }
  if (auto s = check_pty_size(size); !s) return s;
  if (e.ended || e.pty_fd < 0) {
    return fail(Code::kExists, "resize: process " + name_of(e.info) + " has ended");
  }
  if (auto r = e.proc->resize_pty(size.cols, size.rows)) {
    if (!*r) return *r;
  } else {
    winsize ws{};
    ws.ws_col = size.cols;
    ws.ws_row = size.rows;
    if (::ioctl(e.pty_fd, TIOCSWINSZ, &ws) != 0) return fail_errno(errno, "ioctl(TIOCSWINSZ)");
  }
  e.info.pty = size;
  return {};
}

Status ProcessTable::kill(std::string_view ref) {
  std::shared_ptr<void> drop;  // the supervision's keepalive, let go after the locks
  std::lock_guard lock(mu_);
  auto found = find_locked(ref);
  if (!found) return std::unexpected(found.error());
  std::vector<EntryPtr> targets{*found};
  if (const ManagedPtr& m = (*found)->managed) {
    {
      std::lock_guard mlock(m->mu);
      drop = m->stop_locked(/*by_shutdown=*/false);
    }
    // Named by an older incarnation's pid: the live one goes too.
    for (const EntryPtr& o : entries_) {
      if (o != *found && o->managed == m) targets.push_back(o);
    }
  }
  for (const EntryPtr& e : targets) {
    std::lock_guard elock(e->mu);
    if (e->ended || e->starting || !e->proc) continue;
    e->requested_end = true;
    e->proc->kill_tree();
  }
  return {};
}

Result<AttachLease> ProcessTable::attach(std::string_view ref) {
  std::lock_guard lock(mu_);
  auto found = find_locked(ref);
  if (!found) return std::unexpected(found.error());
  std::lock_guard elock((*found)->mu);
  if ((*found)->attached) {
    return fail(Code::kExists,
                "attach: process " + name_of((*found)->info) + " already has an attacher");
  }
  (*found)->attached = true;
  return AttachLease(*found);
}

void ProcessTable::shutdown() {
  std::vector<std::shared_ptr<void>> drop;  // keepalives, let go after the locks
  std::lock_guard lock(mu_);
  shut_down_ = true;
  for (const EntryPtr& e : entries_) {
    std::lock_guard elock(e->mu);
    if (e->ended || e->starting || !e->proc) continue;
    e->requested_end = true;
    e->shutdown_end = true;
    e->proc->kill_tree();
  }
  for (const ManagedPtr& m : managed_) {
    std::lock_guard mlock(m->mu);
    drop.push_back(m->stop_locked(/*by_shutdown=*/true));
  }
  managed_.clear();
}

}  // namespace agentbox::sandbox
