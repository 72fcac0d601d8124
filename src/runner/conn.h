#pragma once
// agentbox-runner's connection to the server (runner.cc drives it): one Conn per WebSocket
// session answers xbot's requests (conn.cc: exec, background tasks, file operations), runs
// process streams and terminals (conn_streams.cc) and moves files in chunks (conn_files.cc).
// Internal to the runner.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "common/log.h"
#include "common/log_errors.h"
#include "runner/box_limits.h"
#include "runner/download.h"
#include "runner/protocol.h"
#include "runner/spawn.h"
#include "runner/url.h"
#include "runner/workspace_fs.h"

namespace agentbox::runner::detail {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace ws = boost::beast::websocket;
namespace ssl = boost::asio::ssl;
using namespace std::chrono_literals;
namespace p = proto;

constexpr std::size_t kPushLimit = 4 << 20;       // outbox bytes before pushes wait
constexpr std::size_t kExecOutputCap = 32 << 20;  // per stream of one exec
constexpr std::size_t kBgOutputCap = 16 << 20;    // per stream of one bg task
constexpr std::size_t kMaxMessage = 768u << 20;   // a 500 MB file as plain base64 fits
constexpr std::size_t kStreamRead = 32 << 10;     // xbot's push size
// Version 2: how long an exited stream child's buffered output may take before its exit push.
constexpr std::chrono::milliseconds kExitDrain{500};
constexpr std::chrono::seconds kExitDrainMax{5};

inline std::string first_shell() {
  for (const char* s : {"/bin/bash", "/usr/bin/bash", "/bin/sh"}) {
    if (access(s, X_OK) == 0) return s;
  }
  return "/bin/sh";
}

// The outbox: frames for the one writer on the I/O thread.
class Outbox {
 public:
  explicit Outbox(asio::any_io_executor ex)
      : ex_(std::move(ex)), wake_(std::make_shared<asio::steady_timer>(ex_)) {
    wake_->expires_at(asio::steady_timer::time_point::max());
  }
  // A reply: queued at once. false when the connection is gone.
  bool send(std::string f) { return put(std::move(f), false); }
  // A binary frame (version 3's file chunks), queued at once.
  bool send_binary(std::string f) { return put(std::move(f), false, true); }
  // A push: waits while the outbox is over kPushLimit (a slow server slows the child).
  bool push(std::string f) { return put(std::move(f), true); }
  void close() {
    {
      std::lock_guard l(mu_);
      closed_ = true;
    }
    cv_.notify_all();
    kick();
  }
  bool closed() {
    std::lock_guard l(mu_);
    return closed_;
  }
  // I/O thread only. `binary`: the frame is a binary one.
  std::optional<std::string> pop(bool* binary = nullptr) {
    std::lock_guard l(mu_);
    if (q_.empty()) return std::nullopt;
    std::string f = std::move(q_.front());
    q_.pop_front();
    if (binary) *binary = binary_.count(seq_out_) > 0;
    binary_.erase(seq_out_++);
    bytes_ -= f.size();
    cv_.notify_all();
    return f;
  }
  asio::steady_timer& wake() { return *wake_; }

 private:
  bool put(std::string f, bool wait, bool binary = false) {
    {
      std::unique_lock l(mu_);
      if (wait) cv_.wait(l, [&] { return closed_ || bytes_ < kPushLimit; });
      if (closed_) return false;
      bytes_ += f.size();
      if (binary) binary_.insert(seq_in_);
      ++seq_in_;
      q_.push_back(std::move(f));
    }
    kick();
    return true;
  }
  // The posted handler owns the timer: it may run after this Outbox (and its Conn) are gone.
  void kick() {
    asio::post(ex_, [w = wake_] { w->cancel(); });
  }

  asio::any_io_executor ex_;
  std::shared_ptr<asio::steady_timer> wake_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> q_;
  std::set<std::uint64_t> binary_;  // the sequence numbers of the binary frames in q_
  std::uint64_t seq_in_ = 0, seq_out_ = 0;
  std::size_t bytes_ = 0;
  bool closed_ = false;
};

// Input for a child (stdio stdin, pty master), written in order by its own thread.
class InputQueue {
 public:
  InputQueue(int fd, bool close_fd) : fd_(fd), close_fd_(close_fd) {
    thread_ = std::thread([this] { loop(); });
  }
  ~InputQueue() {
    finish();
    thread_.join();
  }
  void add(std::string data) {
    {
      std::lock_guard l(mu_);
      if (done_) return;
      q_.push_back(std::move(data));
    }
    cv_.notify_all();
  }
  // No more input: the fd is closed (if owned) once what is queued is written.
  void finish() {
    {
      std::lock_guard l(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  void loop() {
    for (;;) {
      std::string d;
      {
        std::unique_lock l(mu_);
        cv_.wait(l, [&] { return done_ || !q_.empty(); });
        if (q_.empty()) break;
        d = std::move(q_.front());
        q_.pop_front();
      }
      std::string_view v = d;
      while (!v.empty()) {
        ssize_t n = ::write(fd_, v.data(), v.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        v.remove_prefix(static_cast<std::size_t>(n));
      }
    }
    if (close_fd_) ::close(fd_);
  }
  int fd_;
  bool close_fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> q_;
  bool done_ = false;
  std::thread thread_;
};

struct BgTask {
  std::mutex mu;
  pid_t pid = -1;
  std::string status = "running";
  int exit_code = 0;
  std::string out, err;
};

struct Stream {
  bool pty = false;
  pid_t pid = -1;
  std::string box;  // its box's cgroup (box_limits.h), released once it is reaped; "" = none
  UniqueFd master;  // pty only
  std::unique_ptr<InputQueue> input;
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  int readers = 0;      // output readers still reading (guarded by mu)
  int in_hand = 0;      // chunks read and not yet pushed (guarded by mu): the exit waits
                        // for them, as it waits for output still in the pipe
  bool exited = false;  // the exit push is out: readers push nothing more (guarded by mu)
  bool reaped = false;  // the child is (being) reaped: its pid may be reused (guarded by mu)
  // Dups of the output read ends, to see whether output is still unread (FIONREAD).
  std::vector<UniqueFd> probes;
  bool unread_output() const {
    for (const UniqueFd& fd : probes) {
      int n = 0;
      if (::ioctl(fd.get(), FIONREAD, &n) == 0 && n > 0) return true;
    }
    return false;
  }
  bool wait_finished(std::chrono::milliseconds d) {
    std::unique_lock l(mu);
    return cv.wait_for(l, d, [&] { return finished; });
  }
};

// A chunked download in flight (version 1): the runner sends, the server acks.
struct Download {
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t acked = 0;
  bool cancelled = false;
};

// A chunked upload in flight (version 1); I/O thread only.
struct Upload {
  WorkspaceFs::Writer writer;
  std::int64_t size = 0;  // p::kSizeUnknown (version 3): file_end says it
};

// One connection's state. Request threads hold it by shared_ptr; shutdown() on disconnect.
class Conn : public std::enable_shared_from_this<Conn> {
 public:
  Conn(asio::any_io_executor ex, const WorkspaceFs& fs, ssl::context& tls,
       std::shared_ptr<BoxCgroups> cgroups)
      : outbox(std::move(ex)), fs_(fs), tls_(tls), cgroups_(std::move(cgroups)) {}

  Outbox outbox;

  // The version register_ok put in force: 1 chunked files, 2 also process streams, 3 also
  // binary chunks and exact error codes.
  void set_version(int v) {
    version_ = v;
    streams_v2_ = v >= p::kStreamsVersion;
  }

  void shutdown();

  // On the I/O thread, for every frame.
  void dispatch(p::Envelope e);

 private:
  void reply(const std::string& id, std::string_view type, std::optional<p::Json> body) {
    outbox.send(p::frame(id, type, std::move(body)));
  }
  void reply_error(const std::string& id, const Error& err);
  void reply_error(const std::string& id, std::string_view code, std::string msg) {
    outbox.send(p::error_frame(id, code, msg));
  }

  // The box's cgroup a command of request `e` joins (its `box` and `limits`, box_limits.h):
  // the cgroup.procs fds for SpawnSpec::join_fds, `box` set when release() is owed. nullopt:
  // refused (the error reply is sent).
  std::optional<std::vector<UniqueFd>> join_box(const p::Envelope& e, std::string& box);
  static std::vector<int> raw(const std::vector<UniqueFd>& fds) {
    std::vector<int> out;
    for (const UniqueFd& fd : fds) out.push_back(fd.get());
    return out;
  }

  template <typename T>
  std::optional<T> body(const p::Envelope& e) {
    auto b = p::body_as<T>(e);
    if (!b) {
      reply_error(e.id, p::code::kInvalid, b.error().message);
      return std::nullopt;
    }
    return std::move(*b);
  }

  void handle(p::Envelope e);

  // The child's cwd: the workspace, or `dir` beneath it. Unlike xbot, a bad dir is an error.
  Result<UniqueFd> cwd_for(const std::string& dir);

  bool track_exec(pid_t pid) {
    std::lock_guard l(mu_);
    if (closed_) return false;
    execs_.insert(pid);
    return true;
  }
  void untrack_exec(pid_t pid) {
    std::lock_guard l(mu_);
    execs_.erase(pid);
  }

  void exec(const p::Envelope& e);

  void bg_exec(const p::Envelope& e);

  void bg_other(const p::Envelope& e);

  void stream_start(const p::Envelope& e, bool pty);

  // Pushes one of the child's outputs until EOF (a pty: EIO once every slave holder is gone);
  // nothing after the exit push.
  void forward(std::shared_ptr<Stream> st, std::string id, int fd, bool is_stderr);

  // Waits for the child, then for its output to be pushed, then pushes its exit. xbot's
  // runner waits for EOF first, so a background child that keeps the pipe holds the exit; with
  // version 2 the output of an exited leader is drained for at most kExitDrain and the exit
  // goes (with the signal that ended it).
  void report_exit(std::shared_ptr<Stream> st, std::string id, bool v2);

  // stdio_signal (version 2): `signal` to a stream's child, or to its process group.
  void stream_signal(const p::Envelope& e);

  std::shared_ptr<Stream> find_stream(const std::string& id) {
    std::lock_guard l(mu_);
    auto it = streams_.find(id);
    return it == streams_.end() ? nullptr : it->second;
  }

  void stream_close(const p::Envelope& e);

  // ---- version 1: chunked files (docs/runner-protocol.md) ----

  // A read_file of a file over kChunkThreshold as file_begin / file_chunk... / file_end, at most
  // kWindowBytes ahead of the server's acks. false: not big (the caller sends file_content).
  bool send_chunked(const std::string& id, const std::string& path);

  void transfer_frame(const p::Envelope& e);

  // Upload `id` in progress, or null (and the error is sent).
  Upload* upload_of(const std::string& id) {
    auto it = uploads_.find(id);
    if (it != uploads_.end()) return &it->second;
    reply_error(id, p::code::kInvalid, "no transfer " + id + " in progress");
    return nullptr;
  }

  // Ends upload `id` with an error: the temp file goes; the target is untouched.
  void abort_upload(const std::string& id, std::string_view code, std::string msg) {
    uploads_.erase(id);
    reply_error(id, code, std::move(msg));
  }

  // One chunk of an upload (a file_chunk frame, or a binary one of version 3), on the I/O
  // thread: in order, within the announced size (or kMaxFileSize when it is not known yet).
  void upload_chunk(const std::string& id, std::int64_t offset, std::string_view data);

 public:
  // On the I/O thread: a binary frame. Only version 3's chunks of an upload; anything else is
  // answered (a chunk of an unknown transfer) or dropped (not a chunk: there is no id to name).
  void dispatch_binary(std::string_view frame);

 private:
  void fire_and_forget(const p::Envelope& e);

  const WorkspaceFs& fs_;
  ssl::context& tls_;  // download_file's https (shared: OpenSSL contexts are thread-safe to use)
  std::shared_ptr<BoxCgroups> cgroups_;  // the boxes' cgroups (one per runner process)
  std::atomic<int> version_{0};
  std::atomic<bool> streams_v2_{false};    // version 2: process streams
  std::map<std::string, Upload> uploads_;  // I/O thread only
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Download>> downloads_;
  bool closed_ = false;
  std::set<pid_t> execs_;
  std::map<std::string, std::shared_ptr<BgTask>> tasks_;
  std::map<std::string, std::shared_ptr<Stream>> streams_;
};

}  // namespace agentbox::runner::detail
