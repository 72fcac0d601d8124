#include "net/proxy.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <mutex>
#include <set>
#include <vector>

#include "common/log.h"
#include "common/log_errors.h"

namespace agentbox::net {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

struct Conn;
namespace {
std::string response(int status, std::string_view reason, std::string_view body);
}  // namespace

struct Proxy::Impl {
  asio::io_context& io;
  tcp::acceptor acceptor;
  std::shared_ptr<const NetworkConfig> config;
  ProxyLimits limits;
  ProxyHooks hooks;

  mutable std::mutex mu;
  std::shared_ptr<const Policy> policy;  // guarded by mu
  std::set<Conn*> conns;                 // guarded by mu; for stop()
  bool stopping = false;                 // guarded by mu

  std::atomic<uint64_t> bytes_out{0}, bytes_in{0}, denials{0}, total{0}, active{0}, busy{0};

  Impl(asio::io_context& i, std::shared_ptr<const NetworkConfig> c, ProxyLimits l, ProxyHooks h)
      : io(i),
        acceptor(asio::make_strand(i)),
        config(std::move(c)),
        limits(l),
        hooks(std::move(h)) {}

  std::shared_ptr<const Policy> current_policy() const {
    std::lock_guard lk(mu);
    return policy;
  }
};

namespace {

enum class Phase { kHead, kConnect, kResponse, kRelay };

}  // namespace

// One box connection and its upstream. Owned by the coroutines working on it (shared_ptr); all
// of them run on the strand of `client`.
struct Conn : std::enable_shared_from_this<Conn> {
  std::shared_ptr<Proxy::Impl> impl;
  tcp::socket client;
  tcp::socket upstream;
  tcp::resolver resolver;
  asio::steady_timer timer;
  Clock::time_point deadline;
  Phase phase = Phase::kHead;
  bool timed_out = false;
  bool done = false;
  int pumps = 0;
  bool response_started = false;
  std::chrono::milliseconds idle{0};  // what activity renews the deadline by

  Conn(std::shared_ptr<Proxy::Impl> i, tcp::socket s)
      : impl(std::move(i)),
        client(std::move(s)),
        upstream(client.get_executor()),
        resolver(client.get_executor()),
        timer(client.get_executor()) {
    impl->active++;
    impl->total++;
    std::lock_guard lk(impl->mu);
    impl->conns.insert(this);
  }
  ~Conn() {
    {
      std::lock_guard lk(impl->mu);
      impl->conns.erase(this);
    }
    impl->active--;
  }

  // Moves the deadline and wakes the watchdog so an earlier one takes effect.
  void set_deadline(std::chrono::milliseconds d, Phase p) {
    phase = p;
    deadline = Clock::now() + d;
    timer.cancel();
  }
  void close_all() {
    boost::system::error_code ec;
    resolver.cancel();
    upstream.close(ec);
    client.close(ec);
  }
  void on_timeout() {
    timed_out = true;
    boost::system::error_code ec;
    switch (phase) {
      case Phase::kConnect:
      case Phase::kResponse:
        // The request coroutine sees the aborted operation and answers 504.
        resolver.cancel();
        upstream.close(ec);
        break;
      case Phase::kHead: {
        // Slowloris: a short answer on a socket that has sent us nothing complete fits its
        // send buffer; written without waiting, then closed.
        const std::string r =
            response(408, "Request Timeout",
                     "no complete request head within " +
                         std::to_string(impl->limits.header_timeout.count()) + " ms");
        ::send(client.native_handle(), r.data(), r.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        close_all();
        break;
      }
      case Phase::kRelay: close_all(); break;
    }
  }
  void finish() {
    done = true;
    timer.cancel();
  }
};

namespace {

asio::awaitable<void> watchdog(std::shared_ptr<Conn> c) {
  while (!c->done) {
    c->timer.expires_at(c->deadline);
    co_await c->timer.async_wait(kTuple);
    if (c->done) break;
    if (Clock::now() >= c->deadline) {
      c->on_timeout();
      // A 504 may still be written after a connect timeout: keep watching that write.
      c->deadline = Clock::now() + std::chrono::seconds(5);
      c->phase = Phase::kRelay;
    }
  }
}

std::string response(int status, std::string_view reason, std::string_view body) {
  std::string b = "agentbox proxy: " + std::string(body) + "\n";
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) +
         "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
         std::to_string(b.size()) + "\r\nConnection: close\r\n\r\n" + b;
}

asio::awaitable<void> reply(std::shared_ptr<Conn> c, int status, std::string_view reason,
                            std::string body) {
  std::string r = response(status, reason, body);
  co_await asio::async_write(c->client, asio::buffer(r), kTuple);
  boost::system::error_code ec;
  c->client.shutdown(tcp::socket::shutdown_send, ec);
}

std::string truncated(std::string_view s) {
  return std::string(s.substr(0, 256));
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

struct Header {
  std::string name, value;
};

struct RequestHead {
  std::string method, target, version;
  std::vector<Header> headers;
};

// Parses "METHOD SP target SP HTTP/1.x CRLF (name: value CRLF)*"; the terminating CRLF CRLF is
// not part of `head`.
Result<RequestHead> parse_head(std::string_view head) {
  RequestHead r;
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  const size_t s1 = line.find(' ');
  const size_t s2 = s1 == std::string_view::npos ? s1 : line.find(' ', s1 + 1);
  if (s2 == std::string_view::npos || line.find(' ', s2 + 1) != std::string_view::npos) {
    return fail(Code::kInvalid, "malformed request line");
  }
  r.method = std::string(line.substr(0, s1));
  r.target = std::string(line.substr(s1 + 1, s2 - s1 - 1));
  r.version = std::string(line.substr(s2 + 1));
  if (r.version != "HTTP/1.1" && r.version != "HTTP/1.0") {
    return fail(Code::kInvalid, "unsupported protocol version");
  }
  if (r.method.empty() || r.target.empty()) return fail(Code::kInvalid, "malformed request line");
  for (char ch : r.method) {
    if (!(ch >= 'A' && ch <= 'Z') && ch != '-' && ch != '_')
      return fail(Code::kInvalid, "malformed method");
  }
  while (eol != std::string_view::npos) {
    const size_t start = eol + 2;
    eol = head.find("\r\n", start);
    std::string_view h =
        head.substr(start, eol == std::string_view::npos ? head.size() - start : eol - start);
    if (h.empty()) continue;
    const size_t colon = h.find(':');
    if (colon == 0 || colon == std::string_view::npos || h.front() == ' ' || h.front() == '\t') {
      return fail(Code::kInvalid, "malformed header line");
    }
    std::string_view name = h.substr(0, colon);
    if (name.find_first_of(" \t") != std::string_view::npos)
      return fail(Code::kInvalid, "malformed header name");
    r.headers.push_back({std::string(name), std::string(trim(h.substr(colon + 1)))});
  }
  return r;
}

const Header* find_header(const RequestHead& r, std::string_view name) {
  const Header* found = nullptr;
  for (const Header& h : r.headers) {
    if (iequals(h.name, name)) found = &h;
  }
  return found;
}

size_t count_header(const RequestHead& r, std::string_view name) {
  size_t n = 0;
  for (const Header& h : r.headers) n += iequals(h.name, name) ? 1 : 0;
  return n;
}

// Copies from `from` to `to` until EOF (then half-closes `to`), an error, or `limit` bytes.
asio::awaitable<void> pump(std::shared_ptr<Conn> c, bool outbound, uint64_t limit) {
  tcp::socket& from = outbound ? c->client : c->upstream;
  tcp::socket& to = outbound ? c->upstream : c->client;
  std::unique_ptr<char[]> buf(new char[c->impl->limits.relay_buffer]);
  uint64_t left = limit;
  bool clean = true;
  bool eof = false;
  while (left > 0) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(left, c->impl->limits.relay_buffer));
    auto [ec, n] = co_await from.async_read_some(asio::buffer(buf.get(), want), kTuple);
    if (n > 0) {
      if (!outbound && c->phase == Phase::kResponse) c->phase = Phase::kRelay;
      c->response_started = c->response_started || !outbound;
      c->deadline = Clock::now() + c->idle;
      auto [wec, wn] = co_await asio::async_write(to, asio::buffer(buf.get(), n), kTuple);
      (outbound ? c->impl->bytes_out : c->impl->bytes_in) += wn;
      if (wec) {
        clean = false;
        break;
      }
      left -= n;
    }
    if (ec) {
      clean = eof = ec == asio::error::eof;
      break;
    }
  }
  boost::system::error_code ec;
  if (clean) {
    // EOF travels on; a plain request's body ending at Content-Length does not half-close.
    if (eof) to.shutdown(tcp::socket::shutdown_send, ec);
    // SECURITY: a box that hung up must not pin a tunnel to a silent peer for the whole idle
    // timeout (a flood of half-closed tunnels would hold max_connections).
    if (eof && outbound && c->pumps > 1) {
      c->idle = std::min(c->idle, c->impl->limits.half_closed_timeout);
      c->set_deadline(c->idle, c->phase);
    }
  } else {
    // A reset or error on one side ends both directions.
    if (!(c->timed_out && !c->response_started)) c->close_all();
  }
  if (--c->pumps == 0) c->finish();
}

struct Target {
  std::string method;
  std::string spelled_host;  // for messages
  CanonicalHost host;
  uint16_t port = 0;
  std::string authority;  // host[:port] for the Host header
};

// Denial: the 403, the hook, the counter.
asio::awaitable<void> deny(std::shared_ptr<Conn> c, Target t, std::string why) {
  c->impl->denials++;
  if (c->impl->hooks.on_deny) {
    c->impl->hooks.on_deny(DenyEvent{t.method, truncated(t.spelled_host), t.port, why});
  }
  co_await reply(c, 403, "Forbidden", why);
}

// Resolves (hosts map, IP literal, DNS) and checks every address; returns the endpoints to try
// or a refusal message naming the host.
asio::awaitable<std::pair<std::vector<tcp::endpoint>, std::string>> resolve(std::shared_ptr<Conn> c,
                                                                            Target t) {
  const NetworkConfig& cfg = *c->impl->config;
  const std::string shown = t.host.ip && t.host.ip->is_v6() ? "[" + t.host.name + "]" : t.host.name;
  std::vector<tcp::endpoint> eps;
  if (!t.host.ip) {
    auto it = cfg.hosts.find(t.host.name);
    if (it != cfg.hosts.end()) {
      // SECURITY: operator-named hosts are used as given (internal mirrors, tests), but the
      // daemon's own ports stay out of reach.
      if (cfg.daemon_ports.count(t.port)) {
        co_return std::pair{eps,
                            shown + ":" + std::to_string(t.port) + " is the daemon's own port"};
      }
      eps.emplace_back(it->second, t.port);
      co_return std::pair{eps, std::string()};
    }
  }
  if (t.host.ip) {
    if (auto why = refused_address(*t.host.ip, cfg.allow_private)) {
      co_return std::pair{eps, shown + " is a " + *why + " address"};
    }
    eps.emplace_back(*t.host.ip, t.port);
    co_return std::pair{eps, std::string()};
  }
  auto [ec, results] = co_await c->resolver.async_resolve(t.host.name, std::to_string(t.port),
                                                          tcp::resolver::numeric_service, kTuple);
  if (ec) co_return std::pair{eps, std::string()};  // empty and no refusal: lookup failed
  std::string refused;
  for (const auto& r : results) {
    asio::ip::address a = r.endpoint().address();
    if (a.is_v6() && a.to_v6().is_v4_mapped())
      a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
    // SECURITY: an allowed name that resolves to loopback, metadata or private space is refused
    // after resolving (DNS rebinding, split-horizon names).
    if (auto why = refused_address(a, cfg.allow_private)) {
      if (refused.empty())
        refused = shown + " resolves to " + a.to_string() + ", a " + *why + " address";
      continue;
    }
    eps.emplace_back(a, t.port);
  }
  co_return std::pair{eps, eps.empty() ? refused : std::string()};
}

asio::awaitable<void> serve(std::shared_ptr<Conn> c) {
  const ProxyLimits& lim = c->impl->limits;
  // 1. The request head, whole, within header_timeout (slowloris) and max_header_bytes.
  std::string buf;
  size_t head_end = std::string::npos;
  while (head_end == std::string::npos) {
    if (buf.size() >= lim.max_header_bytes) {
      co_await reply(c, 431, "Request Header Fields Too Large",
                     "request head over " + std::to_string(lim.max_header_bytes) + " bytes");
      co_return;
    }
    const size_t old = buf.size();
    buf.resize(std::min(lim.max_header_bytes, old + 4096));
    auto [ec, n] = co_await c->client.async_read_some(
        asio::buffer(buf.data() + old, buf.size() - old), kTuple);
    buf.resize(old + n);
    if (ec) co_return;
    head_end = buf.find("\r\n\r\n", old >= 3 ? old - 3 : 0);
  }
  auto head = parse_head(std::string_view(buf).substr(0, head_end));
  std::string rest = buf.substr(head_end + 4);
  if (!head) {
    co_await reply(c, 400, "Bad Request", head.error().message);
    co_return;
  }
  // 2. Where to: CONNECT authority, or an absolute http:// URL.
  Target t;
  t.method = head->method;
  const bool tunnel = head->method == "CONNECT";
  std::string path;
  std::string_view authority;
  if (tunnel) {
    authority = head->target;
  } else {
    std::string_view target = head->target;
    if (target.size() < 7 || !iequals(target.substr(0, 7), "http://")) {
      co_await reply(c, 400, "Bad Request",
                     "only CONNECT and absolute http:// request targets are proxied (got \"" +
                         truncated(head->target) + "\")");
      co_return;
    }
    target.remove_prefix(7);
    const size_t end = target.find_first_of("/?#");
    authority = target.substr(0, end);
    path = end == std::string_view::npos ? "/" : std::string(target.substr(end));
    if (!path.empty() && path.front() == '?') path = "/" + path;
    if (const size_t hash = path.find('#'); hash != std::string::npos) path.resize(hash);
    if (authority.find('@') != std::string_view::npos) {
      co_await reply(c, 400, "Bad Request", "user info in a request target is not proxied");
      co_return;
    }
  }
  auto hp = split_host_port(authority, tunnel ? std::nullopt : std::optional<uint16_t>(80));
  if (hp && hp->port == 0)
    hp = std::unexpected(Error::make(Code::kInvalid, "CONNECT needs host:port"));
  if (!hp) {
    co_await reply(c, 400, "Bad Request", hp.error().message);
    co_return;
  }
  t.spelled_host = hp->host;
  t.port = hp->port;
  t.authority = std::string(authority);
  auto canon = canonical_host(hp->host);
  if (!canon) {
    co_await deny(c, t, canon.error().message);
    co_return;
  }
  t.host = *canon;
  // 3. The policy (the one current now: a swap affects new requests).
  if (auto ok = c->impl->current_policy()->check(t.host, t.port); !ok) {
    co_await deny(c, t, ok.error().message);
    co_return;
  }
  uint64_t body = 0;
  if (!tunnel) {
    // SECURITY: the Host header must name the host that was checked; a foreign Host would let an
    // origin serving several names route the request elsewhere.
    if (const Header* h = find_header(*head, "Host"); h != nullptr) {
      auto hh = split_host_port(h->value, 80);
      auto hc = hh ? canonical_host(hh->host) : Result<CanonicalHost>(std::unexpected(hh.error()));
      if (count_header(*head, "Host") != 1 || !hc || hc->name != t.host.name ||
          hh->port != t.port) {
        co_await deny(c, t,
                      "Host header \"" + truncated(h->value) + "\" does not match " + t.authority);
        co_return;
      }
    }
    if (find_header(*head, "Transfer-Encoding") != nullptr) {
      co_await reply(c, 501, "Not Implemented",
                     "chunked request bodies are not supported (ENOTSUP)");
      co_return;
    }
    if (const Header* cl = find_header(*head, "Content-Length"); cl != nullptr) {
      auto [p, ec] = std::from_chars(cl->value.data(), cl->value.data() + cl->value.size(), body);
      if (ec != std::errc() || p != cl->value.data() + cl->value.size() ||
          count_header(*head, "Content-Length") != 1) {
        co_await reply(c, 400, "Bad Request", "bad Content-Length");
        co_return;
      }
    }
  }
  // 4. Resolve on the host side, check the addresses, connect; all within connect_timeout.
  c->set_deadline(lim.connect_timeout, Phase::kConnect);
  auto [eps, refused] = co_await resolve(c, t);
  const std::string shown = t.host.ip && t.host.ip->is_v6() ? "[" + t.host.name + "]" : t.host.name;
  const std::string where = shown + ":" + std::to_string(t.port);
  if (eps.empty()) {
    if (c->timed_out) {
      co_await reply(c, 504, "Gateway Timeout", where + " did not answer in time");
    } else if (!refused.empty()) {
      co_await deny(c, t, refused);
    } else {
      co_await reply(c, 502, "Bad Gateway", "cannot resolve " + shown);
    }
    co_return;
  }
  boost::system::error_code cec = asio::error::host_not_found;
  for (const tcp::endpoint& ep : eps) {
    c->upstream = tcp::socket(c->client.get_executor());
    auto [ec] = co_await c->upstream.async_connect(ep, kTuple);
    cec = ec;
    if (!ec || c->timed_out) break;
  }
  if (c->timed_out) {
    co_await reply(
        c, 504, "Gateway Timeout",
        where + " did not answer within " + std::to_string(lim.connect_timeout.count()) + " ms");
    co_return;
  }
  if (cec) {
    co_await reply(c, 502, "Bad Gateway", "cannot connect to " + where + ": " + cec.message());
    co_return;
  }
  boost::system::error_code ignore;
  c->upstream.set_option(tcp::no_delay(true), ignore);
  // 5. Relay.
  uint64_t up_limit = UINT64_MAX;
  c->idle = lim.idle_timeout;
  if (tunnel) {
    static constexpr std::string_view kOk = "HTTP/1.1 200 Connection established\r\n\r\n";
    auto [ec, n] = co_await asio::async_write(c->client, asio::buffer(kOk), kTuple);
    if (ec) co_return;
    c->set_deadline(lim.idle_timeout, Phase::kRelay);
  } else {
    c->idle = lim.idle_timeout;
    // The Host the origin sees is the name that was checked, in its canonical spelling.
    std::string out = head->method + " " + path + " HTTP/1.1\r\nHost: " + shown +
                      (t.port == 80 ? "" : ":" + std::to_string(t.port)) + "\r\n";
    std::vector<std::string> conn_tokens;
    if (const Header* h = find_header(*head, "Connection")) {
      std::string_view v = h->value;
      while (!v.empty()) {
        const size_t comma = v.find(',');
        conn_tokens.emplace_back(trim(v.substr(0, comma)));
        v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
      }
    }
    for (const Header& h : head->headers) {
      static constexpr std::string_view kDrop[] = {
          "Host", "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authorization",
          "TE",   "Trailer",    "Upgrade"};
      bool drop = std::any_of(std::begin(kDrop), std::end(kDrop),
                              [&](std::string_view d) { return iequals(d, h.name); });
      for (const std::string& tok : conn_tokens) drop = drop || iequals(tok, h.name);
      if (!drop) out += h.name + ": " + h.value + "\r\n";
    }
    out += "Connection: close\r\n\r\n";
    // The body bytes that came with the head; a pipelined request after them is never sent.
    if (rest.size() > body) rest.resize(body);
    body -= rest.size();
    out += rest;
    rest.clear();
    auto [ec, n] = co_await asio::async_write(c->upstream, asio::buffer(out), kTuple);
    c->impl->bytes_out += n;
    if (ec) {
      co_await reply(c, 502, "Bad Gateway", "cannot send to " + where + ": " + ec.message());
      co_return;
    }
    up_limit = body;
    c->set_deadline(lim.response_timeout, Phase::kResponse);
  }
  if (!rest.empty()) {
    auto [ec, n] = co_await asio::async_write(c->upstream, asio::buffer(rest), kTuple);
    c->impl->bytes_out += n;
    if (ec) co_return;
  }
  c->pumps = up_limit == 0 ? 1 : 2;
  if (up_limit > 0)
    asio::co_spawn(c->client.get_executor(), pump(c, true, up_limit), LogErrors{"proxy pump"});
  co_await pump(c, false, UINT64_MAX);
  if (!tunnel && c->timed_out && !c->response_started) {
    // Re-open nothing: the box's side is still open, answer there.
    if (c->client.is_open())
      co_await reply(c, 504, "Gateway Timeout", where + " sent no response in time");
  }
}

void log_exception(std::exception_ptr e) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    spdlog::error("egress proxy connection ended by an exception: {}", x.what());
  }
}

asio::awaitable<void> run_conn(std::shared_ptr<Conn> c) {
  c->deadline = Clock::now() + c->impl->limits.header_timeout;
  asio::co_spawn(c->client.get_executor(), watchdog(c), LogErrors{"proxy watchdog"});
  co_await serve(c);
  if (c->pumps == 0) c->finish();
}

asio::awaitable<void> accept_loop(std::shared_ptr<Proxy::Impl> impl) {
  for (;;) {
    auto [ec, socket] = co_await impl->acceptor.async_accept(asio::make_strand(impl->io), kTuple);
    {
      std::lock_guard lk(impl->mu);
      if (impl->stopping) co_return;
    }
    if (ec) {
      if (!impl->acceptor.is_open()) co_return;
      // EMFILE and friends: back off instead of spinning.
      spdlog::warn("egress proxy accept: {}", ec.message());
      asio::steady_timer t(impl->acceptor.get_executor(), std::chrono::milliseconds(50));
      co_await t.async_wait(kTuple);
      continue;
    }
    if (impl->active.load() >= impl->limits.max_connections) {
      impl->busy++;
      // A short answer on a fresh socket fits its send buffer: written without waiting.
      const std::string r =
          response(503, "Service Unavailable",
                   "too many connections (" + std::to_string(impl->limits.max_connections) + ")");
      ::send(socket.native_handle(), r.data(), r.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      continue;  // closes
    }
    boost::system::error_code oec;
    socket.set_option(tcp::no_delay(true), oec);
    auto c = std::make_shared<Conn>(impl, std::move(socket));
    asio::co_spawn(c->client.get_executor(), run_conn(c), log_exception);
  }
}

}  // namespace

Result<std::shared_ptr<Proxy>> Proxy::create(asio::io_context& io, UniqueFd listener,
                                             std::shared_ptr<const Policy> policy,
                                             std::shared_ptr<const NetworkConfig> config,
                                             ProxyLimits limits, ProxyHooks hooks) {
  if (!listener) return fail(Code::kInvalid, "egress proxy: no listening socket");
  if (!policy || !config) return fail(Code::kInvalid, "egress proxy: no policy");
  auto impl = std::make_shared<Impl>(io, std::move(config), limits, std::move(hooks));
  impl->policy = std::move(policy);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(listener.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return fail_errno(errno, "getsockname(egress proxy listener)");
  }
  const tcp protocol = ss.ss_family == AF_INET6 ? tcp::v6() : tcp::v4();
  boost::system::error_code ec;
  impl->acceptor.assign(protocol, listener.get(), ec);
  if (ec) return fail(Code::kInternal, "egress proxy: adopt listener: " + ec.message());
  (void)listener.release();  // the acceptor owns it now
  return std::shared_ptr<Proxy>(new Proxy(std::move(impl)));
}

Proxy::~Proxy() {
  stop();
}

void Proxy::start() {
  asio::co_spawn(impl_->acceptor.get_executor(), accept_loop(impl_), log_exception);
}

void Proxy::stop() {
  {
    std::lock_guard lk(impl_->mu);
    if (impl_->stopping) return;
    impl_->stopping = true;
  }
  // SECURITY: the box must find nothing listening once stop() returns (the acceptor itself is
  // closed on its strand below). shutdown(2) of a listening socket is a thread-safe syscall that
  // stops it accepting and fails the pending accept.
  ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);
  asio::post(impl_->acceptor.get_executor(), [impl = impl_] {
    boost::system::error_code ec;
    impl->acceptor.close(ec);
  });
  // Each connection is closed on its own strand; a Conn erases itself from `conns` under mu in
  // its destructor, so the pointers are valid while mu is held. The references are taken under mu
  // and dropped after it: the last one may run ~Conn, which takes mu itself.
  std::vector<std::shared_ptr<Conn>> live;
  {
    std::lock_guard lk(impl_->mu);
    for (Conn* raw : impl_->conns) {
      // lock() fails for a Conn whose destructor is waiting for mu: it is gone already.
      if (auto c = raw->weak_from_this().lock()) live.push_back(std::move(c));
    }
  }
  for (const auto& c : live) {
    asio::post(c->client.get_executor(), [c] { c->close_all(); });
  }
}

void Proxy::set_policy(std::shared_ptr<const Policy> policy) {
  std::lock_guard lk(impl_->mu);
  impl_->policy = std::move(policy);
}

ProxyCounters Proxy::counters() const {
  ProxyCounters r;
  r.bytes_out = impl_->bytes_out;
  r.bytes_in = impl_->bytes_in;
  r.denials = impl_->denials;
  r.connections_total = impl_->total;
  r.connections_active = impl_->active;
  r.rejected_busy = impl_->busy;
  return r;
}

uint16_t Proxy::port() const {
  boost::system::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

}  // namespace agentbox::net
