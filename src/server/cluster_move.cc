// POST /v1/sessions/{id}/move {"node"} (API.md "Cluster"): the owner of a session hands it to
// another live node, all or nothing, so that an operator can drain a node:
//   0. a journal (data_dir/moving/<id>) is written, and the target told the session is coming
//      (?expect: it marks data_dir/incoming/<id> and makes no session of that id meanwhile, so
//      an exec that creates cannot make it anew, empty, there);
//   1. the catalog entry goes from this node to the target (one compare-and-swap transaction on
//      the entry as it is, through etcd's JSON gateway), so no node can place the id anew and
//      requests go to the target from now on (the session is "suspended on the way");
//   2. the session is archived and destroyed here (its box stops first: nothing writes); its
//      catalog entry is the target's already, so it stays;
//   3. the archive streams to the target (POST /v1/cluster/sessions/{id}/receive, signed, with
//      the session's spec), which restores it under the session's tenant.
// A failure after 1 swaps the entry back, and one after 2 restores the session here from its
// archive (with its spec): the session is on exactly one node whatever happens. The request
// reaches the owner by the ordinary relay (forward.cc), from whichever node received it.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <limits>

#include "client/internal/endpoint.h"
#include "cluster/forward_auth.h"
#include "cluster/move_state.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/text_codec.h"
#include "server/internal/blocking.h"
#include "server/internal/cluster_v1.h"
#include "server/internal/forward.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "server/json_codec.h"
#include "service/placement.h"
#include "service/services.h"
#include "session/store.h"

namespace agentbox::server::detail {
namespace {

constexpr char kSpecHeader[] = "X-Agentbox-Session-Spec";
constexpr std::size_t kChunk = 256 * 1024;

struct Sent {
  int status = 0;
  std::string body;
};

// Streams the archive at `path` to node `advertise` as session `id`'s: the node's reply.
asio::awaitable<Result<Sent>> send_archive(Context* ctx, std::string advertise, std::string id,
                                           std::string path, std::string spec, std::string tenant) {
  auto ep = client::detail::parse_server(advertise);
  if (ep && ep->tls) ep = fail(Code::kInvalid, advertise + " is https://; nodes speak http://");
  if (!ep) co_return fail(Code::kUnavailable, "node address: " + ep.error().message);
  const std::string host = ep->host, port = ep->port;
  auto job_open = run_blocking(ctx->pool, [path]() -> Result<std::pair<int, std::uint64_t>> {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return fail_errno(errno, "open(" + path + ")");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return fail_errno(err, "fstat(" + path + ")");
    }
    return std::pair{fd, static_cast<std::uint64_t>(st.st_size)};
  });
  auto opened = co_await std::move(job_open);
  if (!opened) co_return std::unexpected(opened.error());
  auto fd = std::make_shared<UniqueFd>(opened->first);
  const std::uint64_t size = opened->second;

  auto exec = co_await asio::this_coro::executor;
  tcp::resolver resolver(exec);
  auto [rec, results] = co_await resolver.async_resolve(host, port, kTuple);
  beast::tcp_stream up(exec);
  beast::error_code cec = rec;
  if (!cec) {
    up.expires_after(std::chrono::seconds(5));
    auto [ec2, ep] = co_await up.async_connect(results, kTuple);
    cec = ec2;
  }
  if (cec) co_return fail(Code::kUnavailable, "cannot reach " + advertise + ": " + cec.message());
  const std::string target = "/v1/cluster/sessions/" + id + "/receive";
  http::request<http::empty_body> head{http::verb::post, target, 11};
  head.set(http::field::host, ep->host_header);
  head.set(http::field::content_type, "application/zstd");
  head.content_length(size);
  head.set(kSpecHeader, base64_encode(spec));
  head.set(cluster::kForwardHeader, cluster::sign_forward(ctx->opts.cluster_secret, "POST", target,
                                                          tenant, tenant, unix_now()));
  head.keep_alive(false);
  http::request_serializer<http::empty_body> hs{head};
  up.expires_after(ctx->opts.io_timeout);
  auto [hec, hn] = co_await http::async_write_header(up, hs, kTuple);
  if (hec) co_return fail(Code::kUnavailable, "sending to " + advertise + ": " + hec.message());
  auto buf = std::make_shared<std::vector<char>>(kChunk);
  std::uint64_t left = size;
  while (left > 0) {
    auto job = run_blocking(ctx->pool, [fd, buf]() -> Result<std::size_t> {
      for (;;) {
        ssize_t n = ::read(fd->get(), buf->data(), buf->size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return fail_errno(errno, "read(archive)");
        return static_cast<std::size_t>(n);
      }
    });
    auto got = co_await std::move(job);
    if (!got) co_return std::unexpected(got.error());
    if (*got == 0) co_return fail(Code::kInternal, "the archive " + path + " shrank while sent");
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(*got, left));
    up.expires_after(ctx->opts.io_timeout);
    auto [wec, wn] = co_await asio::async_write(up, asio::buffer(buf->data(), n), kTuple);
    if (wec) co_return fail(Code::kUnavailable, "sending to " + advertise + ": " + wec.message());
    left -= n;
  }
  http::response<http::string_body> res;
  beast::flat_buffer rbuf;
  up.expires_after(std::chrono::minutes(10));  // the restore unpacks the archive first
  auto [rdec, rdn] = co_await http::async_read(up, rbuf, res, kTuple);
  if (rdec) {
    co_return fail(Code::kUnavailable,
                   "node at " + advertise + " did not answer: " + rdec.message());
  }
  co_return Sent{static_cast<int>(res.result_int()), std::move(res.body())};
}

// The catalog entry of session `id` back to this node (a move that failed after the switch).
asio::awaitable<void> swap_back(Context* ctx, std::string id, std::string moved, std::string old) {
  cluster::Cluster* cl = ctx->opts.cluster.get();
  auto job =
      run_blocking(ctx->pool, [cl, id, moved, old] { return cl->swap_entry(id, moved, old); });
  auto back = co_await std::move(job);
  if (!back || !*back) {
    spdlog::error("move of {}: the catalog entry was not switched back: {}", id,
                  back ? "it changed meanwhile" : back.error().message);
  }
}

// The message of the error a node answered with ({"error": {"code", "message"}}), or one
// naming its status.
std::string answered_message(int status, const std::string& body) {
  auto j = json::parse(body, nullptr, false);
  std::string msg = "HTTP " + std::to_string(status);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    msg = j["error"].value("message", msg);
  }
  return msg;
}

// The error a node answered a move's archive with.
Error remote_error(const std::string& node, const Sent& s) {
  const std::string msg = answered_message(s.status, s.body);
  Error e = Error::make(Code::kUnavailable, "node " + node + " did not take the session: " + msg);
  if (s.status == 409) e.code = Code::kExists;
  if (s.status == 429) e.code = Code::kQuota;
  if (s.status == 501) e.code = Code::kNotSupported;
  return e;
}

// Tells node `advertise` that session `id` is coming (`what` "expect": it makes no session of
// that id until the session arrives) or is not ("cancel").
asio::awaitable<Status> tell_target(Context* ctx, std::string advertise, std::string id,
                                    std::string tenant, std::string what) {
  Reply r = co_await forward_small(ctx, advertise, "POST",
                                   "/v1/cluster/sessions/" + id + "/receive?" + what + "=1", "",
                                   session::Caller(tenant, false, 0), std::chrono::seconds(10));
  if (r.status == 200) co_return Status{};
  co_return fail(Code::kUnavailable, "the target node did not take the notice (" + what +
                                         ") of session " + id + ": " +
                                         answered_message(r.status, r.body));
}

// Session `id` back on this node from `path` (with its spec), as its tenant's: the session, or
// an error. The archive goes when the restore took it.
asio::awaitable<Result<session::SessionInfo>> restore_here(Context* ctx, std::uint64_t req_id,
                                                           std::string id, std::string path,
                                                           std::string spec, std::string tenant) {
  // Its spec beside the archive (read by the restore, as on a target).
  auto job_spec =
      run_blocking(ctx->pool, [path, spec] { return cluster::write_spec_sidecar(path, spec); });
  if (auto st = co_await std::move(job_spec); !st) {
    spdlog::warn("req={} move of {}: {}", req_id, id, st.error().message);
  }
  const service::Origin as_owner(session::Caller(tenant, false, 0), req_id, service::Surface::kV1);
  auto back = co_await ctx->svc->sessions.restore(as_owner, id, path);
  if (back) {
    auto job_rm = run_blocking(ctx->pool, [path] { return cluster::remove_archive(path); });
    co_await std::move(job_rm);
  }
  co_return back;
}

}  // namespace

asio::awaitable<Reply> move_session(Context* ctx, Request* req) {
  const std::string id = req->params["id"];
  if (auto st = session::validate_id(id); !st) co_return error_reply(st.error());
  auto body = body_object(req);
  if (!body) co_return error_reply(body.error());
  if (auto st = check_known_fields(*body, {"node"}); !st) co_return error_reply(st.error());
  auto it = body->find("node");
  if (it == body->end() || !it->is_string() || it->get<std::string>().empty()) {
    co_return error_reply(Error::make(Code::kInvalid, "field 'node' must be a node name"));
  }
  const std::string to = it->get<std::string>();
  cluster::Cluster* cl = ctx->opts.cluster.get();
  if (cl == nullptr) {
    co_return error_reply(
        Error::make(Code::kInvalid, "this daemon is not in a cluster (no cluster: configuration)"));
  }
  const service::Origin origin = origin_of(*req, service::Surface::kV1);
  service::Sessions& sessions = ctx->svc->sessions;
  auto info = co_await sessions.get(origin, id);
  if (!info) co_return error_reply(info.error());
  if (to == cl->node()) co_return json_reply(200, encode_session(*info));
  std::optional<cluster::NodeState> target;
  for (const auto& n : cl->nodes()) {
    if (n.name == to) target = n;
  }
  if (!target) {
    co_return error_reply(Error::make(Code::kNotFound, "no node '" + to + "' in the cluster"));
  }
  if (!target->up) {
    co_return error_reply(Error::make(Code::kUnavailable, "node '" + to + "' is down"));
  }
  if (target->cordoned) {
    co_return error_reply(
        Error::make(Code::kExists, "node '" + to + "' is cordoned: it takes no new sessions"));
  }
  if (info->backend == "remote") {
    co_return error_reply(
        Error::make(Code::kNotSupported,
                    "move of a remote session (backend remote): its files are its "
                    "runner's; it follows its runner instead"));
  }
  const std::string spec = session::encode_spec(info->spec);
  const std::string tenant = info->tenant;
  const std::string self = cl->node();
  // 1. The catalog: this node's entry becomes the target's.
  auto job_read = run_blocking(ctx->pool, [cl, id] { return cl->entry(id); });
  auto old = co_await std::move(job_read);
  if (!old) co_return error_reply(old.error());
  auto entry = json::parse(*old, nullptr, false);
  if (!entry.is_object() || entry.value("node", "") != self) {
    co_return error_reply(
        Error::make(Code::kUnavailable, "the session catalog does not name this node (" + self +
                                            ") for session " + id + " (yet): try again"));
  }
  entry["node"] = to;
  const std::string moved_value = entry.dump();
  const std::string jdir = ctx->sessions->config().data_dir;
  cluster::MoveJournal journal{to, *old, moved_value, spec, tenant, ""};
  auto job_j = run_blocking(
      ctx->pool, [jdir, id, journal] { return cluster::write_move_journal(jdir, id, journal); });
  if (auto st = co_await std::move(job_j); !st) co_return error_reply(st.error());
  // The target makes no session of this id (an exec that creates, say) until it arrives.
  if (auto st = co_await tell_target(ctx, target->advertise, id, tenant, std::string("expect"));
      !st) {
    cluster::remove_move_journal(jdir, id);
    co_return error_reply(st.error());
  }
  auto job_swap = run_blocking(
      ctx->pool, [cl, id, o = *old, moved_value] { return cl->swap_entry(id, o, moved_value); });
  auto swapped = co_await std::move(job_swap);
  if (!swapped || !*swapped) {
    (void)co_await tell_target(ctx, target->advertise, id, tenant, std::string("cancel"));
    cluster::remove_move_journal(jdir, id);
    if (!swapped) co_return error_reply(swapped.error());
    co_return error_reply(Error::make(
        Code::kExists, "the catalog entry of session " + id + " changed meanwhile: try again"));
  }
  // 2. Archived and gone here (the entry, now the target's, stays).
  auto archived = co_await sessions.destroy(origin, id, /*archive=*/true);
  if (!archived) {
    co_await swap_back(ctx, id, moved_value, *old);
    (void)co_await tell_target(ctx, target->advertise, id, tenant, std::string("cancel"));
    cluster::remove_move_journal(jdir, id);
    co_return error_reply(archived.error());
  }
  const std::string path = *archived;
  journal.archive = path;
  auto job_j2 = run_blocking(
      ctx->pool, [jdir, id, journal] { return cluster::write_move_journal(jdir, id, journal); });
  if (auto st = co_await std::move(job_j2); !st) {
    spdlog::warn("req={} move of {}: {}", req->id, id, st.error().message);
  }
  // 3. To the target, restored there.
  auto sent = co_await send_archive(ctx, target->advertise, id, path, spec, tenant);
  if (sent && sent->status == 201) {
    auto job = run_blocking(ctx->pool, [path] { return cluster::remove_archive(path); });
    co_await std::move(job);
    cluster::remove_move_journal(jdir, id);
    const service::Fields fields = {{"from", self}, {"to", to}};
    ctx->svc->bus().emit("session.move", origin, id, fields);
    spdlog::info("req={} session {} moved to node {}", req->id, id, to);
    co_return json_reply(200, json::parse(sent->body, nullptr, false));
  }
  Error failed = sent ? remote_error(to, *sent) : sent.error();
  co_await swap_back(ctx, id, moved_value, *old);
  (void)co_await tell_target(ctx, target->advertise, id, tenant, std::string("cancel"));
  // Back here as it was. The session's own tenant owns it again (an admin may move another's).
  auto back = co_await restore_here(ctx, req->id, id, path, spec, tenant);
  if (!back) {
    spdlog::error(
        "req={} move of {} failed ({}), and restoring it here failed too: {} (the "
        "archive {} is kept)",
        req->id, id, failed.message, back.error().message, path);
    cluster::remove_move_journal(jdir, id);
    co_return error_reply(
        Error::make(Code::kInternal, "move of session " + id + " failed (" + failed.message +
                                         ") and its restore here failed too (" +
                                         back.error().message + "); its archive is " + path));
  }
  cluster::remove_move_journal(jdir, id);
  failed.message =
      "session " + id + " was not moved (it stays on node " + self + "): " + failed.message;
  co_return error_reply(failed);
}

namespace {

// One interrupted move (journal data_dir/moving/<id>): whether it is settled.
asio::awaitable<bool> recover_one(Context* ctx, std::string dir, std::string id) {
  auto j = cluster::read_move_journal(dir, id);
  if (!j) {
    spdlog::error("{} (left as it is)", j.error().message);
    co_return true;
  }
  cluster::Cluster* cl = ctx->opts.cluster.get();
  std::optional<cluster::NodeState> target;
  for (const auto& n : cl->nodes()) {
    if (n.name == j->to) target = n;
  }
  if (!target || !target->up) co_return false;  // asked again once it is up
  Reply there =
      co_await forward_small(ctx, target->advertise, "GET", "/v1/sessions/" + id, "",
                             session::Caller(j->tenant, false, 0), std::chrono::seconds(10));
  if (there.status == 200) {  // the move was done: what it left here goes
    if (!j->archive.empty()) (void)cluster::remove_archive(j->archive);
    cluster::remove_move_journal(dir, id);
    spdlog::info("the interrupted move of session {} to node {} had finished", id, j->to);
    co_return true;
  }
  // Not there: 404, or 503 while the target still holds the move's mark (the session is not
  // there either way).
  const bool absent =
      there.status == 404 ||
      (there.status == 503 && there.body.find(service::kMovingHere) != std::string::npos);
  if (!absent) co_return false;
  // Not there: the move is undone. The catalog entry first, then the session.
  auto job = run_blocking(ctx->pool, [cl, id, jj = *j]() -> Result<bool> {
    const std::string cur = AB_TRY(cl->entry(id));
    if (cur == jj.old_value) return true;
    if (cur != jj.moved_value) return false;
    return cl->swap_entry(id, jj.moved_value, jj.old_value);
  });
  auto swapped = co_await std::move(job);
  if (!swapped) co_return false;  // etcd away: later
  if (!*swapped) {
    spdlog::error(
        "the interrupted move of session {}: its catalog entry names neither this node nor {} "
        "(left as it is; its archive, if any, stays in the archives)",
        id, j->to);
    cluster::remove_move_journal(dir, id);
    co_return true;
  }
  // The target may make sessions of this id again (the catalog names this node).
  if (auto st = co_await tell_target(ctx, target->advertise, id, j->tenant, std::string("cancel"));
      !st) {
    co_return false;
  }
  session::SessionManager* sm = ctx->sessions;
  if (!sm->get(id, session::Caller::daemon())) {
    std::string archive = j->archive;
    if (archive.empty()) archive = cluster::newest_archive(sm->archives_dir(), id);
    if (archive.empty()) {
      spdlog::error("the interrupted move of session {}: no session and no archive of it here", id);
    } else {
      auto back = co_await restore_here(ctx, 0, id, archive, j->spec, j->tenant);
      if (!back) {
        spdlog::error("the interrupted move of session {}: restoring it from {} failed: {}", id,
                      archive, back.error().message);
      }
    }
  } else if (auto made = cluster::archive_of_move(dir, sm->archives_dir(), id); !made.empty()) {
    (void)cluster::remove_archive(made);  // killed between its archive and its destroy
  }
  cluster::remove_move_journal(dir, id);
  spdlog::info("the interrupted move of session {} to node {} was undone: it is here", id, j->to);
  co_return true;
}

}  // namespace

asio::awaitable<void> recover_moves(Context* ctx) {
  if (!ctx->opts.cluster) co_return;
  const std::string dir = ctx->sessions->config().data_dir;
  while (!ctx->stopping) {
    auto job = run_blocking(ctx->pool, [dir]() -> Result<std::vector<std::string>> {
      return cluster::move_journals(dir);
    });
    const auto ids = co_await std::move(job);
    bool pending = false;
    for (const std::string& id : ids ? *ids : std::vector<std::string>{}) {
      if (!co_await recover_one(ctx, dir, id)) pending = true;
    }
    if (!pending) co_return;
    asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::seconds(2));
    co_await t.async_wait(kTuple);
  }
}

asio::awaitable<bool> receive_session(Call* call) {
  Context* ctx = call->ctx;
  Request& req = call->ex.req;
  if (!req.forwarded || req.caller.tenant.empty()) {
    call->ex.keep_alive = false;
    co_return co_await send_error(call,
                                  Error::make(Code::kAccess,
                                              "POST /v1/cluster/sessions/{id}/receive is for the "
                                              "nodes of a cluster, not for clients"));
  }
  const std::string id = req.params["id"];
  auto bad = [&](Error e) -> asio::awaitable<bool> {
    call->ex.keep_alive = false;
    co_return co_await send_error(call, std::move(e));
  };
  if (auto st = session::validate_id(id); !st) co_return co_await bad(st.error());
  session::SessionManager* sm = ctx->sessions;
  const std::string data_dir = sm->config().data_dir;
  // ?expect=1: the session is coming (before the catalog names this node); ?cancel=1: it is not.
  const bool expect = req.query.contains("expect"), cancel = req.query.contains("cancel");
  if (expect || cancel) {
    // A cancel follows the catalog's switch back: the mark stays until this node's cache has
    // seen it (5 s at most), or a request here would make the id anew, empty, meanwhile.
    cluster::Cluster* cl = ctx->opts.cluster.get();
    for (int i = 0; cancel && cl && i < 50 && cl->owner(id).value_or(cluster::Owner{}).self; ++i) {
      asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(100));
      co_await t.async_wait(kTuple);
    }
    auto job = run_blocking(ctx->pool, [data_dir, id, expect]() -> Status {
      return expect ? cluster::mark_incoming(data_dir, id) : cluster::unmark_incoming(data_dir, id);
    });
    if (auto st = co_await std::move(job); !st) co_return co_await bad(st.error());
    call->ex.keep_alive = false;
    json done = {{"id", id}, {"expected", expect}};  // (no braced temporary in a co_await)
    co_return co_await send_reply(call, json_reply(200, std::move(done)));
  }
  auto spec_text = base64_decode(header_value(call, kSpecHeader), kSpecHeader);
  if (!spec_text) co_return co_await bad(spec_text.error());
  auto spec = session::decode_spec(*spec_text);
  if (!spec) co_return co_await bad(spec.error());
  const std::string dir = sm->archives_dir();
  const std::string path = dir + "/" + id + "-moved-" + random_hex(8) + ".tar.zst";
  auto job_open = run_blocking(ctx->pool, [dir, path]() -> Result<int> {
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return fail_errno(errno, "mkdir(" + dir + ")");
    }
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return fail_errno(errno, "open(" + path + ")");
    return fd;
  });
  auto opened = co_await std::move(job_open);
  if (!opened) co_return co_await bad(opened.error());
  auto fd = std::make_shared<UniqueFd>(*opened);
  BodyReader r;
  start_body(call, &r, std::numeric_limits<std::uint64_t>::max());
  auto buf = std::make_shared<std::vector<char>>(kChunk);
  Status wrote;
  while (!r.done()) {
    BodyChunk c = co_await read_body_chunk(&r, buf->data(), buf->size());
    ctx->metrics.add_bytes_in(c.wire_bytes);
    if (c.ec) {
      (void)cluster::remove_archive(path);
      if (is_disconnect(c.ec)) co_return false;
      co_return co_await bad(body_error(c.ec, Error::make(Code::kTooBig, "archive too big")));
    }
    const std::size_t n = c.got;
    auto job = run_blocking(ctx->pool, [fd, buf, n]() -> Status {
      std::size_t off = 0;
      while (off < n) {
        ssize_t w = ::write(fd->get(), buf->data() + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return fail_errno(errno, "write(archive)");
        off += static_cast<std::size_t>(w);
      }
      return {};
    });
    wrote = co_await std::move(job);
    if (!wrote) break;
  }
  call->ex.body_pending = !r.done();
  if (wrote) {
    // The spec comes with it (write_spec_sidecar).
    const std::string text = session::encode_spec(*spec);
    auto job = run_blocking(ctx->pool, [fd, path, text]() -> Status {
      if (::fsync(fd->get()) != 0) return fail_errno(errno, "fsync(" + path + ")");
      return cluster::write_spec_sidecar(path, text);
    });
    wrote = co_await std::move(job);
  }
  fd.reset();
  if (!wrote) {
    (void)cluster::remove_archive(path);
    co_return co_await bad(wrote.error());
  }
  auto s = co_await ctx->svc->sessions.restore(origin_of(req, service::Surface::kV1), id, path);
  auto job = run_blocking(ctx->pool, [path, data_dir, id, ok = s.has_value()]() -> Status {
    // Here now: made like any other session from now on.
    if (ok) (void)cluster::unmark_incoming(data_dir, id);
    return cluster::remove_archive(path);
  });
  co_await std::move(job);
  if (!s) co_return co_await send_error(call, s.error());
  spdlog::info("req={} session {} received from another node", req.id, id);
  co_return co_await send_reply(call, json_reply(201, encode_session(*s)));
}

}  // namespace agentbox::server::detail
