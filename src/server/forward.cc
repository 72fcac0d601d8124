// Node-to-node forwarding of /v1 requests (internal/forward.h). The relay follows Beast's
// buffer_body pattern: the request head (rewritten: no Authorization, the signature added) and
// then its body go to the owner piece by piece as they arrive, and the reply comes back the same
// way, each piece written to the client as soon as it is read (chunked replies stay chunked, so
// an NDJSON line reaches the client when the owner sends it).

#include "server/internal/forward.h"

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <charconv>
#include <chrono>

#include "client/client.h"
#include "client/internal/endpoint.h"
#include "cluster/forward_auth.h"
#include "common/clock.h"
#include "common/log.h"
#include "net/splice.h"
#include "server/internal/blocking.h"
#include "server/internal/transport.h"
#include "service/placement.h"

namespace agentbox::server::detail {
namespace {

using namespace boost::asio::experimental::awaitable_operators;

constexpr std::size_t kRelayChunk = 256 * 1024;
constexpr std::size_t kReadRoom = 64 * 1024;  // Beast's largest read
// A body with a length up to this (most JSON requests and answers) is read whole and written
// on with its head in one write: each side wakes once for it, not once for the head and once
// per piece of the body (each wake-up is a scheduling delay on a busy node).
constexpr std::uint64_t kWholeBody = 64 * 1024;

// Whether the body behind a parsed head has a length of 1..kWholeBody bytes.
template <class Parser>
bool small_sized_body(const Parser& p) {
  return !p.is_done() && !p.chunked() && p.content_length() && *p.content_length() <= kWholeBody;
}

// The {id} of a /v1/sessions/{id}... route, or "".
std::string session_of(const Call* call) {
  std::string_view path = call->route->path;
  if (path.rfind("/v1/sessions/{id}", 0) != 0) return {};
  auto it = call->ex.req.params.find("id");
  return it == call->ex.req.params.end() ? std::string() : it->second;
}

// Headers that stay with the first node: the client's bearer token (the signature carries the
// caller; E2B's envd keeps its Basic user), hop-by-hop ones, a forward header of the client's
// own, and the Origin (checked by the first node, whose own origin the owner's is not).
template <class Message>
void strip_for_owner(Message& msg) {
  std::string_view auth = msg[http::field::authorization];
  if (auth.size() >= 7 && beast::iequals(auth.substr(0, 7), "Bearer ")) {
    msg.erase(http::field::authorization);
  }
  msg.erase(http::field::expect);
  msg.erase("Keep-Alive");
  msg.erase(http::field::origin);
  msg.erase(cluster::kForwardHeader);
}

// The client's request head as the owner gets it: stripped (strip_for_owner), for the owner's
// host, signed; one request per upstream connection, but for an upgrade, which keeps its
// Connection: Upgrade (the owner answers 101 and the connection becomes a tunnel).
template <class Message>
void address_to_owner(Message& msg, const std::string& host_header, const std::string& signature,
                      bool upgrade) {
  strip_for_owner(msg);
  msg.set(http::field::host, host_header);
  msg.set(cluster::kForwardHeader, signature);
  if (!upgrade) {
    msg.erase(http::field::connection);
    msg.keep_alive(false);
  }
  msg.version(11);
}

// Sends the rewritten request head and its body (if any) to the owner. An upgrade keeps its
// Connection: Upgrade (the owner answers 101 and the connection becomes a tunnel).
asio::awaitable<beast::error_code> relay_request(Call* call, beast::tcp_stream* up,
                                                 const std::string& host_header,
                                                 const std::string& signature, bool upgrade,
                                                 bool* client_gone) {
  Context* ctx = call->ctx;
  if (!upgrade && !co_await maybe_continue(call)) {
    *client_gone = true;
    co_return beast::error_code(asio::error::eof);
  }
  if (!upgrade && small_sized_body(*call->hp)) {
    http::request_parser<http::string_body> whole{std::move(*call->hp)};
    whole.body_limit(kWholeBody);
    call->conn->stream.expires_after(ctx->opts.io_timeout);
    auto [rec, rn] = co_await http::async_read(call->conn->stream, *call->buffer, whole, kTuple);
    ctx->metrics.add_bytes_in(rn);
    if (rec) {
      *client_gone = true;
      co_return rec;
    }
    call->ex.body_pending = false;
    auto& msg = whole.get();
    address_to_owner(msg, host_header, signature, /*upgrade=*/false);
    up->expires_after(ctx->opts.io_timeout);
    auto [wec, wn] = co_await http::async_write(*up, msg, kTuple);
    co_return wec;
  }
  http::request_parser<http::buffer_body> p{std::move(*call->hp)};
  p.body_limit(boost::none);  // the owner enforces its own caps
  auto& msg = p.get();
  address_to_owner(msg, host_header, signature, upgrade);
  http::request_serializer<http::buffer_body> sr{msg};
  up->expires_after(ctx->opts.io_timeout);
  auto [hec, hn] = co_await http::async_write_header(*up, sr, kTuple);
  if (hec) co_return hec;
  std::vector<char> buf(kRelayChunk);
  // Beast reads as much as the buffer's free capacity (at most 64 KiB a read): without room, a
  // large upload would pass in 512-byte reads.
  if (!p.is_done()) call->buffer->reserve(kReadRoom);
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

// Sends a request whose (small) JSON body the transport read already (the head it came with is
// spent by then): method, target, the JSON body.
asio::awaitable<beast::error_code> send_buffered(Call* call, beast::tcp_stream* up,
                                                 std::string host_header, std::string target,
                                                 std::string signature) {
  const Request& req = call->ex.req;
  http::request<http::string_body> msg{http::string_to_verb(req.method), target, 11};
  msg.set(http::field::host, host_header);
  msg.set(http::field::content_type, "application/json");
  msg.set(cluster::kForwardHeader, signature);
  msg.keep_alive(false);
  msg.body() = req.body;
  msg.prepare_payload();
  up->expires_after(call->ctx->opts.io_timeout);
  auto [ec, n] = co_await http::async_write(*up, msg, kTuple);
  co_return ec;
}

// Bytes one way until either side ends (the tunnel of a forwarded WebSocket).
asio::awaitable<void> pump(tcp::socket* from, tcp::socket* to) {
  std::vector<char> buf(64 * 1024);
  for (;;) {
    auto [ec, n] = co_await from->async_read_some(asio::buffer(buf), kTuple);
    if (ec) co_return;
    auto [wec, wn] = co_await asio::async_write(*to, asio::buffer(buf.data(), n), kTuple);
    if (wec) co_return;
  }
}

// Writes what is left in `buf` to `to`.
asio::awaitable<bool> flush_left(beast::flat_buffer* buf, tcp::socket* to) {
  if (buf->size() == 0) co_return true;
  auto [ec, n] = co_await asio::async_write(*to, buf->data(), kTuple);
  buf->consume(buf->size());
  co_return !ec;
}

// The owner answered an upgrade with 101: its head goes to the client and the two connections
// are joined byte for byte until either side ends (the WebSocket protocol runs end to end;
// pings, closes and frames pass as they are).
asio::awaitable<bool> tunnel(Call* call, beast::tcp_stream* up, beast::flat_buffer* ubuf,
                             http::response_parser<http::buffer_body>* rp) {
  Conn* conn = call->conn;
  http::response<http::empty_body> head{std::move(rp->get().base())};
  conn->stream.expires_after(call->ctx->opts.io_timeout);
  auto [wec, wn] = co_await http::async_write(conn->stream, head, kTuple);
  call->ctx->metrics.add_bytes_out(wn);
  log_request(call, 101);
  if (wec) co_return false;
  conn->stream.expires_never();
  up->expires_never();
  tcp::socket* client = &conn->stream.socket();
  tcp::socket* owner = &up->socket();
  // Shutdown of the daemon ends the tunnel like any WebSocket of its own.
  conn->on_shutdown = [owner] {
    beast::error_code ec;
    owner->close(ec);
  };
  if (co_await flush_left(ubuf, client) && co_await flush_left(call->buffer, owner)) {
    co_await (pump(client, owner) || pump(owner, client));
  }
  conn->on_shutdown = nullptr;
  beast::error_code ec;
  owner->shutdown(tcp::socket::shutdown_both, ec);
  co_return false;
}

// Connects to the owner of session `id`: the stream, or the error reply (sent) and false.
asio::awaitable<std::optional<bool>> connect_owner(Call* call, std::string what,
                                                   cluster::Owner owner, beast::tcp_stream* up,
                                                   std::string* host_port) {
  auto ep = client::detail::parse_server(owner.advertise);
  if (ep && ep->tls) {  // config refuses it: the nodes' own traffic is http://, signed
    ep = fail(Code::kInvalid, "address " + owner.advertise + " is https://; nodes speak http://");
  }
  if (!ep) {
    co_return co_await send_error(
        call, Error::make(Code::kUnavailable,
                          what + " is on node " + owner.node + ": " + ep.error().message));
  }
  const std::string& host = ep->host;
  const std::string& port = ep->port;
  beast::error_code cec;
  up->expires_after(std::chrono::seconds(5));
  boost::system::error_code literal;
  const auto addr = asio::ip::make_address(host, literal);
  unsigned short port_num = 0;
  const auto [pend, perr] = std::from_chars(port.data(), port.data() + port.size(), port_num);
  if (!literal && perr == std::errc() && pend == port.data() + port.size()) {
    // An address (what advertise URLs usually are): no trip through the resolver's thread.
    const tcp::endpoint ep(addr, port_num);
    auto [ec1] = co_await up->async_connect(ep, kTuple);
    cec = ec1;
  } else {
    tcp::resolver resolver(up->get_executor());
    auto [rec, results] = co_await resolver.async_resolve(host, port, kTuple);
    cec = rec;
    if (!cec) {
      auto [ec2, ep] = co_await up->async_connect(results, kTuple);
      cec = ec2;
    }
  }
  if (cec) {
    co_return co_await send_error(
        call, Error::make(Code::kUnavailable, what + " is on node " + owner.node + " (" +
                                                  owner.advertise +
                                                  "), which cannot be reached: " + cec.message()));
  }
  beast::error_code nd;
  up->socket().set_option(tcp::no_delay(true), nd);
  *host_port = ep->host_header;
  co_return std::nullopt;
}

// A reply body of a known length (a download): the head goes to the client, then the body,
// spliced socket to socket (net/splice.h): no copy through the daemon, where the parser would
// read 64 KiB at a time and copy each byte twice. `up` is not used again.
asio::awaitable<bool> relay_sized_body(Call* call, beast::tcp_stream* up, beast::flat_buffer* ubuf,
                                       http::response_parser<http::buffer_body>* rp, bool keep) {
  Context* ctx = call->ctx;
  Conn* conn = call->conn;
  std::uint64_t left = *rp->content_length();
  http::response<http::empty_body> head{std::move(rp->get().base())};
  conn->stream.expires_after(ctx->opts.io_timeout);
  auto [hec, hn] = co_await http::async_write(conn->stream, head, kTuple);
  ctx->metrics.add_bytes_out(hn);
  log_request(call, head.result_int());
  if (hec) co_return false;
  if (ubuf->size() > 0) {  // read with the head
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(ubuf->size(), left));
    conn->stream.expires_after(ctx->opts.io_timeout);
    auto [wec, wn] =
        co_await asio::async_write(conn->stream, beast::buffers_prefix(n, ubuf->data()), kTuple);
    ctx->metrics.add_bytes_out(wn);
    if (wec) co_return false;
    ubuf->consume(n);
    left -= n;
  }
  const std::function<void(std::size_t)> count = [ctx](std::size_t n) {
    ctx->metrics.add_bytes_out(n);
  };
  // A side that went away or stalled: a cut reply (closing `up` tells the owner).
  if (!co_await net::splice_relay(up->socket(), conn->stream.socket(), left, ctx->opts.io_timeout,
                                  count)) {
    co_return false;
  }
  co_return keep;
}

// The owner's reply, relayed to the client piece by piece as it is read.
asio::awaitable<bool> relay_reply(Call* call, beast::tcp_stream* up, std::string what,
                                  cluster::Owner owner, beast::error_code wec, bool upgrade) {
  Context* ctx = call->ctx;
  http::response_parser<http::buffer_body> rp;
  rp.body_limit(boost::none);
  beast::flat_buffer ubuf;
  ubuf.reserve(kReadRoom);  // else a large download passes in 512-byte reads
  up->expires_after(ctx->opts.io_timeout);
  auto [hec, hn] = co_await http::async_read_header(*up, ubuf, rp, kTuple);
  if (hec) {
    std::string why = (wec ? wec : hec).message();
    co_return co_await send_error(
        call, Error::make(Code::kUnavailable,
                          what + " is on node " + owner.node + ", which did not answer: " + why));
  }
  auto& res = rp.get();
  if (upgrade && res.result() == http::status::switching_protocols) {
    co_return co_await tunnel(call, up, &ubuf, &rp);
  }
  const bool framed = res.chunked() || rp.content_length().has_value() || rp.is_done();
  const bool keep =
      !upgrade && call->ex.keep_alive && framed && !ctx->stopping && !call->ex.body_pending;
  res.erase(http::field::connection);
  res.erase("Keep-Alive");
  res.version(call->ex.version);
  res.keep_alive(keep);
  Conn* conn = call->conn;
  if (small_sized_body(rp)) {
    http::response_parser<http::string_body> whole{std::move(rp)};
    whole.body_limit(kWholeBody);
    up->expires_after(ctx->opts.io_timeout);
    auto [rec, rn] = co_await http::async_read(*up, ubuf, whole, kTuple);
    if (rec) {
      co_return co_await send_error(
          call,
          Error::make(Code::kUnavailable, what + " is on node " + owner.node +
                                              ", which did not answer whole: " + rec.message()));
    }
    conn->stream.expires_after(ctx->opts.io_timeout);
    auto [wec, wn] = co_await http::async_write(conn->stream, whole.get(), kTuple);
    ctx->metrics.add_bytes_out(wn);
    log_request(call, whole.get().result_int());
    if (wec) co_return false;
    co_return keep;
  }
  if (!rp.is_done() && !res.chunked() && rp.content_length()) {
    co_return co_await relay_sized_body(call, up, &ubuf, &rp, keep);
  }
  http::response_serializer<http::buffer_body> sr{res};
  conn->stream.expires_after(ctx->opts.io_timeout);
  auto [whec, whn] = co_await http::async_write_header(conn->stream, sr, kTuple);
  ctx->metrics.add_bytes_out(whn);
  log_request(call, res.result_int());
  if (whec) co_return false;
  std::vector<char> buf(kRelayChunk);
  while (!rp.is_done()) {
    res.body().data = buf.data();
    res.body().size = buf.size();
    up->expires_never();  // a command may be silent for long; the owner bounds it
    auto [bec, bn] = co_await http::async_read_some(*up, ubuf, rp, kTuple);
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

}  // namespace

Result<session::Caller> forwarded_caller(Context* ctx, std::string_view header,
                                         std::string_view method, std::string_view target) {
  const std::string& secret = ctx->opts.cluster_secret;
  auto f = cluster::verify_forward(secret, header, method, target, unix_now());
  if (!f) return std::unexpected(f.error());
  // A request that reached the first node without a token (E2B's envd, which has its own
  // token): it stays without one here.
  if (f->tenant.empty()) return session::Caller{"", false, 0};
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

asio::awaitable<std::optional<cluster::Owner>> remote_owner(Call* call, std::string id) {
  Context* ctx = call->ctx;
  cluster::Cluster* cl = ctx->opts.cluster.get();
  if (cl == nullptr || call->ex.req.forwarded || id.empty()) co_return std::nullopt;
  if (!session::validate_id(id)) co_return std::nullopt;  // the route says what is wrong
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
  co_return owner;
}

asio::awaitable<std::optional<bool>> forward_session(Call* call, std::string id, std::string target,
                                                     bool buffered) {
  auto owner = co_await remote_owner(call, id);
  if (!owner) co_return std::nullopt;
  if (!owner->up) co_return co_await send_error(call, service::elsewhere_error(id, *owner));
  co_return co_await forward_to(call, *owner, "session " + id, std::move(target), buffered);
}

asio::awaitable<bool> forward_to(Call* call, cluster::Owner owner, std::string what,
                                 std::string target, bool buffered) {
  if (target.empty()) {
    // The target as sent (the head is spent once the body is read): the path and the query.
    const Request& r = call->ex.req;
    target = r.path;
    char sep = '?';
    for (const auto& [k, v] : r.query) {
      target += sep + client::url_encode(k) + "=" + client::url_encode(v);
      sep = '&';
    }
  }
  if (!owner.up) {
    co_return co_await send_error(
        call,
        Error::make(Code::kUnavailable, what + " is on node " + owner.node + ", which is down"));
  }
  Context* ctx = call->ctx;
  beast::tcp_stream up(call->conn->stream.get_executor());
  std::string host_port;
  if (auto sent = co_await connect_owner(call, what, owner, &up, &host_port)) co_return *sent;
  const Request& req = call->ex.req;
  const std::string signature =
      cluster::sign_forward(ctx->opts.cluster_secret, req.method, target, req.caller.tenant,
                            req.caller.tenant, unix_now());
  const bool upgrade = !buffered && beast::websocket::is_upgrade(call->hp->get());
  beast::error_code wec;
  if (buffered) {
    wec = co_await send_buffered(call, &up, host_port, target, signature);
  } else {
    bool client_gone = false;
    wec = co_await relay_request(call, &up, host_port, signature, upgrade, &client_gone);
    if (client_gone) co_return false;
  }
  // A write error may still leave a reply to read (the owner refused early and closed).
  co_return co_await relay_reply(call, &up, what, owner, wec, upgrade);
}

asio::awaitable<std::optional<bool>> forward_if_remote(Call* call, const std::string& target) {
  co_return co_await forward_session(call, session_of(call), target, /*buffered=*/false);
}

asio::awaitable<Reply> forward_small(Context* ctx, std::string advertise, std::string method,
                                     std::string target, std::string body, session::Caller caller,
                                     std::chrono::seconds timeout) {
  const std::string signature = cluster::sign_forward(ctx->opts.cluster_secret, method, target,
                                                      caller.tenant, caller.tenant, unix_now());
  auto job = run_blocking(
      ctx->pool,
      [advertise, method, target, body, signature, timeout]() -> Result<client::Response> {
        client::ClientOptions o;
        o.server = advertise;
        o.timeout = timeout;
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
