// The REST side of the E2B dialect's files (shared/E2B-MCP.md 3.4): envd's /files, downloads
// (gzip when the client takes it, else sendfile) and uploads as multipart/form-data or
// application/octet-stream, either optionally gzip, into atomic writers; and the path and user
// rules both file sides share (e2b.h). filesystem.Filesystem is e2b_filesystem.cc.
//
// Paths: relative ones (and "~") resolve to /workspace, the E2B home of every sandbox; replies
// name absolute in-box paths. Errors: {"code":<status>,"message"} with envd's statuses (404
// missing, 400 a directory or bad input, 507 no space).
//
// Refused, by name: signed URLs (signature=...), X-Metadata-* headers (file metadata, envd
// 0.6.2).
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

// ---- paths and users (e2b.h)

// An envd path as an absolute in-box path: relative ones and "~" are under /workspace.
Result<std::string> box_path(std::string_view p) {
  std::string s(p);
  if (s.empty() || s == "~") return std::string(kE2bHome);
  if (s.rfind("~/", 0) == 0) s = std::string(kE2bHome) + s.substr(1);
  return sandbox::normalize_box_path(s, kE2bHome);
}

std::string parent_of(const std::string& abs) {
  auto slash = abs.find_last_of('/');
  return slash == 0 || slash == std::string::npos ? "/" : abs.substr(0, slash);
}

std::string base_of(const std::string& abs) {
  auto slash = abs.find_last_of('/');
  return slash == std::string::npos ? abs : abs.substr(slash + 1);
}

// The in-box user name of a uid: the session's own is "user" (E2B's default user).
std::string user_name(const sandbox::Sandbox& sb, uid_t id) {
  std::optional<uid_t> own = sb.uid();
  if (own ? id == *own : id == ::geteuid()) return "user";
  if (id == 0) return "root";
  return std::to_string(id);
}

// ?username= and Authorization's user name a user; agentbox has one per sandbox (e2b.cc).
std::optional<std::string> bad_user(const EnvdCall* env, const std::string& username) {
  if (username.empty() || username == "user" || username == "root" ||
      username == env->sandbox_id) {
    return std::nullopt;
  }
  return "user '" + username +
         "' does not exist in this sandbox (it has one user: 'user', also known as 'root')";
}

namespace {

using connectrpc::CallKind;
using SandboxPtr = std::shared_ptr<sandbox::Sandbox>;

// Upload bodies move in pieces of this size through inflate, multipart and the writers.
constexpr std::size_t kUploadChunk = 256u << 10;
// Downloads bigger than this are read and gzipped in pieces of this size.
constexpr std::size_t kDownloadChunk = 256u << 10;

// ---- errors

// envd REST statuses (E2B-MCP.md 3.4): the SDK turns 400 into InvalidArgumentError, 404 into
// FileNotFoundError, 507 into NotEnoughSpaceError.
int rest_status(const Error& e) {
  switch (e.code) {
    case Code::kInvalid:
    case Code::kNotDir:
    case Code::kIsDir:
    case Code::kNotEmpty:
      return 400;
    case Code::kUnauthorized: return 401;
    case Code::kAccess: return 403;
    case Code::kNotFound: return 404;
    case Code::kExists: return 409;
    case Code::kTooBig: return 413;
    case Code::kQuota: return 507;
    case Code::kTimedOut: return 504;
    case Code::kUnavailable: return 503;
    case Code::kInternal: return 500;
    case Code::kNotSupported: return 501;
    case Code::kImage: return 422;
    case Code::kUpstream: return 502;
  }
  return 500;
}

Reply rest_error(int status, std::string message) { return e2b_error(status, std::move(message)); }

Reply rest_error(const Error& e) {
  return e2b_error(rest_status(e), std::string(code_name(e.code)) + ": " + e.message);
}
// ---- REST /files

// GET /files?path=P: the file's bytes; gzip when the client takes it (envd does the same; every
// SDK request says Accept-Encoding: gzip), else sendfile(2).
asio::awaitable<bool> get_files(EnvdCall* env, std::string abs, bool gzip) {
  Call* call = env->call;
  Context* ctx = call->ctx;
  auto box = co_await envd_sandbox(env);
  if (!box) co_return co_await send_reply(call, rest_error(box.error()));
  SandboxPtr sb = std::move(*box);
  auto open_job = run_blocking(ctx->pool, [sb, abs] { return sb->open_file(abs); });
  auto reader = co_await std::move(open_job);
  if (!reader) co_return co_await send_reply(call, rest_error(reader.error()));
  // An empty file goes out as Content-Length: 0 (the SDK special-cases it).
  if (!gzip || reader->size == 0) co_return co_await send_file(call, std::move(*reader), abs);

  Exchange* ex = &call->ex;
  http::response<http::empty_body> res{http::status::ok, ex->version};
  res.set(http::field::server, "agentboxd");
  res.set(http::field::content_type, "application/octet-stream");
  res.set(http::field::content_encoding, "gzip");
  res.set(http::field::vary, "Accept-Encoding");
  const bool keep = ex->keep_alive && !ex->body_pending && !ctx->stopping;
  res.keep_alive(keep);
  res.chunked(true);
  if (!co_await write_head(call, res)) co_return false;
  auto deflater = std::make_shared<GzipDeflater>(1);  // fast: the network is the slow side
  auto file = std::make_shared<sandbox::FileReader>(std::move(*reader));
  std::uint64_t offset = 0;
  for (;;) {
    auto job = run_blocking(ctx->pool, [file, deflater, offset] {
      std::string in(kDownloadChunk, '\0');
      ssize_t n = ::pread(file->fd.get(), in.data(), in.size(), static_cast<off_t>(offset));
      if (n < 0) return Result<std::pair<std::size_t, std::string>>(fail_errno(errno, "read"));
      std::string out;
      deflater->feed(std::string_view(in.data(), static_cast<std::size_t>(n)), &out);
      if (n == 0) deflater->finish(&out);
      return Result<std::pair<std::size_t, std::string>>(
          std::make_pair(static_cast<std::size_t>(n), std::move(out)));
    });
    auto step = co_await std::move(job);
    if (!step) {
      // After the head went out, all we can do is cut the connection (a short gzip stream).
      spdlog::info("conn={} req={} e2b GET {} failed mid-way: {}", call->conn->id, ex->req.id, abs,
                   step.error().message);
      co_return false;
    }
    offset += step->first;
    if (!step->second.empty()) {
      if (!co_await write_stream(ctx, call->conn, /*chunked=*/true, step->second)) co_return false;
    }
    if (step->first == 0) break;
  }
  if (!co_await end_stream(ctx, call->conn, /*chunked=*/true)) co_return false;
  co_return keep;
}

// One upload in progress: the body goes through inflate (Content-Encoding) and the multipart
// parser (multipart/form-data) into atomic writers; nothing is committed before the whole body
// has arrived and parsed, so a bad or cut body leaves every target as it was. Used by one pool
// job at a time.
struct Upload {
  SandboxPtr sb;
  std::optional<std::string> query_path;  // ?path=, absolute
  std::unique_ptr<Inflater> inflater;
  std::unique_ptr<MultipartParser> parser;  // null: the body is the file (octet-stream)
  std::uint64_t max_bytes = 0;
  struct File {
    std::string path;
    std::unique_ptr<sandbox::FileWriter> writer;
  };
  std::vector<File> files;
  sandbox::FileWriter* current = nullptr;  // the part being written; null: a part ignored
  std::set<std::string> seen;

  Status open_file(const std::string& abs) {
    if (!seen.insert(abs).second) {
      return fail(Code::kInvalid, "you cannot upload multiple files to the same path '" + abs +
                                      "' in one upload request");
    }
    sandbox::WriteOptions opts;
    opts.mkdirs = true;
    opts.max_bytes = max_bytes;
    auto w = sb->create_file(abs, opts);
    if (!w) return std::unexpected(w.error());
    files.push_back({abs, std::move(*w)});
    current = files.back().writer.get();
    return {};
  }

  Status on_event(MultipartEvent& ev) {
    switch (ev.kind) {
      case MultipartEvent::Kind::kBegin: {
        current = nullptr;
        if (ev.head.name != "file") return {};  // envd ignores other fields
        std::string dest;
        if (query_path) {
          dest = *query_path;
        } else {
          if (!ev.head.filename || ev.head.filename->empty()) {
            return fail(Code::kInvalid,
                        "a 'file' part has no filename and the request has no ?path=: where "
                        "should it go?");
          }
          auto abs = box_path(*ev.head.filename);
          if (!abs) {
            Error e = abs.error();
            e.message = "part filename: " + e.message;
            return std::unexpected(std::move(e));
          }
          dest = *abs;
        }
        return open_file(dest);
      }
      case MultipartEvent::Kind::kData:
        return current ? current->write(ev.data) : Status{};
      case MultipartEvent::Kind::kEnd:
        current = nullptr;
        return {};
    }
    return {};
  }

  // The next bytes of the body, as they came off the wire.
  Status feed(std::string_view wire) {
    std::string inflated;
    std::string_view data = wire;
    if (inflater) {
      if (auto s = inflater->feed(wire, &inflated); !s) return s;
      data = inflated;
    }
    if (!parser) return current->write(data);
    std::vector<MultipartEvent> events;
    if (auto s = parser->feed(data, &events); !s) return s;
    for (MultipartEvent& ev : events) {
      if (auto s = on_event(ev); !s) return s;
    }
    return {};
  }

  // The body has ended and parsed whole (its files are committed by the caller, through
  // service::Files::commit, in the order they came).
  Status finish() {
    if (inflater) {
      if (auto s = inflater->finish(); !s) return s;
    }
    if (parser) {
      if (auto s = parser->finish(); !s) return s;
      if (files.empty()) {
        return fail(Code::kInvalid, "the multipart body has no part named 'file'");
      }
    }
    return {};
  }
};

asio::awaitable<bool> post_files(EnvdCall* env, std::optional<std::string> query_path,
                                 std::string content_type, std::string content_encoding) {
  Call* call = env->call;
  Context* ctx = call->ctx;
  Exchange* ex = &call->ex;
  auto up = std::make_shared<Upload>();
  up->query_path = std::move(query_path);
  up->max_bytes = ctx->opts.max_file_bytes;
  if (!content_encoding.empty() && content_encoding != "identity") {
    auto inf = Inflater::make(content_encoding, ctx->opts.max_file_bytes);
    if (!inf) co_return co_await send_reply(call, rest_error(inf.error()));
    up->inflater = std::move(*inf);
  }
  std::string media = content_type.substr(0, content_type.find(';'));
  while (!media.empty() && media.back() == ' ') media.pop_back();
  std::transform(media.begin(), media.end(), media.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (media == "application/octet-stream") {
    if (!up->query_path) {
      co_return co_await send_reply(
          call, rest_error(400, "path query parameter is required for an application/"
                                "octet-stream upload"));
    }
  } else if (media.rfind("multipart/", 0) == 0) {
    auto boundary = MultipartParser::boundary_of(content_type);
    if (!boundary) co_return co_await send_reply(call, rest_error(boundary.error()));
    up->parser = std::make_unique<MultipartParser>(std::move(*boundary));
  } else {
    co_return co_await send_reply(
        call, rest_error(400, "unsupported Content-Type '" + content_type +
                                  "': expected multipart/form-data or application/octet-stream"));
  }
  // Framing included, a body may be a little over the file cap.
  const std::uint64_t wire_cap = ctx->opts.max_file_bytes + (1u << 20);
  Error too_big = Error::make(Code::kTooBig, "upload is over the limit of " +
                                                 std::to_string(ctx->opts.max_file_bytes) +
                                                 " bytes");
  if (ex->content_length && *ex->content_length > wire_cap) {
    co_return co_await send_reply(call, rest_error(too_big));
  }
  auto box = co_await envd_sandbox(env);
  if (!box) co_return co_await send_reply(call, rest_error(box.error()));
  up->sb = std::move(*box);
  if (!up->parser) {
    std::string p = *up->query_path;
    auto open_job = run_blocking(ctx->pool, [up, p] { return up->open_file(p); });
    auto opened = co_await std::move(open_job);
    if (!opened) co_return co_await send_reply(call, rest_error(opened.error()));
  }
  if (!co_await maybe_continue(call)) co_return false;
  BodyReader body;
  start_body(call, &body, wire_cap);
  auto buf = std::make_shared<std::vector<char>>(kUploadChunk);
  while (ex->body_pending && !body.done()) {
    BodyChunk chunk = co_await read_body_chunk(&body, buf->data(), buf->size());
    ctx->metrics.add_bytes_in(chunk.wire_bytes);
    if (chunk.ec && is_disconnect(chunk.ec)) co_return false;  // nothing committed
    if (chunk.ec) co_return co_await send_reply(call, rest_error(body_error(chunk.ec, too_big)));
    if (chunk.got == 0) continue;
    std::size_t n = chunk.got;
    auto feed_job = run_blocking(ctx->pool, [up, buf, n] {
      return up->feed(std::string_view(buf->data(), n));
    });
    auto fed = co_await std::move(feed_job);
    if (!fed) co_return co_await send_reply(call, rest_error(fed.error()));
  }
  ex->body_pending = false;
  auto finish_job = run_blocking(ctx->pool, [up] { return up->finish(); });
  auto finished = co_await std::move(finish_job);
  if (!finished) co_return co_await send_reply(call, rest_error(finished.error()));
  json out = json::array();
  const service::Origin origin(env->owner, ex->req.id, service::Surface::kE2b);
  for (Upload::File& f : up->files) {
    service::Upload done{service::Lease{env->sandbox_id, up->sb}, f.path, std::move(f.writer)};
    auto size = co_await ctx->svc->files.commit(origin, &done);
    if (!size) co_return co_await send_reply(call, rest_error(size.error()));
    json e = json::object();
    e["name"] = base_of(f.path);
    e["type"] = "file";
    e["path"] = f.path;
    out.push_back(std::move(e));
  }
  co_return co_await send_reply(call, json_reply(200, out));
}
}  // namespace


asio::awaitable<bool> serve_envd_files(EnvdCall* env) {
  Call* call = env->call;
  const Request& req = call->ex.req;
  // Everything the head says, before a body parser takes the head over.
  const std::string content_type = header_value(call, "Content-Type");
  const std::string content_encoding = header_value(call, "Content-Encoding");
  const bool gzip = accepts_gzip(header_value(call, "Accept-Encoding"));
  for (const auto& h : call->hp->get()) {
    std::string name(h.name_string());
    if (name.size() > 11 && beast::iequals(name.substr(0, 11), "x-metadata-")) {
      co_return co_await send_reply(
          call, rest_error(501, "file metadata (" + name +
                                    " headers, envd 0.6.2) is not supported by agentbox"));
    }
  }
  if (req.query.count("signature") || req.query.count("signature_expiration")) {
    co_return co_await send_reply(
        call, rest_error(501, "signed file URLs (signature=...) are not supported by agentbox: "
                              "send the request with the sandbox's X-Access-Token instead"));
  }
  auto username = req.query.find("username");
  if (username != req.query.end()) {
    if (auto why = bad_user(env, username->second)) {
      co_return co_await send_reply(call, rest_error(401, *why));
    }
  }
  std::optional<std::string> path;
  if (auto it = req.query.find("path"); it != req.query.end()) {
    auto abs = box_path(it->second);
    if (!abs) co_return co_await send_reply(call, rest_error(abs.error()));
    path = *abs;
  }
  if (req.method == "GET") {
    if (!path) co_return co_await send_reply(call, rest_error(400, "path query parameter is required"));
    co_return co_await get_files(env, *path, gzip);
  }
  if (req.method == "POST") {
    co_return co_await post_files(env, std::move(path), content_type, content_encoding);
  }
  co_return co_await send_reply(
      call, rest_error(405, req.method + " /files is not an envd route (GET and POST are)"));
}

}  // namespace agentbox::server::detail
