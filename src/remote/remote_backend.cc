#include "remote/remote_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>

#include "sandbox/exec_runner.h"
#include "sandbox/path.h"
#include "remote/remote_processes.h"
#include "remote/remote_transfer.h"

namespace agentbox::remote {

namespace asio = boost::asio;
using Json = proto::Json;
using namespace std::chrono_literals;

namespace {

// Requests other than exec wait this long for their reply (xbot's DefaultRequestTimeout).
constexpr std::chrono::milliseconds kRequestTimeout = 30s;
constexpr std::chrono::milliseconds kFileTimeout = 300s;

// A chunk transfer waits this long for each frame of the runner (an ack, a chunk).
constexpr std::chrono::milliseconds kTransferIdle = 60s;

// An unnamed scratch file (nothing to clean up): on disk in /var/tmp when it can be, so a big
// file costs no memory; an anonymous memory file otherwise.
Result<UniqueFd> scratch_file(const char* what) {
  UniqueFd fd(::open("/var/tmp", O_TMPFILE | O_RDWR | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) fd = UniqueFd(::memfd_create(what, MFD_CLOEXEC));
  if (!fd) return fail_errno(errno, "scratch file");
  return fd;
}

Status write_all(int fd, const char* data, std::size_t n, const char* what) {
  std::size_t off = 0;
  while (off < n) {
    ssize_t w = ::write(fd, data + off, n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return fail_errno(errno, what);
    off += static_cast<std::size_t>(w);
  }
  return {};
}

Status pread_all(int fd, char* data, std::size_t n, std::uint64_t at) {
  std::size_t off = 0;
  while (off < n) {
    ssize_t r = ::pread(fd, data + off, n - off, static_cast<off_t>(at + off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return fail_errno(errno, "read(upload spool)");
    if (r == 0) return fail(Code::kInternal, "read(upload spool): short file");
    off += static_cast<std::size_t>(r);
  }
  return {};
}

// ENOTSUP naming limits.<name> unless the runner said it enforces it.
Status require_enforced(const RunnerIdentity& id, const std::string& name) {
  if (id.does_enforce(name)) return {};
  std::string what;
  for (const auto& e : id.enforces) what += (what.empty() ? "" : ", ") + e;
  return fail(Code::kNotSupported, "limits." + name + " on remote runner " + id.user +
                                       ": the runner does not " + "enforce it (it enforces: " +
                                       (what.empty() ? "none of a session's limits" : what) + ")");
}

Error bad_reply(const std::string& op, const RunnerReply& r) {
  return Error::make(Code::kInternal,
                     op + ": runner answered '" + r.type + "', not what the request expects");
}

class RemoteSandbox;
Result<sandbox::FileReader> reader_of_content(const RunnerReply& r);

// Keeps the upload (bounded by max_bytes) and sends it at commit: up to kChunkThreshold in
// memory; past it, with a runner of version 3, streamed to the runner as it arrives (binary
// chunks, the size told at file_end: nothing spooled); with versions 1-2 in a scratch file, sent
// in file_chunks at commit (docs/runner-protocol.md); else read back and sent as one write_file
// (xbot's plain form).
class RemoteWriter : public sandbox::FileWriter {
 public:
  RemoteWriter(RemoteSandbox* box, std::string path, sandbox::WriteOptions opts)
      : box_(box), path_(std::move(path)), opts_(opts) {}
  Status write(std::string_view chunk) override;
  Result<std::uint64_t> commit() override;

 private:
  Result<std::uint64_t> send_chunked(const std::shared_ptr<RunnerConn>& conn,
                                     const std::string& target, std::uint32_t perm);
  Status mkdirs(const std::string& target);
  std::uint32_t perm() const { return proto::go_perm_from_mode(opts_.mode.value_or(0644)); }
  RemoteSandbox* box_;
  std::string path_;
  sandbox::WriteOptions opts_;
  std::string data_;
  UniqueFd spool_;  // set once the upload is over kChunkThreshold (versions 0 to 2)
  std::unique_ptr<ChunkUpload> stream_;  // set once the upload is over it (version 2)
  std::uint64_t size_ = 0;
};

class RemoteSandbox : public sandbox::Sandbox, private sandbox::ProcessLauncher {
 public:
  RemoteSandbox(std::shared_ptr<RunnerHub> hub, std::string user, std::string workspace,
                std::map<std::string, std::string> env, proto::BoxLimits limits)
      : hub_(std::move(hub)),
        user_(std::move(user)),
        workspace_(std::move(workspace)),
        env_(std::move(env)),
        limits_(std::move(limits)) {}
  ~RemoteSandbox() override { procs_.shutdown(); }

  std::string_view name() const override { return "remote"; }
  std::string workspace() const override { return workspace_; }

  asio::awaitable<Result<sandbox::ExecResult>> exec(sandbox::ExecSpec spec,
                                                    sandbox::OutputSink* sink) override;
  // With a runner of version 2 (remote_processes.h); refused (ENOTSUP) on others at start.
  sandbox::ProcessTable* processes() override { return &procs_; }

  Result<sandbox::FileReader> open_file(const std::string& path) override;
  Result<sandbox::FileReader> open_file_streamed(const std::string& path) override;
  Result<std::unique_ptr<sandbox::FileWriter>> create_file(const std::string& path,
                                                           sandbox::WriteOptions opts) override;
  Result<sandbox::FileInfo> stat(const std::string& path) override;
  Result<std::vector<sandbox::DirEntry>> read_dir(const std::string& path) override;
  Status mkdir_all(const std::string& path) override;
  Status remove(const std::string& path) override;
  Status remove_all(const std::string& path) override;
  Status rename(const std::string& from, const std::string& to) override {
    (void)from;
    (void)to;
    return fail(Code::kNotSupported,
                "rename on a remote runner (xbot's runner protocol has no rename)");
  }
  void shutdown() override { procs_.shutdown(); }

  // The runner's absolute path for an API path (confined to the workspace).
  Result<std::string> runner_path(const std::string& path) const {
    auto rel = AB_TRY(sandbox::workspace_relative(path, workspace_));
    return rel.empty() ? workspace_ : workspace_ + "/" + rel;
  }
  std::shared_ptr<RunnerConn> conn() const { return hub_->find(user_); }
  Result<RunnerReply> call(const std::string& op, Json body,
                           std::chrono::milliseconds timeout = kRequestTimeout) {
    auto conn = hub_->find(user_);
    if (!conn) {
      return fail(Code::kUnavailable, op + ": runner " + user_ + " is not connected");
    }
    return conn->call(op, std::move(body), timeout);
  }
  Status expect_ok(const std::string& op, Json body) {
    auto r = AB_TRY(call(op, std::move(body)));
    if (r.type != proto::type::kOk) return std::unexpected(bad_reply(op, r));
    return {};
  }

 private:
  std::shared_ptr<RunnerHub> hub_;
  std::string user_;
  std::string workspace_;
  std::map<std::string, std::string> env_;
  proto::BoxLimits limits_;  // the box's limits, all enforced by its runner (checked at create)
  sandbox::ProcessTable procs_{*this};  // last: its processes go before the rest

  asio::awaitable<Result<sandbox::Launched>> launch(sandbox::ProcessSpec spec) override;
  // The runner connected now still enforces the box's limits (it may have come back as
  // another user, or another program): ENOTSUP naming the first it does not.
  Status still_enforced(const RunnerConn& conn) const {
    for (const auto& [name, value] : limits_.limits) {
      (void)value;
      AB_TRY(require_enforced(conn.identity(), name));
    }
    return {};
  }
  // The launch of one command (exec or process): argv or `sh -c command`, cwd, env.
  Result<RemoteLaunchSpec> launch_spec(std::vector<std::string> argv, const std::string& command,
                                       const std::string& cwd,
                                       const std::map<std::string, std::string>& env) const;
  // exec over a version-2 stream: output as it comes, a kill when the client leaves.
  asio::awaitable<Result<sandbox::ExecResult>> exec_streamed(std::shared_ptr<RunnerConn> conn,
                                                             sandbox::ExecSpec spec,
                                                             sandbox::OutputSink* sink);
};

Status RemoteWriter::write(std::string_view chunk) {
  const std::uint64_t limit = std::min<std::uint64_t>(
      opts_.max_bytes, static_cast<std::uint64_t>(proto::kMaxFileSize));
  if (size_ + chunk.size() > limit) {
    return fail(Code::kTooBig, path_ + ": over the " + std::to_string(limit) +
                                   "-byte limit of a file on a remote runner");
  }
  size_ += chunk.size();
  if (stream_) return stream_->write(chunk);
  if (!spool_ && data_.size() + chunk.size() <= static_cast<std::size_t>(proto::kChunkThreshold)) {
    data_.append(chunk);
    return {};
  }
  if (auto conn = box_->conn(); !spool_ && conn && conn->binary()) {
    // Version 3: the transfer starts now and the bytes go on as they come.
    auto target = AB_TRY(box_->runner_path(path_));
    AB_TRY(mkdirs(target));
    stream_ = AB_TRY(ChunkUpload::start(conn, target, perm(), proto::kSizeUnknown));
    AB_TRY(stream_->write(data_));
    std::string().swap(data_);
    return stream_->write(chunk);
  }
  if (!spool_) {
    spool_ = AB_TRY(scratch_file("agentbox-remote-upload"));
    AB_TRY(write_all(spool_.get(), data_.data(), data_.size(), "write(upload spool)"));
    std::string().swap(data_);
  }
  return write_all(spool_.get(), chunk.data(), chunk.size(), "write(upload spool)");
}

Result<std::uint64_t> RemoteWriter::send_chunked(const std::shared_ptr<RunnerConn>& conn,
                                                 const std::string& target, std::uint32_t perm) {
  const auto size = static_cast<std::int64_t>(size_);
  auto up = AB_TRY(ChunkUpload::start(conn, target, perm, size));
  std::string buf;
  std::int64_t at = 0;
  while (at < size) {
    buf.resize(static_cast<std::size_t>(std::min<std::int64_t>(8 << 20, size - at)));
    AB_TRY(pread_all(spool_.get(), buf.data(), buf.size(), static_cast<std::uint64_t>(at)));
    AB_TRY(up->write(buf));
    at += static_cast<std::int64_t>(buf.size());
  }
  return up->finish();
}

Status RemoteWriter::mkdirs(const std::string& target) {
  if (!opts_.mkdirs) return {};
  auto slash = target.rfind('/');
  if (slash == std::string::npos || slash == 0) return {};
  proto::MkdirAllRequest m{target.substr(0, slash), proto::go_perm_from_mode(0755)};
  return box_->expect_ok("mkdir_all", proto::to_json(m));
}

Result<std::uint64_t> RemoteWriter::commit() {
  if (stream_) {
    auto n = AB_TRY(stream_->finish());
    stream_.reset();
    return n;
  }
  auto target = AB_TRY(box_->runner_path(path_));
  AB_TRY(mkdirs(target));
  const std::uint32_t perm = this->perm();
  if (spool_) {
    auto conn = box_->conn();
    if (conn && conn->chunked()) return send_chunked(conn, target, perm);
    // An xbot runner: the plain form, the whole file in one frame.
    data_.resize(size_);
    AB_TRY(pread_all(spool_.get(), data_.data(), data_.size(), 0));
  }
  const std::uint64_t size = data_.size();
  proto::WriteFileRequest w{target, std::move(data_), perm};
  auto r = AB_TRY(box_->call("write_file", proto::to_json(w), kFileTimeout));
  if (r.type != proto::type::kOk) return std::unexpected(bad_reply("write_file", r));
  return size;
}

asio::awaitable<Result<sandbox::ExecResult>> RemoteSandbox::exec(sandbox::ExecSpec spec,
                                                                 sandbox::OutputSink* sink) {
  if (!spec.artifact_dir.empty()) {
    co_return fail(Code::kNotSupported, "artifact_dir on a remote runner");
  }
  auto conn = hub_->find(user_);
  if (!conn) co_return fail(Code::kUnavailable, "exec: runner " + user_ + " is not connected");
  if (auto st = still_enforced(*conn); !st) co_return std::unexpected(st.error());
  if (conn->streams()) {
    auto run = exec_streamed(std::move(conn), std::move(spec), sink);
    auto guarded = sandbox::without_throw_on_cancel(std::move(run));
    co_return co_await std::move(guarded);
  }
  proto::ExecRequest req;
  if (spec.argv.empty()) {
    req.command = spec.command;
    req.shell = true;
  } else {
    req.command = spec.argv[0];
    req.args = spec.argv;  // args[0] is the program (PROTOCOLS.md 1.4)
  }
  if (!spec.cwd.empty()) {
    auto dir = runner_path(spec.cwd);
    if (!dir) co_return std::unexpected(dir.error());
    req.dir = *dir;
  }
  for (const auto& [k, v] : env_) req.env.push_back(k + "=" + v);
  for (const auto& [k, v] : spec.env) req.env.push_back(k + "=" + v);
  req.stdin_data = spec.stdin_data;
  // Whole seconds, at least 1 (0 would be the runner's 60 s default).
  auto secs = std::max<std::int64_t>(1, (spec.timeout.count() + 999) / 1000);
  req.timeout = secs;
  Json body = proto::to_json(req);
  proto::add_box_limits(body, limits_);
  const auto start = std::chrono::steady_clock::now();
  // The runner answers within timeout + its kill; xbot's server waits timeout + 5 s.
  auto reply = co_await conn->async_call("exec", std::move(body),
                                         std::chrono::seconds(secs + 5));
  sandbox::ExecResult res;
  res.duration = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  if (!reply) {
    if (reply.error().message == "cancelled") {
      // The client left: the runner's exec cannot be stopped (the protocol has no kill for it).
      res.exit_code = -1;
      res.killed_by = sandbox::KilledBy::kNone;
      co_return res;
    }
    co_return std::unexpected(reply.error());
  }
  if (reply->type != proto::type::kExecResult) co_return std::unexpected(bad_reply("exec", *reply));
  auto er = proto::body_as<proto::ExecResult>(*reply);
  if (!er) co_return std::unexpected(er.error());
  res.stdout_data = std::move(er->stdout_data);
  res.stderr_data = std::move(er->stderr_data);
  res.exit_code = er->exit_code;
  res.timed_out = er->timed_out;
  // xbot's runner reports a timeout as exit -1 with timed_out false (PROTOCOLS.md 1.4).
  if (!res.timed_out && res.exit_code == -1 && res.duration >= spec.timeout) res.timed_out = true;
  if (res.timed_out) res.killed_by = sandbox::KilledBy::kTimeout;
  auto cap = [&](std::string* s, bool* truncated) {
    if (s->size() > spec.max_output_bytes) {
      s->resize(spec.max_output_bytes);
      *truncated = true;
    }
  };
  cap(&res.stdout_data, &res.stdout_truncated);
  cap(&res.stderr_data, &res.stderr_truncated);
  if (sink != nullptr) {
    std::string out = std::move(res.stdout_data);
    std::string err = std::move(res.stderr_data);
    res.stdout_data.clear();
    res.stderr_data.clear();
    if (!out.empty()) {
      bool ok = co_await sink->on_output(sandbox::StreamKind::kStdout, std::move(out));
      if (!ok) co_return res;
    }
    if (!err.empty()) {
      bool ok = co_await sink->on_output(sandbox::StreamKind::kStderr, std::move(err));
      (void)ok;
    }
  }
  co_return res;
}

Result<RemoteLaunchSpec> RemoteSandbox::launch_spec(
    std::vector<std::string> argv, const std::string& command, const std::string& cwd,
    const std::map<std::string, std::string>& env) const {
  RemoteLaunchSpec l;
  l.argv = argv.empty() ? std::vector<std::string>{"/bin/sh", "-c", command} : std::move(argv);
  if (!cwd.empty()) l.dir = AB_TRY(runner_path(cwd));
  for (const auto& [k, v] : env_) l.env.push_back(k + "=" + v);
  for (const auto& [k, v] : env) l.env.push_back(k + "=" + v);
  l.limits = limits_;
  return l;
}

asio::awaitable<Result<sandbox::ExecResult>> RemoteSandbox::exec_streamed(
    std::shared_ptr<RunnerConn> conn, sandbox::ExecSpec spec, sandbox::OutputSink* sink) {
  auto l = launch_spec(std::move(spec.argv), spec.command, spec.cwd, spec.env);
  if (!l) co_return std::unexpected(l.error());
  l->with_stdin = !spec.stdin_data.empty();
  auto started = co_await launch_remote(std::move(conn), std::move(*l));
  if (!started) co_return std::unexpected(started.error());
  std::shared_ptr<RemoteStreamState> state = started->state;
  sandbox::RunOptions opts{.timeout = spec.timeout,
                           .max_output_bytes = spec.max_output_bytes,
                           .stdin_data = std::move(spec.stdin_data)};
  asio::awaitable<sandbox::ExecResult> run =
      sandbox::run_process(std::move(started->launched.proc), std::move(opts), sink);
  sandbox::ExecResult res = co_await std::move(run);
  if (!state->lost().empty()) {
    co_return fail(Code::kUnavailable, "exec: " + state->lost());
  }
  co_return res;
}

asio::awaitable<Result<sandbox::Launched>> RemoteSandbox::launch(sandbox::ProcessSpec spec) {
  auto conn = hub_->find(user_);
  if (!conn) co_return fail(Code::kUnavailable, "process: runner " + user_ + " is not connected");
  if (auto st = still_enforced(*conn); !st) co_return std::unexpected(st.error());
  auto l = launch_spec(std::move(spec.argv), spec.command, spec.cwd, spec.env);
  if (!l) co_return std::unexpected(l.error());
  l->with_stdin = spec.stdin_open;
  l->pty = spec.pty;
  auto started = co_await launch_remote(std::move(conn), std::move(*l));
  if (!started) co_return std::unexpected(started.error());
  co_return std::move(started->launched);
}

// A chunked read_file reply (version 1): file_begin, file_chunk..., file_end, each chunk acked
// once it is in `fd`. Returns the size.
Result<std::uint64_t> receive_chunked(RunnerTransfer* t, const RunnerReply& begin, int fd) {
  auto b = AB_TRY(proto::body_as<proto::FileBegin>(begin));
  if (b.size < 0 || b.size > proto::kMaxFileSize) {
    return fail(Code::kTooBig, "read_file: the runner announced " + std::to_string(b.size) +
                                   " bytes, over the " + std::to_string(proto::kMaxFileSize) +
                                   "-byte limit");
  }
  std::int64_t got = 0;
  for (;;) {
    auto f = AB_TRY(t->next(kTransferIdle));
    if (f.type == proto::type::kFileChunk) {
      auto c = AB_TRY(chunk_of(f));
      if (c.offset != got || got + static_cast<std::int64_t>(c.data.size()) > b.size) {
        return fail(Code::kInternal, "read_file: the runner sent a chunk at offset " +
                                         std::to_string(c.offset) + ", expected " +
                                         std::to_string(got));
      }
      AB_TRY(write_all(fd, c.data.data(), c.data.size(), "write(download)"));
      got += static_cast<std::int64_t>(c.data.size());
      t->send(proto::type::kAck, proto::to_json(proto::Ack{got}));
      continue;
    }
    if (f.type != proto::type::kFileEnd) return std::unexpected(bad_reply("read_file", f));
    t->finish();
    auto e = AB_TRY(proto::body_as<proto::FileEnd>(f));
    if (e.size != got) {
      return fail(Code::kInternal, "read_file: the runner ended after " + std::to_string(got) +
                                 " bytes but said " + std::to_string(e.size));
    }
    return static_cast<std::uint64_t>(got);
  }
}

Result<sandbox::FileReader> RemoteSandbox::open_file(const std::string& path) {
  auto target = AB_TRY(runner_path(path));
  auto conn = hub_->find(user_);
  if (!conn) return fail(Code::kUnavailable, "read_file: runner " + user_ + " is not connected");
  RunnerReply r;
  std::shared_ptr<RunnerTransfer> t;
  if (conn->chunked()) {
    // A big file may come back in chunks: the reply is a transfer.
    t = AB_TRY(conn->start_transfer("read_file", proto::to_json(proto::PathRequest{target})));
    r = AB_TRY(t->next(kFileTimeout));
    if (r.type == proto::type::kFileBegin) {
      UniqueFd fd = AB_TRY(scratch_file("agentbox-remote-read"));
      auto size = AB_TRY(receive_chunked(t.get(), r, fd.get()));
      if (::lseek(fd.get(), 0, SEEK_SET) < 0) return fail_errno(errno, "lseek(download)");
      sandbox::FileReader out;
      out.fd = std::move(fd);
      out.size = size;
      return out;
    }
    t->finish();  // a one-frame reply (file_content)
  } else {
    r = AB_TRY(conn->call("read_file", proto::to_json(proto::PathRequest{target}), kFileTimeout));
  }
  return reader_of_content(r);
}

// A file_content reply as a reader: the bytes in an anonymous memory file (the API streams from
// an fd).
Result<sandbox::FileReader> reader_of_content(const RunnerReply& r) {
  if (r.type != proto::type::kFileContent) return std::unexpected(bad_reply("read_file", r));
  auto data = proto::body_as<proto::FileContent>(r);
  if (!data) return std::unexpected(data.error());
  std::string* bytes = &data->data;
  // The bytes go to an anonymous memory file: the API streams from an fd.
  UniqueFd fd(::memfd_create("agentbox-remote-read", MFD_CLOEXEC));
  if (!fd) return fail_errno(errno, "memfd_create");
  AB_TRY(write_all(fd.get(), bytes->data(), bytes->size(), "write(memfd)"));
  if (::lseek(fd.get(), 0, SEEK_SET) < 0) return fail_errno(errno, "lseek(memfd)");
  sandbox::FileReader out;
  out.fd = std::move(fd);
  out.size = bytes->size();
  return out;
}

Result<sandbox::FileReader> RemoteSandbox::open_file_streamed(const std::string& path) {
  auto conn = hub_->find(user_);
  if (!conn || !conn->binary()) return open_file(path);
  // Version 3: a big file is handed to the reader while it arrives (remote_transfer.h).
  auto target = AB_TRY(runner_path(path));
  auto t = AB_TRY(conn->start_transfer("read_file", proto::to_json(proto::PathRequest{target})));
  auto r = AB_TRY(t->next(kFileTimeout));
  if (r.type == proto::type::kFileBegin) return stream_download(std::move(t), r);
  t->finish();  // a one-frame reply (file_content)
  return reader_of_content(r);
}

Result<std::unique_ptr<sandbox::FileWriter>> RemoteSandbox::create_file(
    const std::string& path, sandbox::WriteOptions opts) {
  AB_TRY(runner_path(path));
  return std::unique_ptr<sandbox::FileWriter>(new RemoteWriter(this, path, opts));
}

Result<sandbox::FileInfo> RemoteSandbox::stat(const std::string& path) {
  auto target = AB_TRY(runner_path(path));
  auto r = AB_TRY(call("stat", proto::to_json(proto::PathRequest{target})));
  if (r.type != proto::type::kFileInfo) return std::unexpected(bad_reply("stat", r));
  auto info = AB_TRY(proto::body_as<proto::FileInfo>(r));
  sandbox::FileInfo fi;
  fi.name = info.name;
  fi.path = path;
  fi.size = static_cast<std::uint64_t>(std::max<std::int64_t>(0, info.size));
  fi.mode = proto::st_mode_from_go_mode(info.mode);
  fi.is_dir = info.is_dir;
  if (fi.is_dir) fi.mode = (fi.mode & ~S_IFMT) | S_IFDIR;
  fi.is_symlink = S_ISLNK(fi.mode);
  if (auto t = proto::parse_mod_time(info.mod_time)) fi.mod_time_ns = *t * 1'000'000'000;
  return fi;
}

Result<std::vector<sandbox::DirEntry>> RemoteSandbox::read_dir(const std::string& path) {
  auto target = AB_TRY(runner_path(path));
  auto r = AB_TRY(call("read_dir", proto::to_json(proto::PathRequest{target})));
  if (r.type != proto::type::kDirEntries) return std::unexpected(bad_reply("read_dir", r));
  auto entries = AB_TRY(proto::body_as<proto::DirEntries>(r));
  std::vector<sandbox::DirEntry> out;
  for (const proto::DirEntry& e : entries.entries) {
    if (e.name.empty() || e.name.find('/') != std::string::npos) continue;
    sandbox::DirEntry d;
    d.name = e.name;
    d.is_dir = e.is_dir;
    d.size = static_cast<std::uint64_t>(std::max<std::int64_t>(0, e.size));
    d.mode = d.is_dir ? S_IFDIR : S_IFREG;  // the protocol sends no mode or time per entry
    out.push_back(std::move(d));
  }
  std::sort(out.begin(), out.end(),
            [](const sandbox::DirEntry& a, const sandbox::DirEntry& b) { return a.name < b.name; });
  return out;
}

Status RemoteSandbox::mkdir_all(const std::string& path) {
  auto target = AB_TRY(runner_path(path));
  return expect_ok("mkdir_all",
                   proto::to_json(proto::MkdirAllRequest{target, proto::go_perm_from_mode(0755)}));
}

Status RemoteSandbox::remove(const std::string& path) {
  auto target = AB_TRY(runner_path(path));
  if (target == workspace_) return fail(Code::kAccess, "remove: the workspace itself");
  auto st = expect_ok("remove", proto::to_json(proto::PathRequest{target}));
  // xbot's runner reports ENOTEMPTY as EEXIST (PROTOCOLS.md 1.3).
  if (!st && st.error().code == Code::kExists) {
    return fail(Code::kNotEmpty, "remove(" + path + "): directory not empty");
  }
  return st;
}

Status RemoteSandbox::remove_all(const std::string& path) {
  auto target = AB_TRY(runner_path(path));
  if (target == workspace_) return fail(Code::kAccess, "remove: the workspace itself");
  return expect_ok("remove_all", proto::to_json(proto::PathRequest{target}));
}

}  // namespace

Result<std::unique_ptr<sandbox::Sandbox>> RemoteBackend::create(sandbox::BoxConfig config) {
  if (config.runner.empty()) {
    return fail(Code::kInvalid, "runner: a remote session names its runner (\"runner\": USER)");
  }
  // config.mounts are the daemon's shared and read-only dirs and global skills: they are not on
  // the runner's machine (skills and agents are synced to it instead). A session's own mounts
  // and skills are refused when it is created (v1_sessions.cc).
  if (config.egress_policy || config.open_network) {
    return fail(Code::kNotSupported, std::string("network: mode \"") +
                                         (config.open_network ? "open" : "allowlist") +
                                         "\" on a remote runner (only \"none\")");
  }
  // SECURITY (T8): only a runner configured for the session's tenant serves it; to any other
  // tenant it is a runner that does not exist.
  if (!hub_->knows(config.runner) || hub_->tenant_of(config.runner) != config.tenant) {
    return fail(Code::kNotFound, "runner: no runner \"" + config.runner + "\"");
  }
  auto conn = hub_->find(config.runner);
  if (!conn) {
    return fail(Code::kUnavailable, "runner " + config.runner + " is not connected");
  }
  // The session's limits go with every command to the runner, which enforces each (the runner
  // that registered now may enforce less than the one the session was created on).
  proto::BoxLimits limits;
  for (const auto& [name, value] : sandbox::set_limits(config.limits)) {
    AB_TRY(require_enforced(conn->identity(), name));
    limits.limits[name] = value;
  }
  if (!limits.limits.empty()) limits.box = config.key;
  return std::unique_ptr<sandbox::Sandbox>(new RemoteSandbox(
      hub_, config.runner, conn->identity().workspace, std::move(config.env), std::move(limits)));
}

Status RemoteBackend::check_spec(const sandbox::SpecRequest& req) {
  if (req.network_mode != "none") {
    return fail(Code::kNotSupported, "network: mode \"" + req.network_mode +
                                         "\" on a remote runner (only \"none\": the runner's "
                                         "commands use its machine's network, which agentbox does "
                                         "not police)");
  }
  const auto limits = sandbox::set_limits(req.limits);
  if (limits.empty()) return {};
  // SECURITY (T8): another tenant's runner is one that does not exist (as create() says).
  if (!hub_->knows(req.runner) || hub_->tenant_of(req.runner) != req.tenant) {
    return fail(Code::kNotFound, "runner: no runner \"" + req.runner + "\"");
  }
  // A runner not connected now: its limits are checked when its box starts (create()).
  auto conn = hub_->find(req.runner);
  if (!conn) return {};
  for (const auto& [name, value] : limits) {
    (void)value;
    AB_TRY(require_enforced(conn->identity(), name));
  }
  return {};
}

}  // namespace agentbox::remote
