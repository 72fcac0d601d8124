#include "remote/runner_hub.h"

#include <openssl/crypto.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <future>

#include "common/log.h"

namespace agentbox::remote {

namespace asio = boost::asio;

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
constexpr std::chrono::milliseconds kSweep{100};  // how often deadlines are checked

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---- RunnerConn --------------------------------------------------------------------------------

RunnerConn::RunnerConn(RunnerHub* hub, RunnerIdentity id, std::string tenant, Send send,
                       Close close)
    : hub_(hub),
      id_(std::move(id)),
      tenant_(std::move(tenant)),
      send_(std::move(send)),
      close_(std::move(close)) {
  last_seen_ms_.store(now_ms());
}

std::chrono::system_clock::time_point RunnerConn::last_seen() const {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(last_seen_ms_.load()));
}

bool RunnerConn::open() const {
  std::lock_guard lk(mu_);
  return !closed_;
}

void RunnerConn::request(std::string type, proto::Json body, std::chrono::milliseconds timeout,
                         Callback cb) {
  hub_->count_request();
  std::string id = proto::generate_id();
  std::string frame = proto::encode(proto::Envelope{id, type, id_.user, std::move(body)});
  {
    std::unique_lock lk(mu_);
    if (closed_) {
      std::string why = closed_why_;
      lk.unlock();
      hub_->count_failed();
      cb(fail(Code::kUnavailable, type + ": runner " + id_.user + " is not connected (" + why + ")"));
      return;
    }
    pending_.emplace(id, Pending{std::move(cb), std::chrono::steady_clock::now() + timeout,
                                 std::move(type)});
  }
  hub_->count_out(frame.size());
  send_(std::move(frame), false);
}

Result<RunnerReply> RunnerConn::call(std::string type, proto::Json body,
                                     std::chrono::milliseconds timeout) {
  auto promise = std::make_shared<std::promise<Result<RunnerReply>>>();
  auto fut = promise->get_future();
  request(std::move(type), std::move(body), timeout,
          [promise](Result<RunnerReply> r) { promise->set_value(std::move(r)); });
  return fut.get();  // the hub's sweep guarantees an answer by the deadline
}

namespace {
struct AsyncWait {
  explicit AsyncWait(asio::any_io_executor ex) : timer(ex) {}
  asio::steady_timer timer;
  std::optional<Result<RunnerReply>> result;
};
}  // namespace

asio::awaitable<Result<RunnerReply>> RunnerConn::async_call(std::string type, proto::Json body,
                                                            std::chrono::milliseconds timeout) {
  auto ex = co_await asio::this_coro::executor;
  auto wait = std::make_shared<AsyncWait>(ex);
  wait->timer.expires_at(asio::steady_timer::time_point::max());
  Callback cb = [wait](Result<RunnerReply> r) {
    asio::post(wait->timer.get_executor(), [wait, r = std::move(r)]() mutable {
      wait->result = std::move(r);
      wait->timer.cancel();
    });
  };
  request(std::move(type), std::move(body), timeout, std::move(cb));
  while (!wait->result) {
    auto [ec] = co_await wait->timer.async_wait(kTuple);
    if (wait->result) break;
    auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none) {
      co_return fail(Code::kTimedOut, "cancelled");
    }
    (void)ec;
  }
  co_return std::move(*wait->result);
}

void RunnerConn::notify(std::string type, proto::Json body) {
  std::string frame = proto::frame("", type, std::move(body));
  hub_->count_out(frame.size());
  send_(std::move(frame), false);
}

void RunnerConn::send_frame(std::string frame, bool binary) {
  hub_->count_out(frame.size());
  send_(std::move(frame), binary);
}

Result<std::shared_ptr<RunnerTransfer>> RunnerConn::start_transfer(std::string type,
                                                                   proto::Json body) {
  hub_->count_request();
  std::string id = proto::generate_id();
  auto t = std::make_shared<RunnerTransfer>(shared_from_this(), id, type);
  std::string frame = proto::encode(proto::Envelope{id, type, id_.user, std::move(body)});
  {
    std::unique_lock lk(mu_);
    if (closed_) {
      std::string why = closed_why_;
      lk.unlock();
      t->finish();
      hub_->count_failed();
      return fail(Code::kUnavailable,
                  type + ": runner " + id_.user + " is not connected (" + why + ")");
    }
    transfers_[id] = t;
  }
  send_frame(std::move(frame));
  return t;
}

bool RunnerConn::watch(const std::string& stream_id, PushFn fn) {
  std::lock_guard lk(mu_);
  if (closed_) return false;
  watchers_[stream_id] = std::move(fn);
  return true;
}

void RunnerConn::unwatch(const std::string& stream_id) {
  std::lock_guard lk(mu_);
  watchers_.erase(stream_id);
}

void RunnerConn::end_transfer(const std::string& id) {
  std::lock_guard lk(mu_);
  transfers_.erase(id);
}

bool RunnerConn::on_frame(const std::string& frame) {
  last_seen_ms_.store(now_ms());
  hub_->count_in(frame.size());
  // xbot's envelope, or seed 003's flat form (fields beside id and type).
  auto env = proto::decode_flat_or_envelope(frame);
  if (!env) return false;
  // Pushes are routed by type before the id (as xbot's server does), then by their stream id
  // to the watcher of a stream (remote_processes.cc); a push of no watched stream is dropped.
  if (proto::is_push(env->type)) {
    std::string stream;
    if (env->body && env->body->is_object()) {
      auto it = env->body->find("stream_id");
      if (it != env->body->end() && it->is_string()) stream = it->get<std::string>();
    }
    PushFn fn;
    {
      std::lock_guard lk(mu_);
      if (auto w = watchers_.find(stream); w != watchers_.end()) fn = w->second;
    }
    if (fn) fn(std::move(*env));
    return true;
  }
  if (env->id.empty()) {
    spdlog::debug("runner {}: a {} frame without an id dropped", id_.user, env->type);
    return true;
  }
  Callback cb;
  std::string op;
  {
    std::unique_lock lk(mu_);
    if (auto tt = transfers_.find(env->id); tt != transfers_.end()) {
      std::shared_ptr<RunnerTransfer> t = tt->second.lock();
      lk.unlock();
      if (!t) return true;
      if (env->type == proto::type::kError) {
        proto::ErrorBody eb;
        (void)proto::from_json(env->body, eb);
        hub_->count_failed();
        t->push(std::unexpected(Error::make(
            proto::to_code(eb.code, eb.message),
            t->op_ + ": runner: " + eb.message + (eb.code.empty() ? "" : " (" + eb.code + ")"))));
      } else {
        t->push(std::move(*env));
      }
      return true;
    }
    auto it = pending_.find(env->id);
    if (it == pending_.end()) {
      spdlog::debug("runner {}: reply to unknown id {} dropped", id_.user, env->id);
      return true;
    }
    cb = std::move(it->second.cb);
    op = std::move(it->second.type);
    pending_.erase(it);
  }
  if (env->type == proto::type::kError) {
    proto::ErrorBody eb;
    (void)proto::from_json(env->body, eb);
    hub_->count_failed();
    const std::string what =
        op + ": runner: " + eb.message + (eb.code.empty() ? "" : " (" + eb.code + ")");
    cb(std::unexpected(Error::make(proto::to_code(eb.code, eb.message), what)));
    return true;
  }
  cb(std::move(*env));
  return true;
}

bool RunnerConn::on_binary(std::string frame) {
  last_seen_ms_.store(now_ms());
  hub_->count_in(frame.size());
  if (!binary()) return false;
  auto c = proto::decode_binary_chunk(frame);
  if (!c) return false;
  std::shared_ptr<RunnerTransfer> t;
  std::string id(c->id);
  {
    std::lock_guard lk(mu_);
    if (auto tt = transfers_.find(id); tt != transfers_.end()) t = tt->second.lock();
  }
  if (!t) {
    spdlog::debug("runner {}: a chunk of unknown transfer {} dropped", id_.user, id);
    return true;
  }
  // The bytes stay in the frame's string: only the header goes (a memmove, no allocation).
  proto::Json body = proto::Json::object();
  body["offset"] = c->offset;
  const std::size_t header = frame.size() - c->data.size();
  frame.erase(0, header);
  RunnerReply env{id, std::string(proto::type::kFileChunk), "", std::move(body), std::move(frame)};
  t->push(std::move(env));
  return true;
}

void RunnerConn::on_closed(const std::string& why) {
  std::map<std::string, Pending> failed;
  std::map<std::string, std::weak_ptr<RunnerTransfer>> transfers;
  std::map<std::string, PushFn> watchers;
  {
    std::lock_guard lk(mu_);
    if (closed_) return;
    closed_ = true;
    closed_why_ = why;
    failed.swap(pending_);
    transfers.swap(transfers_);
    watchers.swap(watchers_);
  }
  for (auto& [id, fn] : watchers) {
    fn(fail(Code::kUnavailable, "runner " + id_.user + " disconnected (" + why + ")"));
  }
  for (auto& [id, w] : transfers) {
    if (auto t = w.lock()) {
      hub_->count_failed();
      t->push(fail(Code::kUnavailable, t->op_ + ": runner " + id_.user +
                                           " disconnected during the transfer (" + why + ")"));
    }
  }
  for (auto& [id, p] : failed) {
    hub_->count_failed();
    p.cb(fail(Code::kUnavailable,
              p.type + ": runner " + id_.user + " disconnected before replying (" + why + ")"));
  }
}

void RunnerConn::close(const std::string& reason) { close_(reason); }

void RunnerConn::expire() {
  std::vector<Pending> late;
  auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lk(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.deadline <= now) {
        late.push_back(std::move(it->second));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Pending& p : late) {
    hub_->count_failed();
    p.cb(fail(Code::kTimedOut, p.type + ": runner " + id_.user + " did not reply in time"));
  }
}

// ---- RunnerTransfer ----------------------------------------------------------------------------

RunnerTransfer::RunnerTransfer(std::shared_ptr<RunnerConn> conn, std::string id, std::string op)
    : conn_(std::move(conn)), id_(std::move(id)), op_(std::move(op)) {
  conn_->hub_->transfer_started();
}

RunnerTransfer::~RunnerTransfer() {
  RunnerHub* hub = conn_->hub_;
  conn_->end_transfer(id_);
  if (!done_ && conn_->open()) {
    // The runner stops sending (a download) or drops its temp file (an upload).
    conn_->send_frame(proto::error_frame(id_, proto::code::kIO, op_ + ": abandoned by the server"));
  }
  conn_.reset();  // (maybe the last reference) before the hub may go
  hub->transfer_ended();
}

void RunnerTransfer::send(std::string_view type, proto::Json body) {
  conn_->send_frame(proto::encode(
      proto::Envelope{id_, std::string(type), conn_->identity().user, std::move(body)}));
}

void RunnerTransfer::send_chunk(std::int64_t offset, std::string_view data) {
  if (conn_->binary()) {
    conn_->send_frame(proto::binary_chunk(id_, offset, data), true);
  } else {
    conn_->send_frame(proto::chunk_frame(id_, conn_->identity().user, offset, data));
  }
}

std::int64_t RunnerTransfer::window() const {
  return conn_->binary() ? proto::kBinaryWindowBytes : proto::kWindowBytes;
}

std::int64_t RunnerTransfer::chunk_size() const {
  return conn_->binary() ? proto::kBinaryChunkSize : proto::kChunkSize;
}

void RunnerTransfer::push(Result<RunnerReply> r) {
  std::lock_guard lk(mu_);
  frames_.push_back(std::move(r));
  cv_.notify_all();
}

Result<RunnerReply> RunnerTransfer::next(std::chrono::milliseconds idle) {
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, idle, [&] { return !frames_.empty(); })) {
    conn_->hub_->count_failed();
    return fail(Code::kTimedOut,
                op_ + ": runner " + conn_->identity().user + " did not send in time");
  }
  Result<RunnerReply> r = std::move(frames_.front());
  frames_.pop_front();
  if (!r) done_ = true;  // the runner ended it (or the connection went): nothing to abort
  return r;
}

void RunnerTransfer::finish() {
  std::lock_guard lk(mu_);
  done_ = true;
}

// ---- RunnerHub ---------------------------------------------------------------------------------

struct RunnerHub::Timer {
  explicit Timer(asio::any_io_executor ex) : t(ex) {}
  asio::steady_timer t;
};

RunnerHub::RunnerHub(asio::any_io_executor ex, std::vector<RunnerUser> users)
    : ex_(ex), users_(std::move(users)), stopped_(std::make_shared<std::atomic<bool>>(false)) {
  if (!users_.empty()) arm(std::make_shared<Timer>(ex_));
}

// The timer belongs to its own wait chain (and so to the io_context), never to the hub: the hub
// may outlive the io_context, and the io_context the hub.
RunnerHub::~RunnerHub() {
  stopped_->store(true);
  // What is still in flight fails now (a download's producer thread wakes and lets go of its
  // transfer), and the hub outlives every transfer.
  std::vector<std::shared_ptr<RunnerConn>> conns;
  {
    std::lock_guard lk(mu_);
    for (auto& [u, c] : conns_) conns.push_back(c);
  }
  for (auto& c : conns) c->on_closed("the daemon is stopping");
  std::unique_lock lk(transfers_mu_);
  if (!transfers_cv_.wait_for(lk, std::chrono::seconds(10), [&] { return live_transfers_ == 0; })) {
    spdlog::warn("runners: {} transfer(s) still running at exit", live_transfers_);
  }
}

void RunnerHub::transfer_started() {
  std::lock_guard lk(transfers_mu_);
  ++live_transfers_;
}

void RunnerHub::transfer_ended() {
  std::lock_guard lk(transfers_mu_);
  if (--live_transfers_ == 0) transfers_cv_.notify_all();
}

void RunnerHub::arm(std::shared_ptr<Timer> timer) {
  timer->t.expires_after(kSweep);
  Timer* raw = timer.get();
  raw->t.async_wait([this, t = std::move(timer), stopped = stopped_](
                        const boost::system::error_code&) mutable {
    if (stopped->load()) return;
    std::vector<std::shared_ptr<RunnerConn>> conns;
    {
      std::lock_guard lk(mu_);
      for (auto& [u, c] : conns_) conns.push_back(c);
    }
    for (auto& c : conns) c->expire();
    arm(std::move(t));
  });
}

std::optional<RunnerUser> RunnerHub::authenticate(const std::string& user,
                                                  const std::string& token) const {
  std::optional<RunnerUser> found;
  for (const RunnerUser& u : users_) {
    // SECURITY: every configured token of the user is compared in constant time.
    bool same = u.token.size() == token.size() &&
                CRYPTO_memcmp(u.token.data(), token.data(), token.size()) == 0;
    if (same && u.user == user && !token.empty()) found = u;
  }
  return found;
}

bool RunnerHub::knows(const std::string& user) const {
  for (const RunnerUser& u : users_) {
    if (u.user == user) return true;
  }
  return false;
}

std::string RunnerHub::tenant_of(const std::string& user) const {
  for (const RunnerUser& u : users_) {
    if (u.user == user) return u.tenant;
  }
  return "";
}

void RunnerHub::attach(const std::shared_ptr<RunnerConn>& conn) {
  std::shared_ptr<RunnerConn> old;
  std::vector<std::function<void(std::shared_ptr<RunnerConn>)>> hooks;
  {
    std::lock_guard lk(mu_);
    auto& slot = conns_[conn->identity().user];
    old = std::move(slot);
    slot = conn;
    last_identity_[conn->identity().user] = conn->identity();
    hooks = registered_hooks_;
  }
  if (old && old.get() != conn.get()) old->close("replaced by a new registration");
  for (auto& h : hooks) h(conn);
}

void RunnerHub::detach(const RunnerConn* conn) {
  std::lock_guard lk(mu_);
  auto it = conns_.find(conn->identity().user);
  // Only the connection being closed: a newer registration of the same user stays (1.6).
  if (it != conns_.end() && it->second.get() == conn) {
    last_times_[it->first] = {conn->connected_at(), conn->last_seen()};
    conns_.erase(it);
  }
}

std::shared_ptr<RunnerConn> RunnerHub::find(const std::string& user) const {
  std::lock_guard lk(mu_);
  auto it = conns_.find(user);
  return it == conns_.end() ? nullptr : it->second;
}

std::vector<RunnerHub::Listed> RunnerHub::list(const std::string& tenant) const {
  std::map<std::string, Listed> out;
  std::lock_guard lk(mu_);
  for (const RunnerUser& u : users_) {
    if (!tenant.empty() && u.tenant != tenant) continue;
    Listed& l = out[u.user];
    l.user = u.user;
    l.tenant = u.tenant;
    if (auto it = last_identity_.find(u.user); it != last_identity_.end()) l.identity = it->second;
    if (auto it = last_times_.find(u.user); it != last_times_.end()) {
      l.connected_at = it->second.first;
      l.last_seen = it->second.second;
    }
    if (auto it = conns_.find(u.user); it != conns_.end()) {
      l.connected = true;
      l.identity = it->second->identity();
      l.connected_at = it->second->connected_at();
      l.last_seen = it->second->last_seen();
    }
  }
  std::vector<Listed> v;
  for (auto& [u, l] : out) v.push_back(std::move(l));
  return v;
}

void RunnerHub::on_registered(std::function<void(std::shared_ptr<RunnerConn>)> fn) {
  std::lock_guard lk(mu_);
  registered_hooks_.push_back(std::move(fn));
}

RunnerStats RunnerHub::stats() const {
  RunnerStats s;
  {
    std::lock_guard lk(mu_);
    s.connections = conns_.size();
  }
  s.requests = requests_.load();
  s.failed = failed_.load();
  s.bytes_out = bytes_out_.load();
  s.bytes_in = bytes_in_.load();
  return s;
}

}  // namespace agentbox::remote
