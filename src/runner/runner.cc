#include "runner/runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <condition_variable>
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

namespace agentbox::runner {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace ws = boost::beast::websocket;
namespace ssl = boost::asio::ssl;
using namespace std::chrono_literals;
namespace p = proto;

namespace {

constexpr std::size_t kPushLimit = 4 << 20;       // outbox bytes before pushes wait
constexpr std::size_t kExecOutputCap = 32 << 20;  // per stream of one exec
constexpr std::size_t kBgOutputCap = 16 << 20;    // per stream of one bg task
constexpr std::size_t kMaxMessage = 768u << 20;   // a 500 MB file as plain base64 fits
constexpr std::size_t kStreamRead = 32 << 10;     // xbot's push size
// Version 2: how long an exited stream child's buffered output may take before its exit push.
constexpr std::chrono::milliseconds kExitDrain{500};
constexpr std::chrono::seconds kExitDrainMax{5};

std::string first_shell() {
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
  int readers = 0;     // output readers still reading (guarded by mu)
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

  void shutdown() {
    outbox.close();
    std::lock_guard l(mu_);
    closed_ = true;
    for (auto& [id, d] : downloads_) {
      std::lock_guard dl(d->mu);
      d->cancelled = true;
      d->cv.notify_all();
    }
    downloads_.clear();
    uploads_.clear();  // temp files go
    for (pid_t pg : execs_) kill_group(pg);
    for (auto& [id, t] : tasks_) {
      std::lock_guard tl(t->mu);
      if (t->status == "running") kill_group(t->pid);
    }
    for (auto& [id, s] : streams_) kill_group(s->pid);
    tasks_.clear();
    streams_.clear();
  }

  // On the I/O thread, for every frame.
  void dispatch(p::Envelope e) {
    const std::string& t = e.type;
    if (t == p::type::kStdioWrite || t == p::type::kPtyStdin || t == p::type::kPtyResize) {
      fire_and_forget(e);  // in order, no reply (xbot: pty_stdin's reply is dropped anyway)
      return;
    }
    if (version_ >= p::kChunkedVersion &&
        (t == p::type::kFileBegin || t == p::type::kFileChunk || t == p::type::kFileEnd ||
         t == p::type::kAck || t == p::type::kError)) {
      transfer_frame(e);  // in order, on the I/O thread
      return;
    }
    auto self = shared_from_this();
    std::thread([self, env = std::move(e)]() mutable { self->handle(std::move(env)); }).detach();
  }

 private:
  void reply(const std::string& id, std::string_view type, std::optional<p::Json> body) {
    outbox.send(p::frame(id, type, std::move(body)));
  }
  void reply_error(const std::string& id, const Error& err) {
    std::string_view c;
    if (err.sys_errno != 0) {
      c = version_ >= p::kBinaryVersion ? p::code_for_errno_exact(err.sys_errno)
                                        : p::code_for_errno(err.sys_errno);
    } else {
      switch (err.code) {
        case Code::kInvalid: c = p::code::kInvalid; break;
        case Code::kAccess: c = p::code::kPerm; break;
        case Code::kNotFound: c = p::code::kNotFound; break;
        case Code::kExists: c = p::code::kExists; break;
        case Code::kNotSupported: c = p::code::kNotSupported; break;
        case Code::kTooBig: c = p::code::kTooBig; break;
        default: c = p::code::kIO; break;
      }
    }
    outbox.send(p::error_frame(id, c, err.message));
  }
  void reply_error(const std::string& id, std::string_view code, std::string msg) {
    outbox.send(p::error_frame(id, code, msg));
  }

  // The box's cgroup a command of request `e` joins (its `box` and `limits`, box_limits.h):
  // the cgroup.procs fds for SpawnSpec::join_fds, `box` set when release() is owed. nullopt:
  // refused (the error reply is sent).
  std::optional<std::vector<UniqueFd>> join_box(const p::Envelope& e, std::string& box) {
    auto b = body<p::BoxLimits>(e);
    if (!b) return std::nullopt;
    auto fds = cgroups_->acquire(*b);
    if (!fds) {
      reply_error(e.id, fds.error());
      return std::nullopt;
    }
    if (!fds->empty()) box = b->box;
    return std::move(*fds);
  }
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

  void handle(p::Envelope e) {
    const std::string& t = e.type;
    const std::string& id = e.id;
    if (t == p::type::kExec) return exec(e);
    if (t == p::type::kReadFile) {
      auto b = body<p::PathRequest>(e);
      if (!b) return;
      if (version_ >= p::kChunkedVersion && send_chunked(id, b->path)) return;
      auto r = fs_.read_file(b->path);
      if (!r) return reply_error(id, r.error());
      return reply(id, p::type::kFileContent, p::to_json(p::FileContent{std::move(*r)}));
    }
    if (t == p::type::kWriteFile) {
      auto b = p::body_as<p::WriteFileRequest>(e);
      if (!b)
        return reply_error(id, b.error().code == Code::kInternal ? p::code::kIO : p::code::kInvalid,
                           b.error().message);
      auto r = fs_.write_file(b->path, b->data, b->perm);
      if (!r) return reply_error(id, r.error());
      return reply(id, p::type::kOk, std::nullopt);
    }
    if (t == p::type::kStat) {
      auto b = body<p::PathRequest>(e);
      if (!b) return;
      auto r = fs_.stat(b->path);
      if (!r) return reply_error(id, r.error());
      return reply(id, p::type::kFileInfo, p::to_json(*r));
    }
    if (t == p::type::kReadDir) {
      auto b = body<p::PathRequest>(e);
      if (!b) return;
      auto r = fs_.read_dir(b->path);
      if (!r) return reply_error(id, r.error());
      return reply(id, p::type::kDirEntries, p::to_json(*r));
    }
    if (t == p::type::kMkdirAll) {
      auto b = body<p::MkdirAllRequest>(e);
      if (!b) return;
      auto r = fs_.mkdir_all(b->path, b->perm);
      if (!r) return reply_error(id, r.error());
      return reply(id, p::type::kOk, std::nullopt);
    }
    if (t == p::type::kRemove || t == p::type::kRemoveAll) {
      auto b = body<p::PathRequest>(e);
      if (!b) return;
      auto r = t == p::type::kRemove ? fs_.remove(b->path) : fs_.remove_all(b->path);
      if (!r) return reply_error(id, r.error());
      return reply(id, p::type::kOk, std::nullopt);
    }
    if (t == p::type::kBgExec) return bg_exec(e);
    if (t == p::type::kBgStatus || t == p::type::kBgKill) return bg_other(e);
    if (t == p::type::kStdioStart) return stream_start(e, false);
    if (t == p::type::kPtyCreate) return stream_start(e, true);
    if (t == p::type::kStdioClose || t == p::type::kPtyClose) return stream_close(e);
    if (t == p::type::kStdioSignal && streams_v2_) return stream_signal(e);
    if (t == p::type::kLlmGenerate || t == p::type::kLlmModels) {
      return reply_error(id, p::code::kNotSupported, "local LLM not configured on this runner");
    }
    if (t == p::type::kDownloadFile) {
      auto b = body<p::DownloadRequest>(e);
      if (!b) return;
      auto r = download_file(b->url, fs_, b->output_path, tls_);
      if (!r) return reply_error(id, r.error());
      return reply(id, p::type::kOk, p::to_json(p::SizeBody{*r}));
    }
    reply_error(id, p::code::kInvalid, "unknown request type: " + t);
  }

  // The child's cwd: the workspace, or `dir` beneath it. Unlike xbot, a bad dir is an error.
  Result<UniqueFd> cwd_for(const std::string& dir) {
    auto fd = fs_.open_dir(dir.empty() ? fs_.path() : dir);
    // A missing dir stays ENOENT (404 through the API, as on the other backends).
    if (!fd && fd.error().code != Code::kAccess && fd.error().code != Code::kNotFound) {
      return fail(Code::kInternal, "exec error: " + fd.error().message);
    }
    return fd;
  }

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

  void exec(const p::Envelope& e) {
    auto b = body<p::ExecRequest>(e);
    if (!b) return;
    SpawnSpec spec;
    if (b->shell) {
      spec.argv = {"/bin/sh", "-c", b->command};
    } else {
      if (b->args.empty()) {
        return reply_error(e.id, p::code::kIO,
                           "exec error: non-shell exec requires args to be set");
      }
      spec.argv = b->args;
    }
    if (!b->run_as_user.empty()) {
      std::vector<std::string> sudo = {"sudo", "-n", "-H", "-u", b->run_as_user, "--"};
      spec.argv.insert(spec.argv.begin(), sudo.begin(), sudo.end());
    }
    spec.env = environment_with(b->env);
    auto cwd = cwd_for(b->dir);
    if (!cwd) return reply_error(e.id, cwd.error());
    spec.cwd_fd = cwd->get();
    int out[2], err[2], in[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      return reply_error(e.id, p::code::kIO, "exec error: pipe");
    }
    UniqueFd out_r(out[0]), out_w(out[1]), err_r(err[0]), err_w(err[1]), in_r, in_w;
    if (!b->stdin_data.empty()) {
      if (pipe2(in, O_CLOEXEC) != 0) return reply_error(e.id, p::code::kIO, "exec error: pipe");
      in_r = UniqueFd(in[0]);
      in_w = UniqueFd(in[1]);
      spec.stdin_fd = in_r.get();
    }
    spec.stdout_fd = out_w.get();
    spec.stderr_fd = err_w.get();
    std::string box;
    auto joins = join_box(e, box);
    if (!joins) return;
    spec.join_fds = raw(*joins);
    auto pid = spawn(spec);
    joins->clear();
    if (!pid && !box.empty()) cgroups_->release(box);
    if (!pid && pid.error().sys_errno == ENOENT) {
      // No such program: exit 127 as a shell reports it (the other backends' contract).
      p::ExecResult missing;
      missing.exit_code = 127;
      missing.stderr_data = spec.argv[0] + ": " + std::strerror(ENOENT) + "\n";
      return reply(e.id, p::type::kExecResult, p::to_json(missing));
    }
    if (!pid) return reply_error(e.id, p::code::kIO, "exec error: " + pid.error().message);
    out_w.reset();
    err_w.reset();
    in_r.reset();
    if (!track_exec(*pid)) kill_group(*pid);
    std::thread feeder;
    if (in_w) {
      feeder = std::thread([fd = std::move(in_w), data = b->stdin_data]() {
        std::string_view v = data;
        while (!v.empty()) {
          ssize_t n = ::write(fd.get(), v.data(), v.size());
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) break;
          v.remove_prefix(static_cast<std::size_t>(n));
        }
      });
    }
    std::int64_t secs = b->timeout <= 0 || b->timeout > 3600 ? 60 : b->timeout;
    p::ExecResult res;
    bool in_time = drain(out_r.get(), err_r.get(), res.stdout_data, res.stderr_data, kExecOutputCap,
                         std::chrono::steady_clock::now() + std::chrono::seconds(secs));
    if (!in_time) {
      // SECURITY/correctness: the whole group, not only the direct child (xbot's bug, 1.4).
      kill_group(*pid);
      drain(out_r.get(), err_r.get(), res.stdout_data, res.stderr_data, kExecOutputCap,
            std::chrono::steady_clock::now() + 1s);
    }
    int status = wait_for(*pid);
    untrack_exec(*pid);
    if (!box.empty()) cgroups_->release(box);
    if (feeder.joinable()) {
      if (!in_time) kill_group(*pid);
      feeder.join();
    }
    res.exit_code = in_time ? exit_code_of(status) : -1;
    res.timed_out = !in_time;
    reply(e.id, p::type::kExecResult, p::to_json(res));
  }

  void bg_exec(const p::Envelope& e) {
    auto b = body<p::BgExecRequest>(e);
    if (!b) return;
    SpawnSpec spec;
    if (b->shell) {
      spec.argv = {"sh", "-c", b->command};
    } else if (b->args.empty()) {
      return reply_error(e.id, p::code::kIO,
                         "bg_exec failed: non-shell exec requires args to be set");
    } else {
      spec.argv = b->args;
    }
    spec.env = environment_with(b->env);
    auto cwd = cwd_for(b->dir);
    if (!cwd) return reply_error(e.id, cwd.error());
    spec.cwd_fd = cwd->get();
    int out[2], err[2], in[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(in, O_CLOEXEC) != 0) {
      return reply_error(e.id, p::code::kIO, "bg_exec failed: pipe");
    }
    UniqueFd out_r(out[0]), out_w(out[1]), err_r(err[0]), err_w(err[1]), in_r(in[0]), in_w(in[1]);
    spec.stdout_fd = out_w.get();
    spec.stderr_fd = err_w.get();
    spec.stdin_fd = in_r.get();
    auto task = std::make_shared<BgTask>();
    {
      std::lock_guard l(mu_);
      if (closed_) return;
      if (tasks_.count(b->task_id)) {
        return reply_error(e.id, p::code::kExists,
                           "bg_exec failed: task " + b->task_id + " exists");
      }
      auto pid = spawn(spec);
      if (!pid) return reply_error(e.id, p::code::kIO, "bg_exec failed: " + pid.error().message);
      task->pid = *pid;
      tasks_[b->task_id] = task;
    }
    out_w.reset();
    err_w.reset();
    in_r.reset();
    std::string data = b->stdin_data;
    std::thread([fd = std::move(in_w), data]() {
      std::string_view v = data;
      while (!v.empty()) {
        ssize_t n = ::write(fd.get(), v.data(), v.size());
        if (n <= 0 && errno != EINTR) break;
        if (n > 0) v.remove_prefix(static_cast<std::size_t>(n));
      }
    }).detach();
    std::thread([task, o = std::move(out_r), er = std::move(err_r)]() {
      char buf[65536];
      pollfd pf[2] = {{o.get(), POLLIN, 0}, {er.get(), POLLIN, 0}};
      while (pf[0].fd >= 0 || pf[1].fd >= 0) {
        if (poll(pf, 2, -1) < 0 && errno != EINTR) break;
        for (int i = 0; i < 2; ++i) {
          if (pf[i].fd < 0 || pf[i].revents == 0) continue;
          ssize_t n = ::read(pf[i].fd, buf, sizeof buf);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            pf[i].fd = -1;
            continue;
          }
          std::lock_guard l(task->mu);
          std::string& s = i == 0 ? task->out : task->err;
          if (s.size() < kBgOutputCap)
            s.append(buf, std::min<std::size_t>(n, kBgOutputCap - s.size()));
        }
      }
      int status = wait_for(task->pid);
      std::lock_guard l(task->mu);
      if (task->status == "running") {
        task->exit_code = exit_code_of(status);
        task->status = task->exit_code == 0 ? "completed" : "failed";
      }
    }).detach();
    reply(e.id, p::type::kBgStarted, p::to_json(p::TaskRequest{b->task_id}));
  }

  void bg_other(const p::Envelope& e) {
    auto b = body<p::TaskRequest>(e);
    if (!b) return;
    bool kill = e.type == p::type::kBgKill;
    std::shared_ptr<BgTask> task;
    {
      std::lock_guard l(mu_);
      if (auto it = tasks_.find(b->task_id); it != tasks_.end()) task = it->second;
    }
    std::string op = kill ? "bg_kill failed: " : "bg_status failed: ";
    if (!task) return reply_error(e.id, p::code::kIO, op + "task " + b->task_id + " not found");
    std::unique_lock l(task->mu);
    if (kill) {
      if (task->status != "running") {
        return reply_error(
            e.id, p::code::kIO,
            op + "task " + b->task_id + " is not running (status=" + task->status + ")");
      }
      kill_group(task->pid);
      task->status = "killed";
      task->exit_code = -1;
      l.unlock();
      return reply(e.id, p::type::kOk, std::nullopt);
    }
    p::BgOutput o{b->task_id, task->status, task->exit_code, task->out, task->err};
    l.unlock();
    reply(e.id, p::type::kBgOutput, p::to_json(o));
  }

  void stream_start(const p::Envelope& e, bool pty) {
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

  // Pushes one of the child's outputs until EOF (a pty: EIO once every slave holder is gone);
  // nothing after the exit push.
  void forward(std::shared_ptr<Stream> st, std::string id, int fd, bool is_stderr) {
    std::string buf(kStreamRead, '\0');
    auto data_type = st->pty ? p::type::kPtyData : p::type::kStdioData;
    for (;;) {
      ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      {
        std::lock_guard l(st->mu);
        if (st->exited) continue;  // read and dropped: a background child's late output
      }
      p::StreamData d{id, buf.substr(0, static_cast<std::size_t>(n))};
      d.is_stderr = is_stderr;
      outbox.push(p::frame("", data_type, p::to_json(d)));
    }
    {
      std::lock_guard l(st->mu);
      --st->readers;
    }
    st->cv.notify_all();
  }

  // Waits for the child, then for its output to be pushed, then pushes its exit. xbot's
  // runner waits for EOF first, so a background child that keeps the pipe holds the exit; with
  // version 2 the output of an exited leader is drained for at most kExitDrain and the exit
  // goes (with the signal that ended it).
  void report_exit(std::shared_ptr<Stream> st, std::string id, bool v2) {
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
      auto drained = [&] { return st->readers == 0; };
      if (v2) {
        // The leader's own output is in the pipe when it exits: it is always pushed (however
        // late the readers run); only a background child still holding the pipe open with
        // nothing written is given up on, after kExitDrain of quiet.
        // (A background child that keeps writing holds the exit at most kExitDrainMax.)
        const auto give_up = std::chrono::steady_clock::now() + kExitDrainMax;
        auto quiet_since = std::chrono::steady_clock::now();
        while (!st->cv.wait_for(l, std::chrono::milliseconds(20), drained) &&
               std::chrono::steady_clock::now() < give_up) {
          if (st->unread_output()) {
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

  // stdio_signal (version 2): `signal` to a stream's child, or to its process group.
  void stream_signal(const p::Envelope& e) {
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

  std::shared_ptr<Stream> find_stream(const std::string& id) {
    std::lock_guard l(mu_);
    auto it = streams_.find(id);
    return it == streams_.end() ? nullptr : it->second;
  }

  void stream_close(const p::Envelope& e) {
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

  // ---- version 1: chunked files (docs/runner-protocol.md) ----

  // A read_file of a file over kChunkThreshold as file_begin / file_chunk... / file_end, at most
  // kWindowBytes ahead of the server's acks. false: not big (the caller sends file_content).
  bool send_chunked(const std::string& id, const std::string& path) {
    auto fd = fs_.open_at(path, O_RDONLY | O_NONBLOCK);
    if (!fd) return false;  // the plain path reports the error
    struct stat st {};
    if (fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= p::kChunkThreshold) {
      return false;
    }
    if (st.st_size > p::kMaxFileSize) {
      reply_error(id, p::code::kTooBig,
                  "read " + path + ": " + std::to_string(st.st_size) + " bytes is over the " +
                      std::to_string(p::kMaxFileSize) + "-byte limit");
      return true;
    }
    auto d = std::make_shared<Download>();
    {
      std::lock_guard l(mu_);
      if (closed_) return true;
      downloads_[id] = d;
    }
    std::int64_t size = st.st_size, sent = 0;
    // Version 3: binary frames, read straight into the frame after its header.
    const bool binary = version_ >= p::kBinaryVersion && id.size() <= 255;
    const std::int64_t window = binary ? p::kBinaryWindowBytes : p::kWindowBytes;
    const std::int64_t chunk = binary ? p::kBinaryChunkSize : p::kChunkSize;
    reply(id, p::type::kFileBegin, p::to_json(p::FileBegin{"", 0, size}));
    std::string buf;
    while (sent < size) {
      {
        std::unique_lock l(d->mu);
        d->cv.wait(l, [&] { return d->cancelled || sent - d->acked < window; });
        if (d->cancelled) break;
      }
      const auto want = static_cast<std::size_t>(std::min(chunk, size - sent));
      std::size_t head = 0;
      if (binary) {
        buf = p::binary_chunk_header(id, sent, want);
        head = p::binary_chunk_header_size(id);
      } else {
        buf.resize(want);
      }
      ssize_t n = pread(fd->get(), buf.data() + head, want, sent);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        reply_error(id, Error::from_errno(errno, "read " + path));
        break;
      }
      if (n == 0) break;  // the file shrank: end here, file_end says how much came
      buf.resize(head + static_cast<std::size_t>(n));
      if (binary) {
        outbox.send_binary(std::move(buf));
      } else {
        outbox.send(p::chunk_frame(id, "", sent, buf));
      }
      sent += n;
    }
    bool cancelled;
    {
      std::lock_guard l(d->mu);
      cancelled = d->cancelled;
    }
    if (!cancelled) reply(id, p::type::kFileEnd, p::to_json(p::FileEnd{sent}));
    std::lock_guard l(mu_);
    downloads_.erase(id);
    return true;
  }

  void transfer_frame(const p::Envelope& e) {
    const std::string& t = e.type;
    const std::string& id = e.id;
    if (t == p::type::kAck || t == p::type::kError) {
      std::shared_ptr<Download> d;
      {
        std::lock_guard l(mu_);
        if (auto it = downloads_.find(id); it != downloads_.end()) d = it->second;
      }
      if (d) {
        std::lock_guard l(d->mu);
        if (t == p::type::kError) {
          d->cancelled = true;
        } else if (auto a = p::body_as<p::Ack>(e); a) {
          d->acked = std::max(d->acked, a->offset);
        }
        d->cv.notify_all();
      }
      if (t == p::type::kError) uploads_.erase(id);
      return;
    }
    if (t == p::type::kFileBegin) {
      auto b = body<p::FileBegin>(e);
      if (!b) return;
      const bool unknown = b->size == p::kSizeUnknown;
      if (unknown ? version_ < p::kBinaryVersion : b->size < 0) {
        return reply_error(id, p::code::kInvalid,
                           "file_begin: size " + std::to_string(b->size) +
                               (unknown ? " (not known yet) needs version 3" : " is negative"));
      }
      if (b->size > p::kMaxFileSize) {
        return reply_error(id, p::code::kTooBig,
                           "write " + b->path + ": " + std::to_string(b->size) +
                               " bytes is over the " + std::to_string(p::kMaxFileSize) +
                               "-byte limit");
      }
      if (uploads_.count(id))
        return reply_error(id, p::code::kInvalid, "transfer " + id + " exists");
      auto w = fs_.create(b->path, b->perm);
      if (!w) return reply_error(id, w.error());
      uploads_[id] = Upload{std::move(*w), b->size};
      return reply(id, p::type::kAck, p::to_json(p::Ack{0}));
    }
    if (t == p::type::kFileChunk) {
      auto c = p::body_as<p::FileChunk>(e);
      if (!c) return abort_upload(id, p::code::kInvalid, c.error().message);
      return upload_chunk(id, c->offset, c->data);
    }
    // file_end
    Upload* up = upload_of(id);
    if (!up) return;
    Upload& u = *up;
    auto abort = [&](std::string_view code, std::string msg) {
      abort_upload(id, code, std::move(msg));
    };
    auto end = p::body_as<p::FileEnd>(e);
    if (!end) return abort(p::code::kInvalid, end.error().message);
    if (u.size == p::kSizeUnknown) u.size = end->size;
    if (end->size != u.size || u.writer.written() != u.size) {
      return abort(p::code::kInvalid, "file_end after " + std::to_string(u.writer.written()) +
                                          " bytes, announced " + std::to_string(u.size));
    }
    if (auto s = u.writer.commit(); !s)
      return abort(p::code_for_errno(s.error().sys_errno), s.error().message);
    uploads_.erase(id);
    reply(id, p::type::kOk, std::nullopt);
  }

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
  void upload_chunk(const std::string& id, std::int64_t offset, std::string_view data) {
    Upload* up = upload_of(id);
    if (!up) return;
    Upload& u = *up;
    auto abort = [&](std::string_view code, std::string msg) {
      abort_upload(id, code, std::move(msg));
    };
    if (offset != u.writer.written()) {
      return abort(p::code::kInvalid, "file_chunk at offset " + std::to_string(offset) +
                                          ", expected " + std::to_string(u.writer.written()));
    }
    const std::int64_t end = u.writer.written() + static_cast<std::int64_t>(data.size());
    if (u.size == p::kSizeUnknown && end > p::kMaxFileSize) {
      return abort(p::code::kTooBig, "write: over the " + std::to_string(p::kMaxFileSize) +
                                         "-byte limit");
    }
    if (u.size != p::kSizeUnknown && end > u.size) {
      return abort(p::code::kInvalid,
                   "file_chunk beyond the announced size " + std::to_string(u.size));
    }
    if (auto s = u.writer.write(data); !s)
      return abort(p::code_for_errno(s.error().sys_errno), s.error().message);
    reply(id, p::type::kAck, p::to_json(p::Ack{u.writer.written()}));
  }

 public:
  // On the I/O thread: a binary frame. Only version 3's chunks of an upload; anything else is
  // answered (a chunk of an unknown transfer) or dropped (not a chunk: there is no id to name).
  void dispatch_binary(std::string_view frame) {
    if (version_ < p::kBinaryVersion) {
      spdlog::warn("a binary frame without version 3: dropped");
      return;
    }
    auto c = p::decode_binary_chunk(frame);
    if (!c) {
      spdlog::warn("bad binary frame: {}", c.error().message);
      return;
    }
    upload_chunk(std::string(c->id), c->offset, c->data);
  }

 private:
  void fire_and_forget(const p::Envelope& e) {
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

  const WorkspaceFs& fs_;
  ssl::context& tls_;  // download_file's https (shared: OpenSSL contexts are thread-safe to use)
  std::shared_ptr<BoxCgroups> cgroups_;  // the boxes' cgroups (one per runner process)
  std::atomic<int> version_{0};
  std::atomic<bool> streams_v2_{false};  // version 2: process streams
  std::map<std::string, Upload> uploads_;  // I/O thread only
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Download>> downloads_;
  bool closed_ = false;
  std::set<pid_t> execs_;
  std::map<std::string, std::shared_ptr<BgTask>> tasks_;
  std::map<std::string, std::shared_ptr<Stream>> streams_;
};

class Runner {
 public:
  Runner(const RunnerOptions& o, WorkspaceFs fs, Url url)
      : opts_(o), fs_(std::move(fs)), url_(std::move(url)), ssl_(ssl::context::tls_client) {
    ssl_.set_default_verify_paths();
    if (!o.ca_file.empty()) ssl_.load_verify_file(o.ca_file);
    ssl_.set_verify_mode(ssl::verify_peer);
  }

  int run() {
    asio::signal_set signals(io_, SIGINT, SIGTERM);
    signals.async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      spdlog::info("signal {}: stopping", sig);
      stopping_ = true;
      if (conn_) conn_->shutdown();
      io_.stop();
    });
    asio::co_spawn(io_, loop(), LogErrors{"runner loop"});
    io_.run();
    if (conn_) conn_->shutdown();
    cgroups_->close();  // kills what is left in the boxes' cgroups and removes them
    return 0;
  }

 private:
  asio::awaitable<void> loop() {
    std::mt19937_64 rng{std::random_device{}()};
    int attempt = 0;
    asio::steady_timer timer(io_);
    for (;;) {
      bool registered = false;
      if (url_.tls) {
        registered = co_await session_tls();
      } else {
        registered = co_await session_plain();
      }
      if (stopping_) co_return;
      // A registration that succeeded starts the back-off again (xbot's never resets, 1.4).
      if (registered) attempt = 0;
      ++attempt;
      auto base = opts_.backoff_base.count();
      long long delay = base;
      for (int i = 1; i < attempt && delay < opts_.backoff_max.count(); ++i) delay *= 2;
      delay = std::min<long long>(delay, opts_.backoff_max.count());
      long long jitter = delay / 4 > 0 ? static_cast<long long>(rng() % (delay / 4)) : 0;
      spdlog::info("reconnecting in {} ms (attempt {})", delay + jitter, attempt);
      timer.expires_after(std::chrono::milliseconds(delay + jitter));
      boost::system::error_code ec;
      co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
  }

  // Resolves --server's host and connects the TCP layer of `s` (10 s). false: logged.
  template <typename WS>
  asio::awaitable<bool> connect_tcp(WS& s) {
    boost::system::error_code ec;
    asio::ip::tcp::resolver res(io_);
    auto eps = co_await res.async_resolve(url_.host, url_.port,
                                          asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      spdlog::warn("resolve {}: {}", url_.host, ec.message());
      co_return false;
    }
    beast::get_lowest_layer(s).expires_after(10s);
    co_await beast::get_lowest_layer(s).async_connect(
        eps, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      spdlog::warn("connect {}:{}: {}", url_.host, url_.port, ec.message());
      co_return false;
    }
    // Small request/reply frames (exec): no Nagle delay.
    boost::system::error_code nec;
    beast::get_lowest_layer(s).socket().set_option(asio::ip::tcp::no_delay(true), nec);
    co_return true;
  }

  asio::awaitable<bool> session_plain() {
    ws::stream<beast::tcp_stream> s(io_);
    bool connected = co_await connect_tcp(s);
    if (!connected) co_return false;
    beast::get_lowest_layer(s).expires_never();
    bool r = co_await serve(s);
    co_return r;
  }

  asio::awaitable<bool> session_tls() {
    ws::stream<beast::ssl_stream<beast::tcp_stream>> s(io_, ssl_);
    bool connected = co_await connect_tcp(s);
    if (!connected) co_return false;
    boost::system::error_code ec;
    SSL_set_tlsext_host_name(s.next_layer().native_handle(), url_.host.c_str());
    s.next_layer().set_verify_callback(ssl::host_name_verification(url_.host));
    co_await s.next_layer().async_handshake(ssl::stream_base::client,
                                            asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      spdlog::warn("TLS handshake with {}: {}", url_.host, ec.message());
      co_return false;
    }
    beast::get_lowest_layer(s).expires_never();
    bool r = co_await serve(s);
    co_return r;
  }

  std::string user_id() const {
    if (!opts_.user_id.empty()) return opts_.user_id;
    return url_.target.substr(url_.target.rfind('/') + 1);
  }

  // Handshake, register, serve until the connection ends. true when the registration succeeded.
  template <typename WS>
  asio::awaitable<bool> serve(WS& s) {
    boost::system::error_code ec;
    s.set_option(ws::stream_base::timeout{10s, 60s, true});  // pings every 30 s, 60 s deadline
    s.read_message_max(kMaxMessage);
    // One frame per message, masked in 256 KiB pieces: Beast's default is 4 KiB frames, a write
    // each, which held 1 MiB file chunks to tens of MB/s. The messages are the same.
    s.auto_fragment(false);
    s.write_buffer_bytes(256u << 10);
    std::string host = url_.host + ":" + url_.port;
    co_await s.async_handshake(host, url_.target, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      spdlog::warn("websocket handshake {}{}: {}", host, url_.target, ec.message());
      co_return false;
    }
    p::RegisterBody reg{.user_id = user_id(),
                        .auth_token = opts_.token,
                        .workspace = fs_.path(),
                        .shell = first_shell(),
                        .version = opts_.protocol_version};
    // agentbox's extension: what this runner enforces (not as xbot's runner, version 0).
    if (opts_.protocol_version > 0) reg.enforces = cgroups_->enforces();
    p::Envelope env{.id = "",
                    .type = std::string(p::type::kRegister),
                    .user_id = user_id(),
                    .body = p::to_json(reg)};
    std::string first = p::encode(env);
    co_await s.async_write(asio::buffer(first), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return false;
    // 10 s for the answer; anything but `error` counts as success (as xbot's runner).
    beast::flat_buffer buf;
    asio::steady_timer guard(io_);
    guard.expires_after(10s);
    guard.async_wait([&s](const boost::system::error_code& e) {
      if (!e) beast::get_lowest_layer(s).close();
    });
    co_await s.async_read(buf, asio::redirect_error(asio::use_awaitable, ec));
    guard.cancel();
    if (ec) {
      spdlog::warn("no answer to register: {}", ec.message());
      co_return false;
    }
    auto answer = p::decode(beast::buffers_to_string(buf.data()));
    if (answer && answer->type == p::type::kError) {
      auto eb = p::body_as<p::ErrorBody>(*answer);
      spdlog::warn("registration refused: {} {}", eb ? eb->code : "", eb ? eb->message : "");
      beast::get_lowest_layer(s).close();
      co_return false;
    }
    spdlog::info("registered as {} with workspace {}", user_id(), fs_.path());
    auto conn = std::make_shared<Conn>(io_.get_executor(), fs_, ssl_, cgroups_);
    if (answer && answer->type == p::type::kRegisterOk) {
      // The version both speak: the server's answer, never above ours.
      auto ok = p::body_as<p::RegisterOk>(*answer);
      conn->set_version(ok ? p::negotiate(ok->version, opts_.protocol_version) : 0);
    }
    conn_ = conn;
    auto writer_done = std::make_shared<bool>(false);
    asio::co_spawn(io_, writer(s, conn, writer_done), LogErrors{"runner writer"});
    for (;;) {
      buf.consume(buf.size());
      co_await s.async_read(buf, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      if (s.got_binary()) {
        auto d = buf.cdata();
        conn->dispatch_binary(std::string_view(static_cast<const char*>(d.data()), d.size()));
        continue;
      }
      auto e = p::decode(beast::buffers_to_string(buf.data()));
      if (!e) {
        spdlog::warn("bad frame: {}", e.error().message);
        continue;
      }
      conn->dispatch(std::move(*e));
    }
    spdlog::warn("connection lost: {}", ec.message());
    // Kill every child of this connection and stop its writer.
    conn->shutdown();
    conn_.reset();
    beast::get_lowest_layer(s).close();
    asio::steady_timer wait(io_);
    while (!*writer_done) {
      wait.expires_after(20ms);
      co_await wait.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    co_return true;
  }

  template <typename WS>
  asio::awaitable<void> writer(WS& s, std::shared_ptr<Conn> conn, std::shared_ptr<bool> done) {
    boost::system::error_code ec;
    for (;;) {
      bool binary = false;
      auto f = conn->outbox.pop(&binary);
      if (!f) {
        if (conn->outbox.closed()) break;
        conn->outbox.wake().expires_at(asio::steady_timer::time_point::max());
        co_await conn->outbox.wake().async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      s.binary(binary);
      co_await s.async_write(asio::buffer(*f), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        conn->outbox.close();
        break;
      }
    }
    *done = true;
  }

  RunnerOptions opts_;
  WorkspaceFs fs_;
  Url url_;
  asio::io_context io_;
  ssl::context ssl_;
  std::shared_ptr<Conn> conn_;
  std::shared_ptr<BoxCgroups> cgroups_ = std::make_shared<BoxCgroups>();
  bool stopping_ = false;
};

}  // namespace

int run(const RunnerOptions& opts) {
  auto url = parse_url(opts.server, "ws", "wss");
  if (!url) {
    spdlog::error("--server {}: want ws://host[:port]/ws/<user> or wss://...", opts.server);
    return 2;
  }
  auto fs = WorkspaceFs::open(opts.workspace);
  if (!fs) {
    spdlog::error("--workspace: {}", fs.error().message);
    return 2;
  }
  if (opts.user_id.empty() && url->target.substr(url->target.rfind('/') + 1).empty()) {
    spdlog::error("--server {}: the URL must end in /ws/<user> (or give --user-id)", opts.server);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  try {
    Runner r(opts, std::move(*fs), std::move(*url));
    return r.run();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}

}  // namespace agentbox::runner
