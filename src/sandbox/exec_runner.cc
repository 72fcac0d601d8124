#include "sandbox/exec_runner.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/cancellation_state.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <exception>
#include <utility>

#include "common/log.h"
#include "common/no_sigpipe.h"

namespace agentbox::sandbox {
namespace {

namespace asio = boost::asio;
using asio::posix::stream_descriptor;
using Clock = std::chrono::steady_clock;

// One read is at most a pipe's default capacity.
constexpr std::size_t kChunkBytes = 64 * 1024;
// Reads per readiness wakeup before yielding, so one chatty command cannot starve the others
// sharing the thread.
constexpr int kReadsPerWakeup = 16;
// After the leader exits we drain at most this much per stream: what a pipe can hold
// (/proc/sys/fs/pipe-max-size defaults to 1 MiB). Without a bound, a background child that keeps
// writing would keep the run alive forever.
constexpr std::size_t kMaxDrainBytes = 1024 * 1024;
// Chunks queued between the readers and a slow sink; beyond it the readers stop reading, the
// pipes fill and the command blocks (backpressure instead of unbounded memory).
constexpr std::size_t kSinkQueueChunks = 4;

// Chunk channel for streaming runs. An empty chunk is a stream's end marker (real reads are
// never empty).
using ChunkChannel =
    asio::experimental::channel<void(boost::system::error_code, StreamKind, std::string)>;

// write(2) to a pipe without a process-wide SIG_IGN for SIGPIPE: SIGPIPE from a pipe write is
// sent to the writing thread, so we block it in this thread around the write and consume it if
// the write raised it. (Ignoring SIGPIPE globally would leak SIG_IGN into every command we exec.)
ssize_t write_without_sigpipe(int fd, const char* data, std::size_t size) {
  return call_without_sigpipe([&] { return ::write(fd, data, size); });
}

struct StreamState {
  explicit StreamState(const asio::any_io_executor& ex) : desc(ex) {}
  stream_descriptor desc;
  std::string data;      // kept bytes (no-sink runs)
  std::size_t kept = 0;  // bytes kept or forwarded
  bool truncated = false;
};

// Everything one run shares between its coroutines. All of them run on `strand`, so no member
// needs a lock.
struct RunState {
  RunState(asio::any_io_executor strand_ex, std::unique_ptr<Process> p, RunOptions o, OutputSink* s)
      : strand(std::move(strand_ex)),
        proc(std::move(p)),
        opts(std::move(o)),
        sink(s),
        out(strand),
        err(strand),
        in(strand),
        deadline(strand),
        joined(strand, Clock::time_point::max()) {
    if (sink != nullptr) chunks = std::make_unique<ChunkChannel>(strand, kSinkQueueChunks);
  }

  StreamState& stream(StreamKind k) { return k == StreamKind::kStdout ? out : err; }

  void kill() {
    if (proc && !finished) proc->kill_tree();
  }

  // Stops the readers and the stdin writer at their next suspension point.
  void stop_io() {
    boost::system::error_code ignored;
    out.desc.cancel(ignored);
    err.desc.cancel(ignored);
    in.cancel(ignored);
  }

  asio::any_io_executor strand;
  std::unique_ptr<Process> proc;
  RunOptions opts;
  OutputSink* sink;
  std::unique_ptr<ChunkChannel> chunks;
  StreamState out;
  StreamState err;
  stream_descriptor in;
  asio::steady_timer deadline;
  asio::steady_timer joined;  // never expires; cancelled when the last child coroutine ends
  int active = 0;             // child coroutines still running
  int open_streams = 0;       // streams whose end marker the forwarder still awaits
  bool leader_exited = false;
  bool timed_out = false;
  bool sink_gone = false;
  bool cancelled = false;  // the awaiting coroutine was cancelled (its client went away)
  bool finished = false;
};

// Takes over a daemon-side pipe end: non-blocking, registered with the reactor. An fd the
// reactor refuses (not pollable) is dropped: that stream is simply empty.
bool adopt(stream_descriptor& desc, UniqueFd fd, const char* what) {
  if (!fd.valid()) return false;
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) < 0) {
    spdlog::warn("exec: fcntl(O_NONBLOCK) on {} pipe failed: errno {}", what, errno);
    return false;
  }
  boost::system::error_code ec;
  desc.assign(fd.get(), ec);
  if (ec) {
    spdlog::warn("exec: cannot poll {} pipe: {}", what, ec.message());
    return false;
  }
  (void)fd.release();  // the descriptor owns it now
  return true;
}

// How many more bytes of stream `s` the cap lets us keep.
std::size_t cap_room(const RunState& st, const StreamState& s) {
  return s.kept >= st.opts.max_output_bytes ? 0 : st.opts.max_output_bytes - s.kept;
}

// Delivers one chunk that was read into `chunk` (already within the cap) to the sink queue.
asio::awaitable<void> enqueue(std::shared_ptr<RunState> st, StreamKind kind, std::string chunk) {
  auto [ec] = co_await st->chunks->async_send(boost::system::error_code{}, kind, std::move(chunk),
                                              asio::as_tuple(asio::use_awaitable));
  (void)ec;  // the channel is never closed or cancelled while readers run
}

enum class ReadEnd { kMore, kWouldBlock, kEof };

// Reads one chunk of `kind` non-blockingly. Kept bytes go to the result string (no sink) or to
// *to_sink; bytes past the cap are discarded and mark the stream truncated. *got is what the read
// returned (for drain accounting).
ReadEnd read_once(RunState& st, StreamKind kind, std::string* to_sink, std::size_t* got) {
  // Past the cap we still read (so the command does not block on a full pipe) into a scratch
  // buffer that is dropped at once; no suspension happens between the read and the drop.
  static thread_local std::array<char, kChunkBytes> discard;
  StreamState& s = st.stream(kind);
  const int fd = s.desc.native_handle();
  const std::size_t room = cap_room(st, s);
  *got = 0;
  for (;;) {
    ssize_t n = -1;
    int read_errno = 0;
    if (room == 0) {
      n = ::read(fd, discard.data(), discard.size());
      read_errno = errno;
      if (n > 0) s.truncated = true;
    } else {
      const std::size_t want = std::min(room, kChunkBytes);
      std::string* dst = st.sink != nullptr ? to_sink : &s.data;
      const std::size_t old = dst->size();
      dst->resize_and_overwrite(old + want, [&](char* p, std::size_t) {
        n = ::read(fd, p + old, want);
        read_errno = errno;
        return old + static_cast<std::size_t>(std::max<ssize_t>(n, 0));
      });
      if (n > 0) s.kept += static_cast<std::size_t>(n);
      // A read that filled exactly the remaining room may have left more behind: the next read
      // lands in the discard branch and sets the flag if so.
    }
    if (n > 0) {
      *got = static_cast<std::size_t>(n);
      return ReadEnd::kMore;
    }
    if (n == 0) return ReadEnd::kEof;
    if (read_errno == EINTR) continue;
    if (read_errno == EAGAIN) return ReadEnd::kWouldBlock;
    // EIO and friends: treat like EOF, nothing more will come.
    return ReadEnd::kEof;
  }
}

// Reads one output stream until EOF, or until the leader has exited and what was buffered has
// been drained.
asio::awaitable<void> pump(std::shared_ptr<RunState> st, StreamKind kind) {
  StreamState& s = st->stream(kind);
  bool eof = false;
  std::size_t drained = 0;
  while (!eof) {
    const bool draining = st->leader_exited;
    if (!draining) {
      auto [ec] = co_await s.desc.async_wait(stream_descriptor::wait_read,
                                             asio::as_tuple(asio::use_awaitable));
      if (ec && ec != asio::error::operation_aborted) break;
      // operation_aborted: the leader exited (stop_io); fall through to drain.
    }
    const bool final_pass = st->leader_exited;
    for (int i = 0; final_pass || i < kReadsPerWakeup; ++i) {
      std::string chunk;
      std::size_t got = 0;
      ReadEnd r = read_once(*st, kind, &chunk, &got);
      if (!chunk.empty() && !st->sink_gone) {
        asio::awaitable<void> send = enqueue(st, kind, std::move(chunk));
        co_await std::move(send);
      }
      if (r == ReadEnd::kEof) {
        eof = true;
        break;
      }
      if (r == ReadEnd::kWouldBlock) break;
      if (final_pass && (drained += got) >= kMaxDrainBytes) break;
    }
    if (final_pass) break;
    if (!eof && !st->leader_exited) {
      // Budget used up with data still coming: let the other coroutines on this thread run.
      co_await asio::post(st->strand, asio::use_awaitable);
    }
  }
  boost::system::error_code ignored;
  s.desc.close(ignored);  // a background child still writing gets EPIPE, as after an ssh exit
  if (st->chunks) {
    asio::awaitable<void> send = enqueue(st, kind, std::string());
    co_await std::move(send);
  }
}

// Writes stdin_data, then closes stdin.
asio::awaitable<void> feed_stdin(std::shared_ptr<RunState> st) {
  const std::string& data = st->opts.stdin_data;
  std::size_t off = 0;
  while (off < data.size() && !st->leader_exited) {
    ssize_t n = write_without_sigpipe(st->in.native_handle(), data.data() + off,
                                      std::min(data.size() - off, kChunkBytes));
    if (n > 0) {
      off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      auto [ec] = co_await st->in.async_wait(stream_descriptor::wait_write,
                                             asio::as_tuple(asio::use_awaitable));
      if (ec) break;
      continue;
    }
    break;  // EPIPE: the command closed stdin or exited; the rest is not wanted
  }
  boost::system::error_code ignored;
  st->in.close(ignored);
}

// Hands queued chunks to the sink one at a time, in order, until every stream has ended.
asio::awaitable<void> forward_to_sink(std::shared_ptr<RunState> st) {
  while (st->open_streams > 0) {
    auto [ec, kind, data] = co_await st->chunks->async_receive(asio::as_tuple(asio::use_awaitable));
    if (ec) break;
    if (data.empty()) {
      --st->open_streams;
      continue;
    }
    if (st->sink_gone) continue;  // keep receiving so the readers never block
    bool keep = false;
    try {
      asio::awaitable<bool> call = st->sink->on_output(kind, std::move(data));
      keep = co_await std::move(call);
    } catch (const std::exception& e) {
      spdlog::warn("exec: output sink failed: {}", e.what());
    }
    if (!keep) {
      st->sink_gone = true;
      st->kill();
    }
  }
}

// Completion of a child coroutine: counts it out and wakes the supervisor after the last one.
struct ChildDone {
  std::shared_ptr<RunState> st;
  void operator()(std::exception_ptr e) const {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        spdlog::error("exec: runner task failed: {}", ex.what());
      } catch (...) {
        spdlog::error("exec: runner task failed");
      }
      st->kill();  // the leader then exits and the run winds down normally
    }
    if (--st->active == 0) st->joined.cancel();
  }
};

void spawn_child(const std::shared_ptr<RunState>& st, asio::awaitable<void> task) {
  ++st->active;
  asio::co_spawn(st->strand, std::move(task), asio::bind_executor(st->strand, ChildDone{st}));
}

struct DeadlineHandler {
  std::shared_ptr<RunState> st;
  void operator()(boost::system::error_code ec) const {
    if (ec || st->leader_exited || st->finished) return;
    st->timed_out = true;
    st->kill();
  }
};

asio::awaitable<ExecResult> supervise(std::shared_ptr<RunState> st, Clock::time_point start,
                                      UniqueFd in_fd, UniqueFd out_fd, UniqueFd err_fd) {
  for (StreamKind k : {StreamKind::kStdout, StreamKind::kStderr}) {
    UniqueFd fd = std::move(k == StreamKind::kStdout ? out_fd : err_fd);
    if (!adopt(st->stream(k).desc, std::move(fd), k == StreamKind::kStdout ? "stdout" : "stderr")) {
      continue;
    }
    ++st->open_streams;
    spawn_child(st, pump(st, k));
  }
  if (st->chunks) spawn_child(st, forward_to_sink(st));
  // Without data to feed, closing our end at once gives the command EOF on its first read.
  if (!st->opts.stdin_data.empty() && adopt(st->in, std::move(in_fd), "stdin")) {
    spawn_child(st, feed_stdin(st));
  }
  in_fd.reset();

  if (st->opts.timeout.count() > 0) {
    st->deadline.expires_after(st->opts.timeout);
    st->deadline.async_wait(asio::bind_executor(st->strand, DeadlineHandler{st}));
  }

  ExitStatus status{.exit_code = -1};
  try {
    asio::awaitable<ExitStatus> wait = st->proc->wait();
    status = co_await std::move(wait);
  } catch (const std::exception& e) {
    // Impossible by contract; make sure nothing keeps running, and report a failed run.
    spdlog::error("exec: waiting for the command failed: {}", e.what());
    st->kill();
  }
  st->leader_exited = true;
  st->deadline.cancel();
  st->stop_io();
  while (st->active > 0) {
    co_await st->joined.async_wait(asio::as_tuple(asio::use_awaitable));
  }

  ExecResult r;
  r.stdout_data = std::move(st->out.data);
  r.stderr_data = std::move(st->err.data);
  r.stdout_truncated = st->out.truncated;
  r.stderr_truncated = st->err.truncated;
  if (st->timed_out) {
    r.timed_out = true;
    r.killed_by = KilledBy::kTimeout;
    r.exit_code = -1;
    r.signal = SIGKILL;
  } else {
    r.exit_code = status.exit_code;
    r.signal = status.signal;
  }
  r.duration = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  st->finished = true;
  st->proc.reset();  // reaps the leader now rather than whenever the last reference goes
  co_return r;
}

// Installed in the awaiting coroutine's cancellation slot for the duration of a run. Called by
// whoever emits the cancellation, on its thread: the kill itself happens on the run's strand.
struct CancelHandler {
  std::shared_ptr<RunState> st;
  void operator()(asio::cancellation_type_t type) const {
    if (type == asio::cancellation_type::none) return;
    asio::post(st->strand, KillOnCancel{st});
  }
  struct KillOnCancel {
    std::shared_ptr<RunState> st;
    void operator()() const {
      if (st->finished) return;
      st->cancelled = true;
      st->kill();
    }
  };
};

}  // namespace

asio::awaitable<ExecResult> run_process(std::unique_ptr<Process> p, RunOptions opts,
                                        OutputSink* sink) {
  const auto start = Clock::now();
  AB_CHECK(p != nullptr);
  // g++ 12: no temporaries with destructors inside a co_await expression (they get destroyed
  // twice); awaitables and their arguments are named locals throughout this file.
  asio::any_io_executor caller = co_await asio::this_coro::executor;
  asio::any_io_executor strand = asio::make_strand(caller);
  UniqueFd in_fd = std::move(p->stdin_fd);
  UniqueFd out_fd = std::move(p->stdout_fd);
  UniqueFd err_fd = std::move(p->stderr_fd);
  auto st = std::make_shared<RunState>(strand, std::move(p), std::move(opts), sink);

  // Cancellation of the awaiting coroutine kills the command (step 6). The awaiting coroutine's
  // own slot gets a handler that kills the tree; the supervisor is spawned with an EMPTY slot,
  // so cancelling never abandons the children mid-run (they reference the sink): the run ends
  // when the killed command does. No co_await in here may throw on cancellation either, else
  // the caller would lose the result (and its clean-up) of a command that did run.
  const bool throw_if_cancelled = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  asio::cancellation_state cs = co_await asio::this_coro::cancellation_state;
  asio::cancellation_slot slot = cs.slot();
  if (slot.is_connected()) slot.assign(CancelHandler{st});
  if (cs.cancelled() != asio::cancellation_type::none) CancelHandler{st}(cs.cancelled());

  asio::awaitable<ExecResult> task =
      supervise(st, start, std::move(in_fd), std::move(out_fd), std::move(err_fd));
  auto token = asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
  auto run = asio::co_spawn(strand, std::move(task), token);
  ExecResult r = co_await std::move(run);
  if (slot.is_connected()) slot.clear();
  co_await asio::this_coro::throw_if_cancelled(throw_if_cancelled);
  co_return r;
}

}  // namespace agentbox::sandbox
