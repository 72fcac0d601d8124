// Node-to-node forwarding of /v1 requests (internal/forward.h). The relay follows Beast's
// buffer_body pattern: the request head (rewritten: no Authorization, the signature added) and
// then its body go to the owner piece by piece as they arrive, and the reply comes back the same
// way, each piece written to the client as soon as it is read (chunked replies stay chunked, so
// an NDJSON line reaches the client when the owner sends it).

#include "server/internal/forward.h"

#include <boost/asio/ip/tcp.hpp>
#include <chrono>

#include "client/client.h"
#include "cluster/forward_auth.h"
#include "common/log.h"
#include "server/internal/blocking.h"
#include "server/internal/transport.h"
#include "service/placement.h"

namespace agentbox::server::detail {
namespace {

constexpr std::size_t kRelayChunk = 256 * 1024;

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "http://host:port" -> host, port.
bool split_url(const std::string& url, std::string* host, std::string* port) {
  constexpr std::string_view kHttp = "http://";
  if (url.rfind(kHttp, 0) != 0) return false;
  std::string rest = url.substr(kHttp.size());
  auto colon = rest.rfind(':');
  if (colon == std::string::npos) return false;
  *host = rest.substr(0, colon);
  *port = rest.substr(colon + 1);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return !host->empty() && !port->empty();
}

// The {id} of a /v1/sessions/{id}... route, or "".
std::string session_of(const Call* call) {
  std::string_view path = call->route->path;
  if (path.rfind("/v1/sessions/{id}", 0) != 0) return {};
  auto it = call->ex.req.params.find("id");
  return it == call->ex.req.params.end() ? std::string() : it->second;
}

// Sends the rewritten request head and its body (if any) to the owner.
asio::awaitable<beast::error_code> relay_request(Call* call, beast::tcp_stream* up,
                                                 const std::string& host_header,
                                                 const std::string& signature, bool* client_gone) {
  Context* ctx = call->ctx;
  if (!co_await maybe_continue(call)) {
    *client_gone = true;
    co_return beast::error_code(asio::error::eof);
  }
  http::request_parser<http::buffer_body> p{std::move(*call->hp)};
  p.body_limit(boost::none);  // the owner enforces its own caps
  auto& msg = p.get();
  msg.erase(http::field::authorization);
  msg.erase(http::field::expect);
  msg.erase(http::field::connection);
  msg.erase("Keep-Alive");
  msg.erase(cluster::kForwardHeader);
  msg.set(http::field::host, host_header);
  msg.set(cluster::kForwardHeader, signature);
  msg.keep_alive(false);  // one request per upstream connection
  msg.version(11);
  http::request_serializer<http::buffer_body> sr{msg};
  up->expires_after(ctx->opts.io_timeout);
  auto [hec, hn] = co_await http::async_write_header(*up, sr, kTuple);
  if (hec) co_return hec;
  std::vector<char> buf(kRelayChunk);
  while (!p.is_done()) {
    msg.body().data = buf.data();
    msg.body().size = buf.size();
    call->conn->stream.expires_after(ctx->opts.io_timeout);
    auto [rec, rn] = co_await http::async_read_some(call->conn->stream, *call->buffer, p, kTuple);
    ctx->metrics.add_bytes_in(rn);
    if (rec == http::error::need_buffer) rec = {};
    if (rec) {
      *client_gone = true;
      co_return rec;
    }
    const std::size_t got = buf.size() - msg.body().size;
    if (got == 0 && !p.is_done()) continue;
    msg.body().data = buf.data();
    msg.body().size = got;
    msg.body().more = !p.is_done();
    up->expires_after(ctx->opts.io_timeout);
    auto [wec, wn] = co_await http::async_write(*up, sr, kTuple);
    if (wec == http::error::need_buffer) wec = {};
    if (wec) co_return wec;
  }
  if (!sr.is_done()) {
    msg.body().data = nullptr;
    msg.body().size = 0;
    msg.body().more = false;
    auto [wec, wn] = co_await http::async_write(*up, sr, kTuple);
    if (wec == http::error::need_buffer) wec = {};
    if (wec) co_return wec;
  }
  call->ex.body_pending = false;
  co_return beast::error_code{};
}

}  // namespace

Result<session::Caller> forwarded_caller(Context* ctx, std::string_view header,
                                         std::string_view method, std::string_view target) {
  const std::string& secret = ctx->opts.cluster_secret;
  auto f = cluster::verify_forward(secret, header, method, target, unix_now());
  if (!f) return std::unexpected(f.error());
  if (ctx->opts.tenants.empty()) {
    if (f->tenant != kDefaultTenant) {
      return fail(Code::kUnauthorized,
                  "forwarded request refused: tenant '" + f->tenant + "' is not known here");
    }
    return session::Caller{kDefaultTenant, false, 0};
  }
  for (const TenantConfig& t : ctx->opts.tenants) {
    if (t.name == f->tenant) return session::Caller{t.name, t.admin, t.max_sessions};
  }
  return fail(Code::kUnauthorized,
              "forwarded request refused: tenant '" + f->tenant + "' is not known here");
}

asio::awaitable<std::optional<bool>> forward_if_remote(Call* call, const std::string& target) {
  Context* ctx = call->ctx;
  cluster::Cluster* cl = ctx->opts.cluster.get();
  if (cl == nullptr || call->ex.req.forwarded) co_return std::nullopt;
  const std::string id = session_of(call);
  if (id.empty()) co_return std::nullopt;
  auto owner = cl->owner(id);
  if (!owner) {
    // Not in the cache: made here (not entered yet), unknown, or made on another node a moment
    // ago (the watch has not told us yet): ask etcd.
    session::SessionManager* sm = ctx->sessions;
    auto job = run_blocking(ctx->pool, [cl, sm, id]() -> Result<std::optional<cluster::Owner>> {
      if (sm->get(id, session::Caller::daemon())) return std::optional<cluster::Owner>();
      return cl->lookup(id);
    });
    auto looked = co_await std::move(job);
    if (looked) owner = std::move(*looked);
  }
  if (!owner || owner->self) co_return std::nullopt;
  if (!owner->up) co_return co_await send_error(call, service::elsewhere_error(id, *owner));
  if (call->route->kind == RouteKind::kWebSocket) {
    co_return co_await send_error(
        call, Error::make(Code::kNotSupported,
                          "session " + id + " is on node " + owner->node + " (" + owner->advertise +
                              "): forwarding WebSocket routes is not built in this version; "
                              "connect to that node"));
  }
  std::string host, port;
  if (!split_url(owner->advertise, &host, &port)) {
    co_return co_await send_error(
        call, Error::make(Code::kUnavailable, "session " + id + " is on node " + owner->node +
                                                  ", whose address '" + owner->advertise +
                                                  "' is not http://host:port"));
  }
  auto exec = call->conn->stream.get_executor();
  tcp::resolver resolver(exec);
  auto [rec, results] = co_await resolver.async_resolve(host, port, kTuple);
  beast::tcp_stream up(exec);
  beast::error_code cec = rec;
  if (!cec) {
    up.expires_after(std::chrono::seconds(5));
    auto [ec2, ep] = co_await up.async_connect(results, kTuple);
    cec = ec2;
  }
  if (cec) {
    co_return co_await send_error(
        call, Error::make(Code::kUnavailable, "session " + id + " is on node " + owner->node +
                                                  " (" + owner->advertise +
                                                  "), which cannot be reached: " + cec.message()));
  }
  beast::error_code nd;
  up.socket().set_option(tcp::no_delay(true), nd);
  const Request& req = call->ex.req;
  const std::string signature =
      cluster::sign_forward(ctx->opts.cluster_secret, req.method, target, req.caller.tenant,
                            req.caller.tenant, unix_now());
  bool client_gone = false;
  beast::error_code wec =
      co_await relay_request(call, &up, host + ":" + port, signature, &client_gone);
  if (client_gone) co_return false;
  // A write error may still leave a reply to read (the owner refused early and closed).
  http::response_parser<http::buffer_body> rp;
  rp.body_limit(boost::none);
  beast::flat_buffer ubuf;
  up.expires_after(ctx->opts.io_timeout);
  auto [hec, hn] = co_await http::async_read_header(up, ubuf, rp, kTuple);
  if (hec) {
    std::string why = (wec ? wec : hec).message();
    co_return co_await send_error(
        call, Error::make(Code::kUnavailable, "session " + id + " is on node " + owner->node +
                                                  ", which did not answer: " + why));
  }
  auto& res = rp.get();
  const bool framed = res.chunked() || rp.content_length().has_value() || rp.is_done();
  const bool keep = call->ex.keep_alive && framed && !ctx->stopping && !call->ex.body_pending;
  res.erase(http::field::connection);
  res.erase("Keep-Alive");
  res.version(call->ex.version);
  res.keep_alive(keep);
  http::response_serializer<http::buffer_body> sr{res};
  Conn* conn = call->conn;
  conn->stream.expires_after(ctx->opts.io_timeout);
  auto [whec, whn] = co_await http::async_write_header(conn->stream, sr, kTuple);
  ctx->metrics.add_bytes_out(whn);
  log_request(call, res.result_int());
  if (whec) co_return false;
  std::vector<char> buf(kRelayChunk);
  while (!rp.is_done()) {
    res.body().data = buf.data();
    res.body().size = buf.size();
    up.expires_never();  // a command may be silent for long; the owner bounds it
    auto [bec, bn] = co_await http::async_read_some(up, ubuf, rp, kTuple);
    if (bec == http::error::need_buffer) bec = {};
    if (bec) co_return false;  // the owner went away mid-reply: the client sees a cut reply
    const std::size_t got = buf.size() - res.body().size;
    if (got == 0 && !rp.is_done()) continue;
    res.body().data = buf.data();
    res.body().size = got;
    res.body().more = !rp.is_done();
    conn->stream.expires_after(ctx->opts.io_timeout);
    auto [cwec, cwn] = co_await http::async_write(conn->stream, sr, kTuple);
    ctx->metrics.add_bytes_out(cwn);
    if (cwec == http::error::need_buffer) cwec = {};
    if (cwec) co_return false;  // the client left: closing `up` tells the owner
  }
  if (!sr.is_done()) {
    res.body().data = nullptr;
    res.body().size = 0;
    res.body().more = false;
    auto [cwec, cwn] = co_await http::async_write(conn->stream, sr, kTuple);
    ctx->metrics.add_bytes_out(cwn);
    if (cwec == http::error::need_buffer) cwec = {};
    if (cwec) co_return false;
  }
  co_return keep;
}

asio::awaitable<Reply> forward_small(Context* ctx, std::string advertise, std::string method,
                                     std::string target, std::string body, session::Caller caller) {
  const std::string signature = cluster::sign_forward(ctx->opts.cluster_secret, method, target,
                                                      caller.tenant, caller.tenant, unix_now());
  auto job = run_blocking(
      ctx->pool, [advertise, method, target, body, signature]() -> Result<client::Response> {
        client::ClientOptions o;
        o.server = advertise;
        o.timeout = std::chrono::seconds(30);
        client::Client c(std::move(o));
        return c.request(method, target, body, "application/json",
                         {{cluster::kForwardHeader, signature}});
      });
  auto r = co_await std::move(job);
  if (!r) {
    co_return error_reply(Error::make(
        Code::kUnavailable, "node at " + advertise + " cannot be reached: " + r.error().message));
  }
  Reply out;
  out.status = r->status;
  out.body = std::move(r->body);
  auto ct = r->headers.find("content-type");
  if (ct != r->headers.end()) out.content_type = ct->second;
  co_return out;
}

}  // namespace agentbox::server::detail
