#pragma once
// The runner hub: agentboxd's side of xbot's remote runner protocol (shared/PROTOCOLS.md part 1).
// Runners dial GET /ws/{user} (server/runners.cc accepts the WebSocket and registers it here);
// the `remote` backend (remote/remote_backend.h) sends its requests through the hub to the runner
// of a user and waits for the reply with the same id.
//
// - One registered connection per runner user. A new registration of a user replaces the old
//   connection (which is closed), and a closing connection deregisters only itself: xbot's server
//   deletes by name and so drops a runner that reconnected before its old socket died
//   (PROTOCOLS.md 1.6).
// - Replies are matched by id and may come in any order. A connection that closes (FIN, reset,
//   no pong within the ping window, a garbage frame) fails every request in flight on it at once
//   with EUNAVAILABLE.
// - Requests wait for their reply with a deadline (ETIMEDOUT past it); a reply that comes later
//   has an unknown id and is dropped, as xbot's server does.
//
// Threading: the hub and its connections are thread-safe. Frames are read and written on the
// io_context (WsSession); call() blocks its caller (pool threads only), async_call() is a
// coroutine on the io_context.

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "runner/protocol.h"

namespace agentbox::remote {

// A runner user the daemon accepts (--runner-token USER=TOKEN, config `runners:`).
struct RunnerUser {
  std::string user;
  std::string token;
  std::string tenant = "default";  // whose sessions its runner may serve
};

namespace proto = runner::proto;

// A reply of the runner (its type "exec_result", "ok", ..., and body). A reply of type "error"
// is turned into an Error by the hub and never reaches a caller.
using RunnerReply = proto::Envelope;

// What a registered runner told us in its `register` frame.
struct RunnerIdentity {
  std::string user;
  std::string workspace;
  std::string shell;
  int version = 0;  // agentbox's extension as negotiated (proto::negotiate); 0: xbot's plain form
  // What the runner said it enforces (register's `enforces`, proto::enforce:: names); empty for
  // xbot's runner, which enforces none of a session's limits.
  std::vector<std::string> enforces;
  bool does_enforce(std::string_view what) const {
    for (const auto& e : enforces) {
      if (e == what) return true;
    }
    return false;
  }
};

struct RunnerStats {
  std::uint64_t connections = 0;  // registered now
  std::uint64_t requests = 0;     // sent to runners, total
  std::uint64_t failed = 0;       // ended with an error (runner's, timeout, drop)
  std::uint64_t bytes_out = 0;    // frames to runners
  std::uint64_t bytes_in = 0;     // frames from runners
};

class RunnerHub;
class RunnerConn;

// A request whose answer is several frames with its id (version 1's chunked files,
// docs/runner-protocol.md): the caller sends more frames with the same id and takes the
// runner's frames one by one. Pool threads only (next() blocks). Destroying an unfinished one
// tells the runner (an `error` frame of its id), so the runner frees what it holds.
class RunnerTransfer {
 public:
  RunnerTransfer(std::shared_ptr<RunnerConn> conn, std::string id, std::string op);
  ~RunnerTransfer();
  RunnerTransfer(const RunnerTransfer&) = delete;
  RunnerTransfer& operator=(const RunnerTransfer&) = delete;

  const std::string& id() const { return id_; }
  // Sends one frame of this transfer (file_chunk, file_end, ack, ...).
  void send(std::string_view type, proto::Json body);
  // One chunk of the file: a file_chunk text frame (version 1, proto::chunk_frame: no Json copy
  // of the data), or a binary frame (version 3, proto::binary_chunk).
  void send_chunk(std::int64_t offset, std::string_view data);
  // The unacknowledged bytes this transfer may have in flight, and its chunk size.
  std::int64_t window() const;
  std::int64_t chunk_size() const;
  // The runner's next frame for this transfer. The runner's `error` frame becomes its Error;
  // EUNAVAILABLE when the connection goes; ETIMEDOUT when nothing comes within `idle`.
  Result<RunnerReply> next(std::chrono::milliseconds idle);
  // The transfer got its last frame (ok, file_end, file_content): no abort on destruction.
  void finish();

 private:
  friend class RunnerConn;
  void push(Result<RunnerReply> r);  // from the connection (io_context)
  std::shared_ptr<RunnerConn> conn_;
  std::string id_;
  std::string op_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Result<RunnerReply>> frames_;
  bool done_ = false;
};

// One registered runner connection. Made by RunnerHub::attach; lives as long as someone holds it.
class RunnerConn : public std::enable_shared_from_this<RunnerConn> {
 public:
  // Queues one frame (text, or binary for version 3's chunks); any thread.
  using Send = std::function<void(std::string frame, bool binary)>;
  using Close = std::function<void(std::string reason)>;   // close the socket; any thread
  using Callback = std::function<void(Result<RunnerReply>)>;

  RunnerConn(RunnerHub* hub, RunnerIdentity id, std::string tenant, Send send, Close close);

  const RunnerIdentity& identity() const { return id_; }
  const std::string& tenant() const { return tenant_; }
  std::chrono::system_clock::time_point connected_at() const { return connected_at_; }
  std::chrono::system_clock::time_point last_seen() const;
  bool open() const;

  // Sends request `type` with `body` and calls `cb` exactly once: with the reply, the runner's
  // error, EUNAVAILABLE when the connection goes, or ETIMEDOUT after `timeout`. Any thread; cb
  // runs on the io_context or on the calling thread (a closed connection).
  void request(std::string type, proto::Json body, std::chrono::milliseconds timeout,
               Callback cb);
  // request() and wait (pool threads only).
  Result<RunnerReply> call(std::string type, proto::Json body,
                           std::chrono::milliseconds timeout);
  // request() as a coroutine on `ex` (the io_context). Cancelling the awaiting coroutine gives
  // up the wait at once (the runner's reply, if one comes, is dropped); the result is then
  // ETIMEDOUT "cancelled".
  boost::asio::awaitable<Result<RunnerReply>> async_call(std::string type, proto::Json body,
                                                         std::chrono::milliseconds timeout);
  // Sends a frame that gets no reply (stdio_write: no id).
  void notify(std::string type, proto::Json body);
  // Version 1 (chunked files) is in force on this connection: the runner's register said 1 or
  // more and so did our register_ok.
  bool chunked() const { return id_.version >= proto::kChunkedVersion; }
  // Version 2 (process streams: stderr, eof, stdio_signal, pids) is in force on this connection.
  bool streams() const { return id_.version >= proto::kStreamsVersion; }
  // Version 3 (binary chunks, unknown upload size, exact error codes) is in force.
  bool binary() const { return id_.version >= proto::kBinaryVersion; }
  // Version 2's process streams (remote/remote_processes.h): the pushes of `stream_id`
  // (stdio_data/exit, pty_data/exit) go to `fn`, on the io_context, in order; when the
  // connection goes, `fn` gets EUNAVAILABLE once. false (and no call) when it is closed already.
  using PushFn = std::function<void(Result<RunnerReply>)>;
  bool watch(const std::string& stream_id, PushFn fn);
  void unwatch(const std::string& stream_id);

  // Sends request `type` and returns the transfer its frames belong to (EUNAVAILABLE when the
  // connection is closed).
  Result<std::shared_ptr<RunnerTransfer>> start_transfer(std::string type, proto::Json body);

  // From the socket (io_context): one text frame. Returns false when the frame is garbage (not a
  // JSON object with a string "type"): the caller closes the connection.
  bool on_frame(const std::string& frame);
  // From the socket: one binary frame (version 3's chunks). false when binary frames are not in
  // force on this connection or the frame is not a chunk: the caller closes the connection.
  bool on_binary(std::string frame);
  // The socket is gone: every request in flight fails with EUNAVAILABLE. Idempotent.
  void on_closed(const std::string& why);
  // Closes the socket (and then on_closed runs).
  void close(const std::string& reason);

 private:
  struct Pending {
    Callback cb;
    std::chrono::steady_clock::time_point deadline;
    std::string type;
  };
  void expire();  // fails the pending requests past their deadline
  void end_transfer(const std::string& id);
  void send_frame(std::string frame, bool binary = false);
  friend class RunnerHub;
  friend class RunnerTransfer;

  RunnerHub* hub_;
  RunnerIdentity id_;
  std::string tenant_;
  Send send_;
  Close close_;
  std::chrono::system_clock::time_point connected_at_ = std::chrono::system_clock::now();
  std::atomic<std::int64_t> last_seen_ms_{0};
  mutable std::mutex mu_;
  bool closed_ = false;
  std::string closed_why_;
  std::map<std::string, Pending> pending_;  // by request id
  std::map<std::string, std::weak_ptr<RunnerTransfer>> transfers_;  // by request id
  std::map<std::string, PushFn> watchers_;  // by stream id
};

class RunnerHub {
 public:
  // `ex`: the io_context's executor (deadline timer).
  RunnerHub(boost::asio::any_io_executor ex, std::vector<RunnerUser> users);
  ~RunnerHub();

  // The configured user whose name is `user` and token `token` (constant-time compare);
  // nullopt otherwise.
  std::optional<RunnerUser> authenticate(const std::string& user, const std::string& token) const;
  bool knows(const std::string& user) const;
  // The tenant of a configured user ("" if none).
  std::string tenant_of(const std::string& user) const;

  // Registers a connection that passed the handshake; replaces (and closes) the user's previous
  // one. `on_registered` hooks (skill sync) run after.
  void attach(const std::shared_ptr<RunnerConn>& conn);
  // Deregisters `conn` if it is still the registered one of its user; never another one.
  void detach(const RunnerConn* conn);
  // The registered connection of `user`, or null.
  std::shared_ptr<RunnerConn> find(const std::string& user) const;

  struct Listed {
    std::string user;
    std::string tenant;
    bool connected = false;
    RunnerIdentity identity;  // the last registration (empty if never)
    std::chrono::system_clock::time_point connected_at{};
    std::chrono::system_clock::time_point last_seen{};
  };
  // Every configured user (tenant "" = all), connected or not, sorted by user.
  std::vector<Listed> list(const std::string& tenant) const;

  // Called (on the io_context) after every successful registration.
  void on_registered(std::function<void(std::shared_ptr<RunnerConn>)> fn);

  RunnerStats stats() const;
  void count_request() { requests_.fetch_add(1, std::memory_order_relaxed); }
  void count_failed() { failed_.fetch_add(1, std::memory_order_relaxed); }
  void count_out(std::uint64_t n) { bytes_out_.fetch_add(n, std::memory_order_relaxed); }
  void count_in(std::uint64_t n) { bytes_in_.fetch_add(n, std::memory_order_relaxed); }
  boost::asio::any_io_executor executor() const { return ex_; }
  // Transfers alive (a streamed download's producer thread holds one past its request): the
  // destructor waits for them, so none touches the hub after it.
  void transfer_started();
  void transfer_ended();

 private:
  struct Timer;
  void arm(std::shared_ptr<Timer> timer);
  boost::asio::any_io_executor ex_;
  std::vector<RunnerUser> users_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<RunnerConn>> conns_;  // by user
  std::map<std::string, RunnerIdentity> last_identity_;
  std::map<std::string, std::pair<std::chrono::system_clock::time_point,
                                  std::chrono::system_clock::time_point>>
      last_times_;  // user -> connected_at, last_seen of the last connection
  std::vector<std::function<void(std::shared_ptr<RunnerConn>)>> registered_hooks_;
  std::atomic<std::uint64_t> requests_{0}, failed_{0}, bytes_out_{0}, bytes_in_{0};
  std::shared_ptr<std::atomic<bool>> stopped_;
  std::mutex transfers_mu_;
  std::condition_variable transfers_cv_;
  int live_transfers_ = 0;  // under transfers_mu_
};


}  // namespace agentbox::remote
