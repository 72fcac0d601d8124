// The transport of agentboxd: accept loop, one coroutine per connection (HTTP/1.1 keep-alive),
// bounded header and body reads (Content-Length or chunked), auth (Bearer; ?token= on WebSocket
// upgrades), routing, and the hand-over to the route's own handler (route table, routes.h).
// The surfaces are in their own files: v1_sessions.cc, exec.cc, files.cc, seed001.cc, ops.cc,
// events.cc, not_built.cc.
//
// Threading: everything here runs on the io_context's single thread; blocking calls go to the
// pool through run_blocking() and resume here, and so does parsing a big JSON body. A Conn lives
// in its coroutine's frame; the server's list of connections holds raw pointers that the frame
// removes when it ends.
//
// Failure policy: expected errors (a client gone, a timeout, a parse error) are values
// (as_tuple); anything thrown ends only its own connection (logged by the co_spawn completion
// handler) and never reaches the io_context.

#include "server/http_server.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <list>

#include "cluster/forward_auth.h"
#include "common/log.h"
#include "common/validate.h"
#include "server/http_error.h"
#include "server/internal/blocking.h"
#include "server/internal/cluster_v1.h"
#include "server/internal/forward.h"
#include "server/internal/runner_follow.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "service/services.h"

namespace agentbox::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using detail::Call;
using detail::Conn;
using detail::Context;
using detail::error_reply;
using detail::Exchange;
using detail::HeaderParser;
using detail::kTuple;
using detail::Reply;
using detail::run_blocking;
using detail::send_error;
using detail::send_reply;

namespace {

// A JSON body at least this big is parsed in the pool, not on the network thread: a 20 MiB
// exec body takes the parser about a second, and every other client would wait for it.
constexpr std::size_t kParseInPoolBytes = 64u << 10;

// SECURITY: constant-time in the token's content (a timing side channel must not reveal how
// much of a guess was right).
bool token_matches(std::string_view given, std::string_view want) {
  unsigned char diff = given.size() == want.size() ? 0 : 1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned char>(g ^ static_cast<unsigned char>(want[i]));
  }
  return diff == 0;
}

// The tenant whose token the Authorization header carries, or null. Without configured
// tenants auth is off and every caller is the non-admin tenant "default".
// SECURITY: every token of every tenant is compared, in constant time each, with no early
// exit, so the timing says nothing about which tenant (or how much of a token) matched.
// Tokens are never logged.
std::optional<session::Caller> authenticate(const std::vector<TenantConfig>& tenants,
                                            std::string_view header) {
  if (tenants.empty()) return session::Caller{kDefaultTenant, false, 0};
  constexpr std::string_view kScheme = "bearer ";
  if (header.size() <= kScheme.size() ||
      !beast::iequals(header.substr(0, kScheme.size()), kScheme)) {
    return std::nullopt;
  }
  std::string_view given = header.substr(kScheme.size());
  while (!given.empty() && given.front() == ' ') given.remove_prefix(1);
  while (!given.empty() && (given.back() == ' ' || given.back() == '\t')) given.remove_suffix(1);
  const TenantConfig* found = nullptr;
  for (const auto& t : tenants) {
    for (const auto& tok : t.tokens) {
      bool hit = token_matches(given, tok);  // always evaluated: no short-circuit
      if (hit) found = &t;                   // tokens are unique across tenants (validate_config)
    }
  }
  if (!found) return std::nullopt;
  return session::Caller{found->name, found->admin, found->max_sessions};
}

// SECURITY (CSWSH): a browser attaches the Origin of the page to every WebSocket upgrade, and a
// page on any site can ask for ws://127.0.0.1:9090/... (with ?token= if it learned one, or with
// nothing when auth is off). Only the origins the operator listed may open a socket; clients
// that are not browsers send no Origin.
bool origin_allowed(const std::vector<std::string>& allowed, std::string_view origin) {
  for (const auto& a : allowed) {
    if (beast::iequals(a, origin)) return true;
  }
  return false;
}

// The daemon's own origin (the dashboard, API.md "Dashboard"): Origin is http(s)://<Host> and
// the Host the browser reached the daemon by is an IP literal or "localhost", with any port.
// SECURITY: a DNS name is never the daemon's own here, so a page that rebinds its own name to
// the daemon's address (its Origin then equals its Host) is still refused; an operator who
// serves the dashboard under a name lists it in allowed_origins.
bool own_origin(std::string_view origin, std::string_view host) {
  if (host.empty()) return false;
  std::string_view name = host;
  if (name.front() == '[') {
    auto close = name.find(']');
    if (close == std::string_view::npos) return false;
    std::string_view rest = name.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return false;
    name = name.substr(1, close - 1);
  } else if (auto colon = name.rfind(':'); colon != std::string_view::npos) {
    name = name.substr(0, colon);
  }
  beast::error_code ec;
  const bool literal = !name.empty() && (beast::iequals(name, "localhost") ||
                                         (asio::ip::make_address(std::string(name), ec), !ec));
  if (!literal) return false;
  for (std::string_view scheme : {"http://", "https://"}) {
    if (origin.size() == scheme.size() + host.size() &&
        beast::iequals(origin.substr(0, scheme.size()), scheme) &&
        beast::iequals(origin.substr(scheme.size()), host)) {
      return true;
    }
  }
  return false;
}

}  // namespace

struct HttpServer::Impl {
  Impl(asio::io_context& ioc, asio::thread_pool& pool, service::Services& services,
       std::shared_ptr<sandbox::Backend> backend, ServerOptions opts)
      : acceptor(ioc) {
    ctx.ioc = &ioc;
    ctx.pool = &pool;
    ctx.svc = &services;
    ctx.sessions = &services.manager();
    ctx.default_backend = std::move(backend);
    ctx.opts = std::move(opts);
  }

  Context ctx;
  std::shared_ptr<void> events_sub;  // SessionManager::subscribe handle (metrics)
  std::shared_ptr<void> ops_sub;     // OpBus::subscribe handle (metrics)
  tcp::acceptor acceptor;
  std::list<Conn*> conns;
  asio::steady_timer* drained = nullptr;  // drain()'s timer while a shutdown waits
  std::uint64_t next_conn = 1;
  std::uint64_t next_request = 1;
};

namespace {

using Impl = HttpServer::Impl;

// Reads a JSON route's body into call->ex.req.body (a big one is parsed in the pool, into
// req.parsed). Returns false when the connection is gone or the reply has been sent (too big,
// malformed framing).
asio::awaitable<bool> read_small_body(Call* call, std::size_t limit, bool* reply_sent) {
  *reply_sent = false;
  Context* ctx = call->ctx;
  Exchange* ex = &call->ex;
  if (!ex->body_pending) co_return true;
  Error too_big = Error::make(
      Code::kTooBig, "request body is over the limit of " + std::to_string(limit) + " bytes");
  if (ex->content_length && *ex->content_length > limit) {
    *reply_sent = true;
    co_await send_error(call, too_big);
    co_return false;
  }
  if (!co_await detail::maybe_continue(call)) co_return false;
  http::request_parser<http::string_body> parser{std::move(*call->hp)};
  parser.body_limit(limit);  // chunked bodies
  call->conn->stream.expires_after(ctx->opts.io_timeout);
  auto [ec, n] = co_await http::async_read(call->conn->stream, *call->buffer, parser, kTuple);
  ctx->metrics.add_bytes_in(n);
  if (ec && !detail::is_disconnect(ec)) {
    // Too big, or a malformed chunk: the client is told which, then the connection closes
    // (its framing is lost).
    *reply_sent = true;
    co_await send_error(call, detail::body_error(ec, too_big));
    co_return false;
  }
  if (ec) co_return false;
  ex->body_pending = false;
  ex->req.body = std::move(parser.get().body());
  if (ex->req.body.size() >= kParseInPoolBytes) {
    const std::string* body = &ex->req.body;  // lives in the Call, which outlives the job
    auto job = run_blocking(ctx->pool, [body] { return parse_object(*body); });
    ex->req.parsed.emplace(co_await std::move(job));
  }
  co_return true;
}

// The token of a WebSocket upgrade: the Authorization header, else ?token= (browsers cannot
// set headers on a WebSocket), else a ticket from POST /v1/ws-tickets (?ticket=).
std::string ws_query_param(std::string_view target, const char* name) {
  auto qpos = target.find('?');
  if (qpos == std::string_view::npos) return {};
  auto q = parse_query(target.substr(qpos + 1));
  if (!q) return {};
  auto it = q->find(name);
  return it == q->end() ? std::string() : it->second;
}

// Reads one request and answers it. Returns whether the connection stays open.
asio::awaitable<bool> serve_one(Impl* impl, Conn* conn, beast::flat_buffer* buffer) {
  Context* ctx = &impl->ctx;
  Call call;
  call.ctx = ctx;
  call.conn = conn;
  call.buffer = buffer;
  call.hp = std::make_unique<HeaderParser>();
  HeaderParser* hp = call.hp.get();
  hp->header_limit(static_cast<std::uint32_t>(ctx->opts.max_header_bytes));
  hp->body_limit(
      boost::none);  // enforced per route: Content-Length here, chunked by the body parser

  conn->idle = true;
  conn->stream.expires_after(ctx->opts.io_timeout);
  auto [ec, n] = co_await http::async_read_header(conn->stream, *buffer, *hp, kTuple);
  conn->idle = false;
  ctx->metrics.add_bytes_in(n);

  Exchange& ex = call.ex;
  ex.req.id = impl->next_request++;
  if (ec) {
    if (detail::is_disconnect(ec)) co_return false;
    ex.keep_alive = false;
    ex.body_pending = true;  // unknown state: drain and close
    ex.req.method = "?";
    if (ec == http::error::header_limit) {
      co_await send_error(
          &call,
          Error::make(Code::kTooBig, "request header is over the limit of " +
                                         std::to_string(ctx->opts.max_header_bytes) + " bytes"));
    } else {
      co_await send_error(&call,
                          Error::make(Code::kInvalid, "malformed HTTP request: " + ec.message()));
    }
    co_return false;
  }

  const auto& h = hp->get();
  ex.version = h.version();
  ex.keep_alive = h.keep_alive();
  ex.body_pending = !hp->is_done();
  ex.expect_continue = beast::iequals(h[http::field::expect], "100-continue");
  if (auto cl = hp->content_length()) ex.content_length = *cl;
  ex.req.method = std::string(h.method_string());
  ex.req.accept = std::string(h[http::field::accept]);
  std::string_view target = h.target();
  auto qpos = target.find('?');
  ex.req.path = std::string(target.substr(0, qpos));
  ex.start = std::chrono::steady_clock::now();

  RouteMatch m = match_route(ex.req.method, ex.req.path);
  const bool upgrade = beast::websocket::is_upgrade(h);
  // SECURITY: authenticate before anything else, so unauthenticated clients learn nothing
  // (not even which routes exist) and send no body we would read. A token in the query counts
  // only on a WebSocket upgrade to a WebSocket route (never logged: logs carry the path only).
  std::optional<session::Caller> caller;
  // Cluster mode: a request another node forwarded carries its caller, signed (forward.h). A
  // client cannot send the header: without a valid signature it is 401, audited.
  if (auto fw = h.find(cluster::kForwardHeader); fw != h.end()) {
    auto fc = detail::forwarded_caller(ctx, fw->value(), h.method_string(), target);
    if (!fc) {
      const service::Fields fields = {
          {"method", ex.req.method}, {"path", ex.req.path}, {"reason", fc.error().message}};
      ctx->svc->bus().emit(
          "cluster.forward_refused",
          service::Origin(session::Caller("", false, 0), ex.req.id, service::Surface::kV1), "",
          fields);
      co_return co_await send_error(&call, fc.error());
    }
    if (!fc->tenant.empty()) caller = std::move(*fc);
    ex.req.forwarded = true;
  } else {
    caller = authenticate(ctx->opts.tenants, h[http::field::authorization]);
  }
  const bool ws_route = upgrade && m.route && m.route->kind == RouteKind::kWebSocket;
  if (!caller && ws_route) {
    std::string token = ws_query_param(target, "token");
    if (!token.empty()) caller = authenticate(ctx->opts.tenants, "Bearer " + token);
  }
  // A ticket is spent by the first upgrade that shows it, whatever happens next (single-use).
  if (!caller && ws_route) {
    std::string ticket = ws_query_param(target, "ticket");
    if (!ticket.empty()) caller = ctx->tickets.redeem(ticket);
  }
  // E2B's SDKs send the token as X-API-KEY (E2B-MCP.md 1.4).
  if (!caller && m.route && m.route->id == RouteId::kE2b && h.find("X-API-KEY") != h.end()) {
    caller = authenticate(ctx->opts.tenants, "Bearer " + std::string(h["X-API-KEY"]));
  }
  if (caller) ex.req.caller = std::move(*caller);
  if ((!m.route || m.route->needs_auth) && !caller) {
    Reply r = error_reply(Error::make(Code::kUnauthorized, "missing or invalid bearer token"));
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    co_return co_await send_reply(&call, std::move(r));
  }
  // WebSocket upgrades, and the MCP endpoint (the MCP specification requires the check against
  // DNS rebinding).
  const bool origin_checked =
      upgrade ||
      (m.route && (m.route->id == RouteId::kMcpPost || m.route->id == RouteId::kMcpDelete));
  if (origin_checked && h.find(http::field::origin) != h.end() &&
      !origin_allowed(ctx->opts.allowed_origins, h[http::field::origin]) &&
      !(ctx->opts.ui && own_origin(h[http::field::origin], h[http::field::host]))) {
    co_return co_await send_error(
        &call, Error::make(Code::kAccess,
                           std::string(upgrade ? "WebSocket upgrade" : "request") +
                               " from origin " + validate::quote(h[http::field::origin]) +
                               " refused: not the daemon's own origin nor in its allowed_origins"));
  }
  if (!m.route) {
    if (m.allowed.empty()) {
      co_return co_await send_error(
          &call,
          Error::make(Code::kNotFound, "no such route: " + ex.req.method + " " + ex.req.path));
    }
    std::string allow;
    for (const auto& a : m.allowed) allow += (allow.empty() ? "" : ", ") + a;
    Reply r =
        error_reply(Error::make(Code::kInvalid, "method " + ex.req.method + " not allowed on " +
                                                    ex.req.path + " (allowed: " + allow + ")"));
    r.status = 405;
    r.headers.emplace_back("Allow", allow);
    co_return co_await send_reply(&call, std::move(r));
  }
  call.route = m.route;
  if (m.route->kind == RouteKind::kWebSocket && !upgrade) {
    Reply r = error_reply(Error::make(
        Code::kInvalid, ex.req.method + " " + std::string(m.route->path) +
                            " is a WebSocket route: send an Upgrade: websocket request"));
    r.status = 426;
    r.headers.emplace_back("Upgrade", "websocket");
    co_return co_await send_reply(&call, std::move(r));
  }
  if (m.route->kind == RouteKind::kHttp && upgrade) {
    co_return co_await send_error(
        &call, Error::make(Code::kInvalid, ex.req.method + " " + std::string(m.route->path) +
                                               " is not a WebSocket route: a WebSocket upgrade "
                                               "is refused here"));
  }
  if (qpos != std::string_view::npos) {
    auto q = parse_query(target.substr(qpos + 1));
    if (!q) co_return co_await send_error(&call, q.error());
    ex.req.query = std::move(*q);
  }
  ex.req.params = std::move(m.params);
  // Cluster mode: a session another node owns is served there (forward.h).
  if (auto fwd = co_await detail::forward_if_remote(&call, std::string(target))) co_return *fwd;

  if (m.route->body != BodyKind::kRaw && m.route->kind != RouteKind::kWebSocket) {
    const bool is_exec = m.route->id == RouteId::kExec || m.route->id == RouteId::kSeedExec ||
                         m.route->id == RouteId::kExecStream ||
                         m.route->id == RouteId::kSeedExecStream;
    const std::size_t limit = is_exec ? ctx->opts.max_exec_json_bytes : ctx->opts.max_json_bytes;
    bool reply_sent = false;
    if (!co_await read_small_body(&call, limit, &reply_sent)) co_return false;
  }
  co_return co_await m.route->handler(&call);
}

asio::awaitable<void> run_connection(std::shared_ptr<Impl> impl, tcp::socket socket,
                                     std::uint64_t id) {
  Conn conn(std::move(socket));
  conn.id = id;
  impl->conns.push_back(&conn);
  struct Unregister {
    Impl* impl;
    std::list<Conn*>::iterator it;
    ~Unregister() {
      impl->conns.erase(it);
      // The last connection of a shutdown: drain() stops waiting.
      if (impl->conns.empty() && impl->drained) impl->drained->cancel();
    }
  } unregister{impl.get(), std::prev(impl->conns.end())};

  beast::flat_buffer buffer;
  while (!impl->ctx.stopping) {
    if (!co_await serve_one(impl.get(), &conn, &buffer)) break;
  }
  beast::error_code ec;
  conn.stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  conn.stream.close();
}

void log_exception(std::string_view what, std::uint64_t id, std::exception_ptr e) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    spdlog::error("{} {} ended by an exception: {}", what, id, x.what());
  } catch (...) {
    spdlog::error("{} {} ended by an unknown exception", what, id);
  }
}

asio::awaitable<void> accept_loop(std::shared_ptr<Impl> impl) {
  for (;;) {
    auto [ec, socket] = co_await impl->acceptor.async_accept(kTuple);
    if (ec) {
      if (impl->ctx.stopping || !impl->acceptor.is_open()) co_return;
      // EMFILE and friends: back off instead of spinning on the error.
      spdlog::warn("accept: {}", ec.message());
      asio::steady_timer t(impl->acceptor.get_executor(), std::chrono::milliseconds(50));
      co_await t.async_wait(kTuple);
      continue;
    }
    if (impl->ctx.stopping) co_return;
    if (impl->conns.size() >= impl->ctx.opts.max_connections) {
      spdlog::warn("connection limit ({}) reached; refusing a connection",
                   impl->ctx.opts.max_connections);
      continue;  // socket closes here
    }
    beast::error_code oec;
    socket.set_option(tcp::no_delay(true), oec);
    std::uint64_t id = impl->next_conn++;
    asio::co_spawn(impl->acceptor.get_executor(), run_connection(impl, std::move(socket), id),
                   [id](std::exception_ptr e) { log_exception("connection", id, e); });
  }
}

asio::awaitable<void> drain(std::shared_ptr<Impl> impl, std::function<void()> done) {
  // Woken by the last connection leaving (Unregister), or by the grace running out.
  asio::steady_timer t(impl->acceptor.get_executor(), impl->ctx.opts.shutdown_grace);
  impl->drained = &t;
  if (!impl->conns.empty()) co_await t.async_wait(kTuple);
  impl->drained = nullptr;
  if (!impl->conns.empty()) {
    spdlog::warn("shutdown: {} connection(s) still busy after {} s; stopping anyway",
                 impl->conns.size(), impl->ctx.opts.shutdown_grace.count());
  }
  done();
}

}  // namespace

HttpServer::HttpServer(asio::io_context& ioc, asio::thread_pool& pool, service::Services& services,
                       std::shared_ptr<sandbox::Backend> default_backend, ServerOptions opts)
    : impl_(std::make_shared<Impl>(ioc, pool, services, std::move(default_backend),
                                   std::move(opts))) {
  // Every session object's "node" (API.md "Cluster").
  set_node_name(impl_->ctx.opts.node_name);
  // /metrics counts the manager's lifecycle events and the execs of every surface; the weak
  // pointer keeps a late event (from the reaper, during shutdown) off a server that is gone.
  impl_->events_sub = services.manager().subscribe(
      [w = std::weak_ptr<Impl>(impl_)](const session::SessionEvent& ev) {
        if (auto impl = w.lock()) impl->ctx.metrics.record_event(ev.kind, ev.cause);
      });
  impl_->ops_sub =
      services.bus().subscribe([w = std::weak_ptr<Impl>(impl_)](const service::OpEvent& ev) {
        if (ev.exec == nullptr) return;
        if (auto impl = w.lock()) impl->ctx.metrics.record_exec_result(*ev.exec);
      });
}

HttpServer::~HttpServer() {
  beast::error_code ec;
  impl_->acceptor.close(ec);
}

Result<tcp::endpoint> HttpServer::listen() {
  Context& ctx = impl_->ctx;
  for (const auto& d : ctx.opts.shared_dirs) {
    UniqueFd fd(::open(d.host_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!fd) return fail_errno(errno, "shared dir " + d.prefix + ": open(" + d.host_path + ")");
    detail::SharedFs s;
    s.prefix = d.prefix;
    s.fs = std::make_unique<sandbox::RootedFs>(std::move(fd), sandbox::RootMode::kBeneath,
                                               std::nullopt, d.prefix);
    ctx.shared.push_back(std::move(s));
  }
  // Longest prefix first, so "a/b" wins over "a".
  std::sort(ctx.shared.begin(), ctx.shared.end(),
            [](const auto& a, const auto& b) { return a.prefix.size() > b.prefix.size(); });

  beast::error_code ec;
  auto addr = asio::ip::make_address(ctx.opts.address, ec);
  std::string where = ctx.opts.address + ":" + std::to_string(ctx.opts.port);
  if (ec) return fail(Code::kInvalid, "listen address " + where + ": " + ec.message());
  tcp::endpoint ep(addr, ctx.opts.port);
  auto& a = impl_->acceptor;
  if (a.open(ep.protocol(), ec); ec) return fail(Code::kInternal, "socket: " + ec.message());
  a.set_option(asio::socket_base::reuse_address(true), ec);
  if (a.bind(ep, ec); ec) {
    return fail_errno(ec.value(), "bind(" + where + ")");
  }
  if (a.listen(asio::socket_base::max_listen_connections, ec); ec) {
    return fail_errno(ec.value(), "listen(" + where + ")");
  }
  auto local = a.local_endpoint(ec);
  if (ec) return fail_errno(ec.value(), "getsockname(" + where + ")");
  return local;
}

void HttpServer::start() {
  detail::make_runner_follow(&impl_->ctx);  // before a runner can register
  asio::co_spawn(impl_->acceptor.get_executor(), accept_loop(impl_),
                 [](std::exception_ptr e) { log_exception("accept loop", 0, e); });
  if (impl_->ctx.opts.cluster) {
    asio::co_spawn(impl_->acceptor.get_executor(), detail::recover_moves(&impl_->ctx),
                   [](std::exception_ptr e) { log_exception("move recovery", 0, e); });
    asio::co_spawn(impl_->acceptor.get_executor(), detail::follow_runners(&impl_->ctx),
                   [](std::exception_ptr e) { log_exception("runner follow", 0, e); });
  }
}

void HttpServer::shutdown(std::function<void()> done) {
  impl_->ctx.stopping = true;
  beast::error_code ec;
  impl_->acceptor.close(ec);
  for (Conn* c : impl_->conns) {
    if (c->on_shutdown) {
      c->on_shutdown();
    } else if (c->idle) {
      c->stream.cancel();
    }
  }
  asio::co_spawn(impl_->acceptor.get_executor(), drain(impl_, std::move(done)),
                 [](std::exception_ptr e) { log_exception("shutdown", 0, e); });
}

}  // namespace agentbox::server
