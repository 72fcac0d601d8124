#include "remote/remote_processes.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <atomic>
#include <csignal>
#include <deque>

#include "common/log.h"
#include "common/log_errors.h"

namespace agentbox::remote {

namespace asio = boost::asio;
using Json = proto::Json;
using namespace std::chrono_literals;

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
constexpr std::chrono::milliseconds kStartTimeout = 30s;
constexpr std::size_t kStdinRead = 32 << 10;  // per stdio_write / pty_stdin frame
// Backpressure: the protocol has no flow control for pushes, so a command whose reader is slow
// (a streaming exec to a slow client) is stopped (SIGSTOP to its group) while more than
// kPauseAt bytes wait here, and continued below kResumeAt, as a local command blocks in write().
// What the runner already queued still arrives: the daemon holds about kPauseAt + its queue.
constexpr std::size_t kPauseAt = 8 << 20;
constexpr std::size_t kResumeAt = 1 << 20;

void ignore_reply(Result<RunnerReply>) {}

// One output pipe of the daemon's side: what the runner pushed, written in order.
struct OutPipe {
  explicit OutPipe(asio::any_io_executor ex) : sd(ex) {}
  asio::posix::stream_descriptor sd;
  std::deque<std::string> q;
  bool writing = false;
  bool broken = false;  // the reader is gone: pushes are dropped
};

class StreamBridge : public RemoteStreamState,
                     public std::enable_shared_from_this<StreamBridge> {
 public:
  StreamBridge(asio::any_io_executor ex, std::shared_ptr<RunnerConn> conn, std::string id,
               bool pty)
      : ex_(ex), conn_(std::move(conn)), id_(std::move(id)), pty_(pty), out_(ex), err_(ex),
        in_(ex), done_timer_(ex) {
    done_timer_.expires_at(asio::steady_timer::time_point::max());
  }

  std::string lost() const override { return lost_; }
  const std::string& id() const { return id_; }
  const std::shared_ptr<RunnerConn>& conn() const { return conn_; }
  bool pty() const { return pty_; }

  // The bridge's ends: out/err written (err: none with a pty), in read (-1: none).
  Status assign(int out, int err, int in) {
    boost::system::error_code ec;
    if (out >= 0) out_.sd.assign(out, ec);
    if (!ec && err >= 0) err_.sd.assign(err, ec);
    if (!ec && in >= 0) in_.assign(in, ec);
    for (auto* sd : {&out_.sd, &err_.sd, &in_}) {
      if (!ec && sd->is_open()) sd->non_blocking(true, ec);
    }
    if (ec) return fail(Code::kInternal, "process: bridging its pipes: " + ec.message());
    return {};
  }

  // After the runner started the command: stdin flows from here on.
  void started() {
    if (in_.is_open()) {
      asio::co_spawn(ex_, stdin_loop(shared_from_this()), LogErrors{"remote process stdin"});
    } else if (!pty_) {
      send_eof();
    }
  }

  // A push of this stream (or the connection's end), on ex_.
  void on_push(Result<RunnerReply> r) {
    if (done_ || exit_) return;
    if (!r) {
      lost_ = r.error().message;
      exit_ = sandbox::ExitStatus{128 + 9, 9};
      maybe_done();
      return;
    }
    const std::string& t = r->type;
    if (t == proto::type::kStdioData || t == proto::type::kPtyData) {
      auto d = proto::body_as<proto::StreamData>(*r);
      if (!d || d->data.empty()) return;
      OutPipe& p = d->is_stderr && err_.sd.is_open() ? err_ : out_;
      if (p.broken || !p.sd.is_open()) return;
      queued_ += d->data.size();
      p.q.push_back(std::move(d->data));
      if (queued_ > kPauseAt && !paused_) pause(true);
      if (!p.writing) {
        p.writing = true;
        asio::co_spawn(ex_, write_loop(shared_from_this(), &p), LogErrors{"remote process writer"});
      }
      return;
    }
    if (t == proto::type::kStdioExit || t == proto::type::kPtyExit) {
      auto x = proto::body_as<proto::StreamExit>(*r);
      sandbox::ExitStatus st;
      if (x && x->signal > 0) {
        st.exit_code = 128 + x->signal;
        st.signal = x->signal;
      } else {
        st.exit_code = x ? x->exit_code : -1;
      }
      exit_ = st;
      maybe_done();
    }
  }

  asio::awaitable<sandbox::ExitStatus> wait() {
    auto self = shared_from_this();
    while (!done_) {
      auto [ec] = co_await done_timer_.async_wait(kTuple);
      (void)ec;
    }
    co_return *exit_;
  }

  void send_signal(int signo, bool group) {
    if (!conn_->open()) return;
    proto::StreamSignal s{id_, signo, group};
    conn_->request(std::string(proto::type::kStdioSignal), proto::to_json(s), kStartTimeout,
                   ignore_reply);
    // A stopped command would hold the signal until continued: it takes it now. (Any thread: a
    // second SIGCONT is harmless.)
    if (signo != SIGKILL && signo != SIGSTOP && signo != SIGCONT && paused_) {
      proto::StreamSignal cont{id_, SIGCONT, true};
      conn_->request(std::string(proto::type::kStdioSignal), proto::to_json(cont), kStartTimeout,
                     ignore_reply);
    }
  }

  void resize(std::uint16_t cols, std::uint16_t rows) {
    conn_->notify(std::string(proto::type::kPtyResize),
                  proto::to_json(proto::PtyResize{id_, cols, rows}));
  }

  // The Process is gone: the runner forgets the stream; the bridge lets its fds go.
  void close() {
    conn_->unwatch(id_);
    if (conn_->open()) {
      auto type = pty_ ? proto::type::kPtyClose : proto::type::kStdioClose;
      conn_->request(std::string(type), proto::to_json(proto::StreamRequest{id_}), kStartTimeout,
                     ignore_reply);
    }
    asio::post(ex_, [self = shared_from_this()] {
      boost::system::error_code ec;
      self->in_.close(ec);
      if (!self->exit_) {  // (killed before its exit came): nothing more will be written
        self->exit_ = sandbox::ExitStatus{128 + 9, 9};
        self->maybe_done();
      }
    });
  }

 private:
  void pause(bool stop) {
    paused_ = stop;
    send_signal(stop ? SIGSTOP : SIGCONT, /*group=*/true);
  }

  void send_eof() {
    proto::StreamData d{id_, ""};
    d.eof = true;
    conn_->notify(std::string(proto::type::kStdioWrite), proto::to_json(d));
  }

  static asio::awaitable<void> stdin_loop(std::shared_ptr<StreamBridge> self) {
    std::string buf(kStdinRead, '\0');
    for (;;) {
      auto [ec, n] = co_await self->in_.async_read_some(asio::buffer(buf), kTuple);
      if (n > 0 && !self->done_) {
        proto::StreamData d{self->id_, buf.substr(0, n)};
        auto type = self->pty_ ? proto::type::kPtyStdin : proto::type::kStdioWrite;
        self->conn_->notify(std::string(type), proto::to_json(d));
      }
      if (ec) break;
    }
    // EOF: the table closed the process's stdin (an error: the bridge is closing).
    if (!self->pty_ && !self->done_ && self->conn_->open()) self->send_eof();
  }

  static asio::awaitable<void> write_loop(std::shared_ptr<StreamBridge> self, OutPipe* p) {
    while (!p->q.empty()) {
      std::string chunk = std::move(p->q.front());
      p->q.pop_front();
      auto [ec, n] = co_await asio::async_write(p->sd, asio::buffer(chunk), kTuple);
      (void)n;
      self->queued_ -= chunk.size();
      if (ec) {
        for (const std::string& c : p->q) self->queued_ -= c.size();
        p->q.clear();
        p->broken = true;  // the daemon's reader is gone
      }
      if (self->paused_ && (self->queued_ < kResumeAt || p->broken) && !self->done_) {
        self->pause(false);
      }
      if (ec) break;
    }
    p->writing = false;
    self->maybe_done();
  }

  // Once the exit is known and everything pushed before it is in the pipes: EOF on them, and
  // wait() completes.
  void maybe_done() {
    if (done_ || !exit_ || out_.writing || err_.writing) return;
    boost::system::error_code ec;
    // A pty's socket is also the process's stdin: shut down its write side only, so the
    // table's writer sees EPIPE, not a closed fd of its own.
    if (pty_ && out_.sd.is_open()) {
      ::shutdown(out_.sd.native_handle(), SHUT_RDWR);
    }
    out_.sd.close(ec);
    err_.sd.close(ec);
    done_ = true;
    conn_->unwatch(id_);
    done_timer_.expires_at(asio::steady_timer::time_point::min());
  }

  asio::any_io_executor ex_;
  std::shared_ptr<RunnerConn> conn_;
  std::string id_;
  bool pty_;
  OutPipe out_, err_;
  asio::posix::stream_descriptor in_;
  asio::steady_timer done_timer_;
  std::optional<sandbox::ExitStatus> exit_;
  bool done_ = false;
  std::string lost_;
  std::size_t queued_ = 0;  // bytes in out_.q and err_.q
  std::atomic<bool> paused_{false};  // SIGSTOPped for backpressure
};

class RemoteProcess : public sandbox::Process {
 public:
  explicit RemoteProcess(std::shared_ptr<StreamBridge> b) : b_(std::move(b)) {}
  ~RemoteProcess() override { b_->close(); }

  asio::awaitable<sandbox::ExitStatus> wait() override {
    sandbox::ExitStatus st = co_await b_->wait();
    co_return st;
  }
  void kill_tree() override { b_->send_signal(9, /*group=*/true); }
  Status signal(int signo) override {
    if (!b_->conn()->open()) {
      return fail(Code::kUnavailable, "signal: the runner of this process is not connected");
    }
    b_->send_signal(signo, /*group=*/false);
    return {};
  }
  std::optional<Status> resize_pty(std::uint16_t cols, std::uint16_t rows) override {
    if (!b_->pty()) return fail(Code::kInvalid, "resize: not a pty process");
    b_->resize(cols, rows);
    return Status{};
  }

 private:
  std::shared_ptr<StreamBridge> b_;
};

Status make_pipe(UniqueFd& r, UniqueFd& w) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return fail_errno(errno, "pipe2");
  r = UniqueFd(fds[0]);
  w = UniqueFd(fds[1]);
  return {};
}

}  // namespace

asio::awaitable<Result<RemoteLaunched>> launch_remote(std::shared_ptr<RunnerConn> conn,
                                                      RemoteLaunchSpec spec) {
  if (!conn->streams()) {
    co_return fail(Code::kNotSupported,
                   "processes and streaming exec on runner " + conn->identity().user +
                       ": it speaks runner protocol version " +
                       std::to_string(conn->identity().version) +
                       ", they need agentbox-runner's version 2 (xbot's runner drops stderr, "
                       "ignores dir and pty input)");
  }
  if (spec.argv.empty()) co_return fail(Code::kInvalid, "process: no command");
  auto ex = co_await asio::this_coro::executor;
  const bool pty = spec.pty.has_value();
  sandbox::Launched out;
  // The daemon's ends go into `out`, the bridge's ends into the bridge.
  UniqueFd b_out, b_err, b_in;
  if (pty) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      co_return fail_errno(errno, "socketpair");
    }
    out.pty_master = UniqueFd(sv[0]);
    b_out = UniqueFd(sv[1]);
    b_in = UniqueFd(::fcntl(b_out.get(), F_DUPFD_CLOEXEC, 3));
    if (!b_in) co_return fail_errno(errno, "dup");
  }
  UniqueFd d_out, d_err, d_in;
  if (!pty) {
    if (auto s = make_pipe(d_out, b_out); !s) co_return std::unexpected(s.error());
    if (auto s = make_pipe(d_err, b_err); !s) co_return std::unexpected(s.error());
    if (spec.with_stdin) {
      if (auto s = make_pipe(b_in, d_in); !s) co_return std::unexpected(s.error());
    }
  }
  const std::string id = "ab_" + proto::generate_id().substr(4);
  auto bridge = std::make_shared<StreamBridge>(ex, conn, id, pty);
  if (auto s = bridge->assign(b_out.get(), b_err.get(), b_in.get()); !s) {
    co_return std::unexpected(s.error());
  }
  (void)b_out.release();
  (void)b_err.release();
  (void)b_in.release();
  std::weak_ptr<StreamBridge> weak = bridge;
  RunnerConn::PushFn fn = [weak, ex](Result<RunnerReply> r) {
    asio::post(ex, [weak, r = std::move(r)]() mutable {
      if (auto b = weak.lock()) b->on_push(std::move(r));
    });
  };
  if (!conn->watch(id, std::move(fn))) {
    co_return fail(Code::kUnavailable,
                   "process: runner " + conn->identity().user + " is not connected");
  }
  std::string type;
  Json body;
  std::vector<std::string> args(spec.argv.begin() + 1, spec.argv.end());
  if (pty) {
    proto::PtyCreate c{id, spec.argv[0], args, spec.env, spec.dir, spec.pty->cols, spec.pty->rows};
    type = proto::type::kPtyCreate;
    body = proto::to_json(c);
  } else {
    proto::StdioStart s{id, spec.argv[0], args, spec.env, spec.dir};
    s.stderr_pipe = true;
    type = proto::type::kStdioStart;
    body = proto::to_json(s);
  }
  proto::add_box_limits(body, spec.limits);
  auto reply = co_await conn->async_call(type, std::move(body), kStartTimeout);
  if (!reply) {
    conn->unwatch(id);
    co_return std::unexpected(reply.error());
  }
  auto ok = proto::body_as<proto::StreamRequest>(*reply);
  if (reply->type != proto::type::kOk || !ok) {
    conn->unwatch(id);
    co_return fail(Code::kInternal, type + ": runner answered '" + reply->type + "'");
  }
  auto proc = std::make_unique<RemoteProcess>(bridge);
  proc->stdout_fd = std::move(d_out);
  proc->stderr_fd = std::move(d_err);
  proc->stdin_fd = std::move(d_in);
  bridge->started();
  out.pid = ok->pid;
  out.proc = std::move(proc);
  RemoteLaunched r;
  r.launched = std::move(out);
  r.state = bridge;
  co_return r;
}

}  // namespace agentbox::remote
