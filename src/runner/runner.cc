// agentbox-runner's connection loop: dial the server, register, serve one WebSocket session
// (conn.h answers its requests), reconnect with backoff.

#include "runner/runner.h"

#include "runner/conn.h"

namespace agentbox::runner {
using namespace detail;  // NOLINT: the runner's own internals

namespace {

// The writer's end, which the reader waits for before the socket goes (both on the I/O thread).
struct WriterDone {
  explicit WriterDone(asio::any_io_executor ex)
      : timer(std::move(ex), asio::steady_timer::time_point::max()) {}
  asio::steady_timer timer;  // cancelled when the writer ends
  bool done = false;
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
    auto writer_done = std::make_shared<WriterDone>(io_.get_executor());
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
    while (!writer_done->done) {
      co_await writer_done->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    co_return true;
  }

  template <typename WS>
  asio::awaitable<void> writer(WS& s, std::shared_ptr<Conn> conn,
                               std::shared_ptr<WriterDone> done) {
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
    done->done = true;
    done->timer.cancel();
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
