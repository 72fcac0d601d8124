// filesystem.Filesystem of the E2B dialect over Connect (shared/E2B-MCP.md 3.3): Stat, ListDir,
// MakeDir, Move, Remove, the WatchDir stream and the polling watchers CreateWatcher /
// GetWatcherEvents / RemoveWatcher. Everything maps onto the session's Sandbox file calls
// (sandbox.h), which resolve every path inside the box; a watch is a DirWatch
// (sandbox/dir_watch.h) on a directory fd the sandbox opened. Errors are Connect codes, as envd
// answers them (invalid_argument for "not a directory", already_exists from MakeDir).
//
// Refused, by name: includeEntry on watches (envd 0.6.3).
//
// Threading: handlers run on the io thread; every file-system call goes to the pool.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <set>

#include "common/log.h"
#include "sandbox/dir_watch.h"
#include "sandbox/path.h"
#include "common/text_codec.h"
#include "dialects/e2b/gzip.h"
#include "server/internal/blocking.h"
#include "dialects/e2b/e2b.h"
#include "server/internal/files.h"
#include "server/internal/transport.h"
#include "dialects/e2b/multipart.h"

namespace agentbox::server::detail {
namespace {

using namespace boost::asio::experimental::awaitable_operators;
using connectrpc::CallKind;
using connectrpc::RpcError;
namespace rpc = connectrpc;
using SandboxPtr = std::shared_ptr<sandbox::Sandbox>;

// Entries one ListDir may return (a depth-unbounded walk of a huge tree is refused, not sent).
constexpr std::size_t kMaxListEntries = 100000;
// Polling watchers (CreateWatcher): at most this many per sandbox; one not polled for
// kWatcherIdle is dropped (a client that forgot RemoveWatcher).
constexpr std::size_t kMaxWatchersPerSandbox = 16;
constexpr std::chrono::minutes kWatcherIdle{10};

// ---- EntryInfo

// Go's os.FileMode.String() of a stat mode ("drwxr-xr-x", "-rw-r--r--", "Lrwxrwxrwx").
std::string permissions_string(std::uint32_t st_mode) {
  std::string s;
  switch (st_mode & S_IFMT) {
    case S_IFDIR: s += 'd'; break;
    case S_IFLNK: s += 'L'; break;
    case S_IFBLK: s += 'D'; break;
    case S_IFCHR: s += "Dc"; break;
    case S_IFIFO: s += 'p'; break;
    case S_IFSOCK: s += 'S'; break;
    default: break;
  }
  if (st_mode & S_ISUID) s += 'u';
  if (st_mode & S_ISGID) s += 'g';
  if (st_mode & S_ISVTX) s += 't';
  if (s.empty()) s = "-";
  static constexpr char kRwx[] = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) s += (st_mode & (0400u >> i)) ? kRwx[i] : '-';
  return s;
}

// protobuf's Timestamp JSON: RFC 3339 in UTC with 0, 3, 6 or 9 fractional digits.
std::string rfc3339(std::int64_t ns) {
  std::int64_t sec = ns >= 0 ? ns / 1000000000 : (ns - 999999999) / 1000000000;
  auto frac = static_cast<long>(ns - sec * 1000000000);
  time_t t = static_cast<time_t>(sec);
  struct tm tm {};
  ::gmtime_r(&t, &tm);
  char buf[64];
  std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::string out(buf, n);
  if (frac != 0) {
    char f[16];
    std::snprintf(f, sizeof f, ".%09ld", frac);
    std::string fs(f);
    while (fs.size() > 4 && fs.compare(fs.size() - 3, 3, "000") == 0) fs.resize(fs.size() - 3);
    out += fs;
  }
  return out + "Z";
}

struct Entry {
  std::string name;
  std::string path;  // absolute in-box
  std::uint32_t st_mode = 0;
  std::uint64_t size = 0;
  std::int64_t mod_time_ns = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string symlink_target;  // absolute; symlinks only
  std::string type;            // FILE_TYPE_*
};

std::string type_of(std::uint32_t st_mode) {
  if (S_ISREG(st_mode)) return "FILE_TYPE_FILE";
  if (S_ISDIR(st_mode)) return "FILE_TYPE_DIRECTORY";
  if (S_ISLNK(st_mode)) return "FILE_TYPE_SYMLINK";
  return "FILE_TYPE_UNSPECIFIED";
}

// Fills in a symlink's target (made absolute) and, like envd, reports the type of what it
// points to when that can be found. Blocking.
void resolve_symlink(sandbox::Sandbox& sb, Entry* e, const std::string& raw_target) {
  if (raw_target.empty()) return;
  std::string t = raw_target.front() == '/' ? raw_target : parent_of(e->path) + "/" + raw_target;
  auto norm = sandbox::normalize_box_path(t, kE2bHome);
  e->symlink_target = norm ? *norm : t;
  if (!norm) return;
  auto target = sb.stat(*norm);
  if (target && !target->is_symlink) e->type = type_of(target->mode);
}

// Stat as envd reports it. Blocking.
Result<Entry> stat_entry(sandbox::Sandbox& sb, const std::string& abs) {
  auto info = sb.stat(abs);
  if (!info) return std::unexpected(info.error());
  Entry e;
  e.name = abs == "/" ? "/" : base_of(abs);
  e.path = abs;
  e.st_mode = info->mode;
  e.size = info->size;
  e.mod_time_ns = info->mod_time_ns;
  e.uid = info->uid;
  e.gid = info->gid;
  e.type = type_of(info->mode);
  if (info->is_symlink) resolve_symlink(sb, &e, info->symlink_target);
  return e;
}

json entry_json(const sandbox::Sandbox& sb, const Entry& e) {
  json j = json::object();
  j["name"] = e.name;
  j["type"] = e.type;
  j["path"] = e.path;
  j["size"] = std::to_string(e.size);  // int64: a decimal string in proto3 JSON
  j["mode"] = e.st_mode & 07777u;      // envd sends FileMode.Perm()
  j["permissions"] = permissions_string(e.st_mode);
  j["owner"] = user_name(sb, e.uid);
  j["group"] = user_name(sb, static_cast<uid_t>(e.gid));
  j["modifiedTime"] = rfc3339(e.mod_time_ns);
  if (!e.symlink_target.empty()) j["symlinkTarget"] = e.symlink_target;
  return j;
}
// ---- errors

// envd's Connect codes for file errors: "not a directory" and "is a directory" are
// invalid_argument there (connect's default mapping of ours says failed_precondition).
RpcError fs_error(const Error& e) {
  RpcError r = rpc::from_error(e);
  if (e.code == Code::kNotDir || e.code == Code::kIsDir) r.code = rpc::Code::kInvalidArgument;
  return r;
}

// ---- request fields (proto3 JSON: lowerCamelCase or the proto name)

const json* field(const json& msg, const char* camel, const char* proto = nullptr) {
  auto it = msg.find(camel);
  if (it == msg.end() && proto) it = msg.find(proto);
  return it == msg.end() || it->is_null() ? nullptr : &*it;
}

std::expected<std::string, RpcError> string_field(const json& msg, const char* camel,
                                                  const char* proto = nullptr) {
  const json* v = field(msg, camel, proto);
  if (!v) return std::string();
  if (!v->is_string()) {
    return std::unexpected(
        RpcError::make(rpc::Code::kInvalidArgument, std::string(camel) + " must be a string"));
  }
  return v->get<std::string>();
}

std::expected<bool, RpcError> bool_field(const json& msg, const char* camel) {
  const json* v = field(msg, camel);
  if (!v) return false;
  if (!v->is_boolean()) {
    return std::unexpected(
        RpcError::make(rpc::Code::kInvalidArgument, std::string(camel) + " must be a boolean"));
  }
  return v->get<bool>();
}

// Fields this version does not know: refused when they ask for something (a value other than
// the default), so a newer SDK's new options are never silently dropped; defaults (false, 0,
// "", empty) ask for nothing and pass, as connect's own decoder would let them.
std::optional<RpcError> unknown_fields(const json& msg, std::initializer_list<const char*> known) {
  for (auto it = msg.begin(); it != msg.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (ok) continue;
    const json& v = it.value();
    const bool is_default = v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
                            (v.is_number() && v == 0) || (v.is_string() && v.empty()) ||
                            ((v.is_object() || v.is_array()) && v.empty());
    if (!is_default) {
      return RpcError::make(rpc::Code::kUnimplemented,
                            "field '" + it.key() + "' is not supported by agentbox");
    }
  }
  return std::nullopt;
}

// A path field as an absolute in-box path; `required` refuses "" (Move's ends).
std::expected<std::string, RpcError> path_field(const json& msg, const char* camel,
                                                bool required = false) {
  auto s = string_field(msg, camel);
  if (!s) return std::unexpected(s.error());
  if (required && s->empty()) {
    return std::unexpected(
        RpcError::make(rpc::Code::kInvalidArgument, std::string(camel) + " is required"));
  }
  auto abs = box_path(*s);
  if (!abs) {
    RpcError e = rpc::from_error(abs.error());
    e.message = std::string(camel) + ": " + e.message;
    return std::unexpected(e);
  }
  return *abs;
}
// ---- filesystem.Filesystem unary methods (each runs in the pool; the reply message or error)

using RpcResult = std::expected<json, RpcError>;

RpcResult do_stat(sandbox::Sandbox& sb, const std::string& abs) {
  auto e = stat_entry(sb, abs);
  if (!e) return std::unexpected(fs_error(e.error()));
  json out = json::object();
  out["entry"] = entry_json(sb, *e);
  return out;
}

RpcResult do_list(sandbox::Sandbox& sb, const std::string& abs, std::uint32_t depth) {
  json entries = json::array();
  // Breadth first; each level's directories (not symlinks to them: envd does not follow them
  // either) are read while the depth allows.
  std::deque<std::pair<std::string, std::uint32_t>> todo{{abs, 1}};
  bool first = true;
  while (!todo.empty()) {
    auto [dir, level] = todo.front();
    todo.pop_front();
    auto list = sb.read_dir(dir);
    if (!list) {
      if (!first && list.error().code == Code::kNotFound) continue;  // gone meanwhile
      return std::unexpected(fs_error(list.error()));
    }
    first = false;
    for (const sandbox::DirEntry& d : *list) {
      Entry e;
      e.name = d.name;
      e.path = dir == "/" ? "/" + d.name : dir + "/" + d.name;
      e.st_mode = d.mode;
      e.size = d.size;
      e.mod_time_ns = d.mod_time_ns;
      e.uid = d.uid;
      e.gid = d.gid;
      e.type = type_of(d.mode);
      if (d.is_symlink) {
        auto info = sb.stat(e.path);
        if (info) resolve_symlink(sb, &e, info->symlink_target);
      }
      if (entries.size() >= kMaxListEntries) {
        return std::unexpected(RpcError::make(
            rpc::Code::kResourceExhausted,
            "ListDir: more than " + std::to_string(kMaxListEntries) + " entries; ask for less depth"));
      }
      entries.push_back(entry_json(sb, e));
      if (d.is_dir && !d.is_symlink && level < depth) todo.emplace_back(e.path, level + 1);
    }
  }
  json out = json::object();
  out["entries"] = std::move(entries);
  return out;
}

// The mutations go through the files operations (service/files.h: one event each).

service::Origin e2b_origin(const EnvdCall* env) {
  return service::Origin(env->owner, env->call->ex.req.id, service::Surface::kE2b);
}

// do_stat() of `abs` in the pool, as the reply of a mutation.
asio::awaitable<RpcResult> stat_reply(EnvdCall* env, SandboxPtr sb, std::string abs) {
  auto job = run_blocking(env->call->ctx->pool, [sb, abs] {
    return Result<RpcResult>(std::in_place, do_stat(*sb, abs));
  });
  auto r = co_await std::move(job);
  if (!r) co_return std::unexpected(fs_error(r.error()));
  co_return std::move(*r);
}

asio::awaitable<RpcResult> make_dir(EnvdCall* env, SandboxPtr sb, std::string abs) {
  service::Files& files = env->call->ctx->svc->files;
  if (auto existing = co_await files.stat(e2b_origin(env), env->sandbox_id, abs); existing) {
    if (existing->is_dir) {
      co_return std::unexpected(
          RpcError::make(rpc::Code::kAlreadyExists, "directory already exists: " + abs));
    }
    co_return std::unexpected(RpcError::make(
        rpc::Code::kInvalidArgument, "path already exists but it is not a directory: " + abs));
  }
  if (auto s = co_await files.mkdir(e2b_origin(env), env->sandbox_id, abs); !s) {
    co_return std::unexpected(fs_error(s.error()));
  }
  co_return co_await stat_reply(env, std::move(sb), std::move(abs));
}

asio::awaitable<RpcResult> move(EnvdCall* env, SandboxPtr sb, std::string from, std::string to) {
  service::Files& files = env->call->ctx->svc->files;
  const service::Origin origin = e2b_origin(env);
  // envd creates the destination's parents; the source must exist first (not_found).
  if (auto src = co_await files.stat(origin, env->sandbox_id, from); !src) {
    co_return std::unexpected(fs_error(src.error()));
  }
  if (auto s = co_await files.mkdir(origin, env->sandbox_id, parent_of(to)); !s) {
    co_return std::unexpected(fs_error(s.error()));
  }
  if (auto s = co_await files.rename(origin, env->sandbox_id, from, to); !s) {
    co_return std::unexpected(fs_error(s.error()));
  }
  co_return co_await stat_reply(env, std::move(sb), std::move(to));
}

asio::awaitable<RpcResult> remove(EnvdCall* env, std::string abs) {
  // envd is os.RemoveAll: recursive, and a missing path is fine.
  auto s = co_await env->call->ctx->svc->files.remove(e2b_origin(env), env->sandbox_id, abs,
                                                      /*recursive=*/true);
  if (!s && s.error().code != Code::kNotFound) co_return std::unexpected(fs_error(s.error()));
  co_return json::object();
}

// ---- watches

json event_json(const sandbox::WatchEvent& ev) {
  static constexpr const char* kTypes[] = {"EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE",
                                           "EVENT_TYPE_REMOVE", "EVENT_TYPE_RENAME",
                                           "EVENT_TYPE_CHMOD"};
  json j = json::object();
  j["name"] = ev.name;
  j["type"] = kTypes[static_cast<int>(ev.op)];
  return j;
}

struct WatchSpec {
  std::string path;
  bool recursive = false;
};

std::expected<WatchSpec, RpcError> decode_watch(const json& msg) {
  if (auto bad = unknown_fields(msg, {"path", "recursive", "includeEntry", "include_entry",
                                      "allowNetworkMounts", "allow_network_mounts"})) {
    return std::unexpected(*bad);
  }
  WatchSpec w;
  auto path = path_field(msg, "path");
  if (!path) return std::unexpected(path.error());
  w.path = *path;
  auto rec = bool_field(msg, "recursive");
  if (!rec) return std::unexpected(rec.error());
  w.recursive = *rec;
  auto entry = bool_field(msg, field(msg, "includeEntry") ? "includeEntry" : "include_entry");
  if (!entry) return std::unexpected(entry.error());
  if (*entry) {
    return std::unexpected(RpcError::make(
        rpc::Code::kUnimplemented, "includeEntry (entries in watch events) is not supported"));
  }
  // allowNetworkMounts: a box has no network file systems to refuse; nothing to do either way.
  return w;
}

// Opens a DirWatch on the sandbox's directory. Blocking.
Result<std::unique_ptr<sandbox::DirWatch>> open_watch(sandbox::Sandbox& sb, const WatchSpec& w) {
  auto fd = sb.open_dir(w.path);
  if (!fd) return std::unexpected(fd.error());
  sandbox::DirWatchOptions opts;
  opts.recursive = w.recursive;
  return sandbox::DirWatch::open(std::move(*fd), w.path, opts);
}

// The polling watchers of CreateWatcher, by id (any sandbox; the id is checked against it).
struct PollWatcher {
  std::string sandbox_id;
  std::shared_ptr<sandbox::DirWatch> watch;
  std::chrono::steady_clock::time_point used;
  bool busy = false;  // a GetWatcherEvents is reading it in the pool
};

class PollWatchers {
 public:
  // Used on the io thread only.
  std::map<std::string, PollWatcher> all;

  void drop_idle() {
    auto now = std::chrono::steady_clock::now();
    for (auto it = all.begin(); it != all.end();) {
      if (!it->second.busy && now - it->second.used > kWatcherIdle) {
        it = all.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::size_t count(const std::string& sandbox_id) const {
    std::size_t n = 0;
    for (const auto& [id, w] : all) n += w.sandbox_id == sandbox_id;
    return n;
  }
};

PollWatchers& poll_watchers() {
  static PollWatchers w;  // io thread only
  return w;
}

std::string new_watcher_id() { return "w-" + random_hex(8); }

// The WatchDir stream: start, then events as they happen, keepalives when quiet, until the
// client leaves, Connect-Timeout-Ms passes (deadline_exceeded, as envd), or the directory is
// gone (the stream ends cleanly).
asio::awaitable<bool> watch_dir(EnvdCall* env, RpcRequest req) {
  Call* call = env->call;
  Context* ctx = call->ctx;
  auto spec = decode_watch(req.message);
  if (!spec) co_return co_await reply_rpc_error(env, CallKind::kServerStream, spec.error());
  auto box = co_await envd_sandbox(env);
  if (!box) {
    co_return co_await reply_rpc_error(env, CallKind::kServerStream, fs_error(box.error()));
  }
  SandboxPtr sb = std::move(*box);
  WatchSpec w = *spec;
  auto open_job = run_blocking(ctx->pool, [sb, w] { return open_watch(*sb, w); });
  auto opened = co_await std::move(open_job);
  if (!opened) {
    co_return co_await reply_rpc_error(env, CallKind::kServerStream, fs_error(opened.error()));
  }
  std::shared_ptr<sandbox::DirWatch> watch = std::move(*opened);

  rpc::StreamWriter out(call);
  json start = {{"start", json::object()}};
  if (!co_await out.send(start)) co_return false;

  auto exec = call->conn->stream.get_executor();
  UniqueFd dup_fd(::fcntl(watch->fd(), F_DUPFD_CLOEXEC, 3));
  if (!dup_fd) {
    co_return co_await out.end(RpcError::make(rpc::Code::kInternal, "dup of the inotify fd"));
  }
  asio::posix::stream_descriptor ready(exec, dup_fd.release());
  const auto deadline = req.timeout ? std::chrono::steady_clock::now() + *req.timeout
                                    : std::chrono::steady_clock::time_point::max();
  asio::steady_timer deadline_timer(exec, deadline);
  asio::steady_timer keepalive(exec);
  bool gone = false;
  tcp::socket* sock = &call->conn->stream.socket();
  std::optional<RpcError> end_error;
  for (;;) {
    keepalive.expires_after(req.keepalive);
    auto readable = ready.async_wait(asio::posix::stream_descriptor::wait_read, kTuple);
    auto ping = keepalive.async_wait(kTuple);
    auto expire = deadline_timer.async_wait(kTuple);
    auto left = watch_disconnect(sock, &gone);
    auto any = std::move(readable) || std::move(ping) || std::move(expire) || std::move(left);
    auto which = co_await std::move(any);
    if (which.index() == 3 || gone) co_return false;  // the client left: nothing to send
    if (which.index() == 2) {
      end_error = RpcError::make(rpc::Code::kDeadlineExceeded,
                                 "the watch reached its Connect-Timeout-Ms");
      break;
    }
    if (which.index() == 1) {
      json k = {{"keepalive", json::object()}};
      if (!co_await out.send(k)) co_return false;
      continue;
    }
    std::shared_ptr<sandbox::DirWatch> wp = watch;
    auto read_job = run_blocking(ctx->pool, [wp] {
      std::vector<sandbox::WatchEvent> evs;
      auto alive = wp->read(&evs);
      using R = Result<std::pair<bool, std::vector<sandbox::WatchEvent>>>;
      if (!alive) return R(std::unexpected(alive.error()));
      return R(std::make_pair(*alive, std::move(evs)));
    });
    auto got = co_await std::move(read_job);
    if (!got) {
      end_error = fs_error(got.error());
      break;
    }
    bool sent = true;
    for (const auto& ev : got->second) {
      json msg = json::object();
      msg["filesystem"] = event_json(ev);
      sent = co_await out.send(msg);
      if (!sent) break;
    }
    if (!sent) co_return false;
    if (!got->first) break;  // the watched directory is gone
  }
  co_return co_await out.end(std::move(end_error));
}
// ---- the unary dispatch

asio::awaitable<bool> unary(EnvdCall* env, std::string method, RpcRequest req) {
  Call* call = env->call;
  Context* ctx = call->ctx;
  const json& msg = req.message;
  auto reply_err = [env](RpcError e) { return reply_rpc_error(env, CallKind::kUnary, e); };

  std::optional<RpcError> bad;
  if (method == "GetWatcherEvents" || method == "RemoveWatcher") {
    bad = unknown_fields(msg, {"watcherId", "watcher_id"});
  } else if (method == "Stat" || method == "MakeDir" || method == "Remove") {
    bad = unknown_fields(msg, {"path"});
  } else if (method == "ListDir") {
    bad = unknown_fields(msg, {"path", "depth"});
  } else if (method == "Move") {
    bad = unknown_fields(msg, {"source", "destination"});
  }
  if (bad) co_return co_await reply_err(*bad);

  if (method == "GetWatcherEvents" || method == "RemoveWatcher") {
    auto id = string_field(msg, "watcherId", "watcher_id");
    if (!id) co_return co_await reply_err(id.error());
    PollWatchers& pw = poll_watchers();
    auto it = pw.all.find(*id);
    if (it == pw.all.end() || it->second.sandbox_id != env->sandbox_id) {
      co_return co_await reply_err(
          RpcError::make(rpc::Code::kNotFound, "watcher '" + *id + "' not found"));
    }
    if (method == "RemoveWatcher") {
      pw.all.erase(it);
      co_return co_await send_reply(call, rpc::unary_ok(json::object()));
    }
    if (it->second.busy) {
      co_return co_await reply_err(RpcError::make(
          rpc::Code::kAborted, "watcher '" + *id + "' is being read by another call"));
    }
    it->second.busy = true;
    it->second.used = std::chrono::steady_clock::now();
    std::shared_ptr<sandbox::DirWatch> wp = it->second.watch;
    auto read_job = run_blocking(ctx->pool, [wp] {
      std::vector<sandbox::WatchEvent> evs;
      auto alive = wp->read(&evs);
      if (!alive) return Result<std::vector<sandbox::WatchEvent>>(std::unexpected(alive.error()));
      return Result<std::vector<sandbox::WatchEvent>>(std::move(evs));
    });
    auto got = co_await std::move(read_job);
    // Looked up again: RemoveWatcher may have run meanwhile.
    auto again = pw.all.find(*id);
    if (again != pw.all.end()) again->second.busy = false;
    if (!got) {
      if (again != pw.all.end()) pw.all.erase(again);  // lost events: the watcher is spent
      co_return co_await reply_err(fs_error(got.error()));
    }
    json events = json::array();
    for (const auto& ev : *got) events.push_back(event_json(ev));
    json out = json::object();
    out["events"] = std::move(events);
    co_return co_await send_reply(call, rpc::unary_ok(out));
  }

  auto box = co_await envd_sandbox(env);
  if (!box) co_return co_await reply_err(fs_error(box.error()));
  SandboxPtr sb = std::move(*box);

  if (method == "CreateWatcher") {
    auto spec = decode_watch(msg);
    if (!spec) co_return co_await reply_err(spec.error());
    PollWatchers& pw = poll_watchers();
    pw.drop_idle();
    if (pw.count(env->sandbox_id) >= kMaxWatchersPerSandbox) {
      co_return co_await reply_err(RpcError::make(
          rpc::Code::kResourceExhausted,
          "this sandbox has " + std::to_string(kMaxWatchersPerSandbox) +
              " watchers already; remove one (RemoveWatcher) first"));
    }
    WatchSpec w = *spec;
    auto open_job = run_blocking(ctx->pool, [sb, w] { return open_watch(*sb, w); });
    auto opened = co_await std::move(open_job);
    if (!opened) co_return co_await reply_err(fs_error(opened.error()));
    std::string id = new_watcher_id();
    pw.all[id] = PollWatcher{env->sandbox_id, std::move(*opened),
                             std::chrono::steady_clock::now(), false};
    json out = json::object();
    out["watcherId"] = id;
    co_return co_await send_reply(call, rpc::unary_ok(out));
  }

  std::function<RpcResult()> job;
  if (method == "MakeDir" || method == "Remove") {
    auto p = path_field(msg, "path");
    if (!p) co_return co_await reply_err(p.error());
    RpcResult r = json::object();
    if (method == "MakeDir") {
      r = co_await make_dir(env, sb, *p);
    } else {
      r = co_await remove(env, *p);
    }
    if (!r) co_return co_await reply_err(r.error());
    co_return co_await send_reply(call, rpc::unary_ok(*r));
  } else if (method == "Move") {
    auto from = path_field(msg, "source", true);
    if (!from) co_return co_await reply_err(from.error());
    auto to = path_field(msg, "destination", true);
    if (!to) co_return co_await reply_err(to.error());
    RpcResult r = co_await move(env, sb, *from, *to);
    if (!r) co_return co_await reply_err(r.error());
    co_return co_await send_reply(call, rpc::unary_ok(*r));
  } else if (method == "Stat") {
    auto p = path_field(msg, "path");
    if (!p) co_return co_await reply_err(p.error());
    std::string abs = *p;
    job = [sb, abs] { return do_stat(*sb, abs); };
  } else if (method == "ListDir") {
    auto p = path_field(msg, "path");
    if (!p) co_return co_await reply_err(p.error());
    std::uint32_t depth = 1;
    if (const json* d = field(msg, "depth")) {
      std::optional<long long> v;
      if (d->is_number_integer()) v = d->get<long long>();
      if (d->is_string()) {
        const std::string& s = d->get_ref<const std::string&>();
        if (!s.empty() && s.size() <= 10 && s.find_first_not_of("0123456789") == std::string::npos) {
          v = std::stoll(s);
        }
      }
      if (!v || *v < 0 || *v > 0xffffffffLL) {
        co_return co_await reply_err(RpcError::make(rpc::Code::kInvalidArgument,
                                                    "depth must be a non-negative integer"));
      }
      if (*v > 0) depth = static_cast<std::uint32_t>(*v);  // 0: envd's default, 1
    }
    std::string abs = *p;
    job = [sb, abs, depth] { return do_list(*sb, abs, depth); };
  } else {
    co_return co_await reply_err(RpcError::make(
        rpc::Code::kUnimplemented, "filesystem.Filesystem/" + method + " does not exist"));
  }
  auto run = run_blocking(ctx->pool, [job] {
    // run_blocking wants a Result: carry the RPC outcome inside one.
    return Result<RpcResult>(std::in_place, job());
  });
  auto done = co_await std::move(run);
  if (!done) co_return co_await reply_err(fs_error(done.error()));
  if (!*done) co_return co_await reply_err(done->error());
  co_return co_await send_reply(call, rpc::unary_ok(**done));
}
}  // namespace

asio::awaitable<bool> serve_filesystem(EnvdCall* env, std::string method) {
  const bool stream = method == "WatchDir";
  static const std::set<std::string> kKnown = {
      "Stat", "ListDir", "MakeDir", "Move", "Remove", "WatchDir",
      "CreateWatcher", "GetWatcherEvents", "RemoveWatcher"};
  // Errors go back in the form the client called in, whatever the method is.
  const CallKind kind =
      rpc::call_kind(header_value(env->call, "Content-Type")).value_or(CallKind::kUnary);
  if (!kKnown.count(method)) {
    co_return co_await reply_rpc_error(
        env, kind,
        RpcError::make(rpc::Code::kUnimplemented,
                       "filesystem.Filesystem/" + method + " does not exist"));
  }
  const CallKind want = stream ? CallKind::kServerStream : CallKind::kUnary;
  bool gone = false;
  auto req = co_await read_rpc(env, want, &gone);
  if (gone) co_return false;
  if (!req) co_return co_await reply_rpc_error(env, kind, req.error());
  if (stream) co_return co_await watch_dir(env, std::move(*req));
  co_return co_await unary(env, std::move(method), std::move(*req));
}
}  // namespace agentbox::server::detail
