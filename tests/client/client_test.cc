// The client library against a tiny in-test Beast server: keep-alive reuse, reconnecting when the
// server closed an idle connection, chunked and content-length streaming, uploads, timeouts and
// the error body helpers. (The real server is exercised by tests/integration/.)

#include "client/client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace agentbox::client {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// One thread per connection, synchronous Beast. Routes by target:
//   /echo          200, body "METHOD TARGET\n" + request body; x-auth = Authorization
//   /close         200 with keep-alive, then the server closes the connection (an idle close)
//   /chunked       200, chunked body "part0part1...part9"
//   /big           200, 3 MiB body with Content-Length
//   /error         404 {"error":{"code":"ENOENT","message":"no such file: /workspace/x"}}
//   /slow          sleeps 1.5 s before answering
//   /reject        413 answered before reading the body, then close
class TestServer {
 public:
  TestServer() : acceptor_(ioc_, {asio::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~TestServer() {
    stopping_ = true;
    beast::error_code ec;
    // Wake the blocking accept with one last connection.
    tcp::socket s(ioc_);
    s.connect({asio::ip::make_address("127.0.0.1"), port_}, ec);
    accept_thread_.join();
    std::lock_guard lk(mu_);
    for (auto& t : conn_threads_) t.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int connections() const { return connections_; }

 private:
  void accept_loop() {
    for (;;) {
      tcp::socket sock(ioc_);
      beast::error_code ec;
      acceptor_.accept(sock, ec);
      if (stopping_) return;
      if (ec) continue;
      connections_++;
      std::lock_guard lk(mu_);
      conn_threads_.emplace_back([this, s = std::move(sock)]() mutable { serve(std::move(s)); });
    }
  }

  void serve(tcp::socket sock) {
    beast::flat_buffer buf;
    for (;;) {
      beast::error_code ec;
      http::request_parser<http::string_body> parser;
      parser.body_limit(64 << 20);
      http::read_header(sock, buf, parser, ec);
      if (ec) return;
      std::string target(parser.get().target());
      if (target == "/reject") {
        http::response<http::string_body> res{http::status::payload_too_large, 11};
        res.body() = R"({"error":{"code":"ETOOBIG","message":"too big"}})";
        res.keep_alive(false);
        res.prepare_payload();
        http::write(sock, res, ec);
        sock.shutdown(tcp::socket::shutdown_send, ec);
        // Drain what the client still sends, so closing does not reset the connection (which
        // would discard the reply before the client read it).
        char sink[65536];
        while (sock.read_some(asio::buffer(sink), ec) > 0 && !ec) {
        }
        return;
      }
      http::read(sock, buf, parser, ec);
      if (ec) return;
      auto& req = parser.get();
      http::response<http::string_body> res{http::status::ok, 11};
      res.keep_alive(req.keep_alive());
      if (target == "/chunked") {
        http::response<http::empty_body> head{http::status::ok, 11};
        head.chunked(true);
        http::response_serializer<http::empty_body> sr(head);
        http::write_header(sock, sr, ec);
        for (int i = 0; i < 10; ++i) {
          std::string part = "part" + std::to_string(i);
          asio::write(sock, http::make_chunk(asio::buffer(part)), ec);
        }
        asio::write(sock, http::make_chunk_last(), ec);
        if (ec) return;
        continue;
      }
      if (target == "/slow") std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      if (target == "/big") {
        res.body() = std::string(3 << 20, 'b');
      } else if (target == "/error") {
        res.result(http::status::not_found);
        res.body() = R"({"error":{"code":"ENOENT","message":"no such file: /workspace/x"}})";
      } else {
        res.body() = std::string(req.method_string()) + " " + target + "\n" + req.body();
        res.set("x-auth", req[http::field::authorization]);
      }
      res.prepare_payload();
      http::write(sock, res, ec);
      if (ec || target == "/close" || !req.keep_alive()) return;  // closes the socket
    }
  }

  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  unsigned short port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<std::thread> conn_threads_;
};

ClientOptions opts(const TestServer& s) {
  ClientOptions o;
  o.server = s.url();
  return o;
}

TEST(ClientTest, RequestSendsBodyAndTokenAndReusesTheConnection) {
  TestServer s;
  ClientOptions o = opts(s);
  o.token = "t0k";
  Client c(o);
  auto r = c.request("POST", "/echo?x=1", R"({"a":1})");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "POST /echo?x=1\n{\"a\":1}");
  EXPECT_EQ(r->headers["x-auth"], "Bearer t0k");
  auto again = c.request("GET", "/echo");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->body, "GET /echo\n");
  EXPECT_EQ(s.connections(), 1);  // keep-alive
}

TEST(ClientTest, ReconnectsWhenTheServerClosedAnIdleConnection) {
  TestServer s;
  Client c(opts(s));
  ASSERT_TRUE(c.request("GET", "/close"));
  // Give the close time to arrive, then use the client again: it must not surface an error.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto r = c.request("POST", "/echo", "x");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->body, "POST /echo\nx");
  // Uploads cannot be replayed, so they rely on the liveness check before sending.
  ASSERT_TRUE(c.request("GET", "/close"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::string data = "payload";
  std::size_t off = 0;
  auto up =
      c.upload("PUT", "/echo", data.size(), [&](char* buf, std::size_t n) -> Result<std::size_t> {
        std::size_t k = std::min(n, data.size() - off);
        std::copy_n(data.data() + off, k, buf);
        off += k;
        return k;
      });
  ASSERT_TRUE(up) << up.error().message;
  EXPECT_EQ(up->body, "PUT /echo\npayload");
  EXPECT_EQ(s.connections(), 3);
}

TEST(ClientTest, StreamsChunkedAndSizedBodies) {
  TestServer s;
  Client c(opts(s));
  std::string got;
  int calls = 0;
  auto r = c.request_stream("GET", "/chunked", {}, [&](std::string_view chunk) {
    got.append(chunk);
    ++calls;
    return true;
  });
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(r->body.empty());
  EXPECT_EQ(got, "part0part1part2part3part4part5part6part7part8part9");
  EXPECT_GE(calls, 1);

  std::uint64_t total = 0;
  calls = 0;
  r = c.request_stream("GET", "/big", {}, [&](std::string_view chunk) {
    total += chunk.size();
    ++calls;
    return true;
  });
  ASSERT_TRUE(r);
  EXPECT_EQ(total, 3u << 20);
  EXPECT_GT(calls, 1);  // handed out in pieces, never the whole body at once
  EXPECT_EQ(s.connections(), 1);

  // Aborting mid-body drops the connection; the next request reconnects.
  r = c.request_stream("GET", "/big", {}, [](std::string_view) { return false; });
  ASSERT_TRUE(r);
  ASSERT_TRUE(c.request("GET", "/echo"));
  EXPECT_EQ(s.connections(), 2);
}

TEST(ClientTest, ErrorRepliesAreResponsesWithAnApiError) {
  TestServer s;
  Client c(opts(s));
  auto r = c.request("GET", "/error");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  auto e = api_error(*r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "ENOENT");
  EXPECT_EQ(e->message, "no such file: /workspace/x");

  // A streamed request whose status is not 2xx gets the error body, not the callback.
  bool called = false;
  r = c.request_stream("GET", "/error", {}, [&](std::string_view) { return called = true; });
  ASSERT_TRUE(r);
  EXPECT_FALSE(called);
  EXPECT_EQ(api_error(*r)->code, "ENOENT");

  EXPECT_FALSE(api_error(Response{200, "not json", {}}));
  EXPECT_FALSE(api_error(Response{500, R"({"error":"flat"})", {}}));
  EXPECT_FALSE(api_error(Response{500, R"({"error":{"code":7}})", {}}));
}

TEST(ClientTest, UploadStreamsFromTheReader) {
  TestServer s;
  Client c(opts(s));
  const std::uint64_t size = (5 << 20) + 3;
  std::uint64_t produced = 0, last_progress = 0;
  int progress_calls = 0;
  auto r = c.upload(
      "PUT", "/echo", size,
      [&](char* buf, std::size_t n) -> Result<std::size_t> {
        std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, size - produced));
        std::fill_n(buf, k, 'u');
        produced += k;
        return k;
      },
      [&](std::uint64_t sent) {
        EXPECT_GE(sent, last_progress);
        last_progress = sent;
        ++progress_calls;
      });
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body.size(), std::string("PUT /echo\n").size() + size);
  EXPECT_EQ(last_progress, size);
  EXPECT_GT(progress_calls, 1);

  // A reader that ends early is an error, not a short upload.
  auto short_read = c.upload("PUT", "/echo", 100, [](char*, std::size_t) -> Result<std::size_t> {
    return std::size_t{0};
  });
  ASSERT_FALSE(short_read);
  // A reader error is passed through.
  auto failed = c.upload("PUT", "/echo", 100, [](char*, std::size_t) -> Result<std::size_t> {
    return fail(Code::kAccess, "read(local): denied");
  });
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code, Code::kAccess);
}

TEST(ClientTest, EarlyReplyToAnUploadIsReturned) {
  TestServer s;
  Client c(opts(s));
  auto r = c.upload("PUT", "/reject", 8 << 20, [](char* buf, std::size_t n) -> Result<std::size_t> {
    std::fill_n(buf, n, 'x');
    return n;
  });
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(api_error(*r)->code, "ETOOBIG");
}

TEST(ClientTest, TimeoutAndConnectErrors) {
  TestServer s;
  ClientOptions o = opts(s);
  o.timeout = std::chrono::milliseconds(300);
  Client c(o);
  auto r = c.request("GET", "/slow");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kTimedOut) << r.error().message;

  // Nothing listens on the port of a server that is gone.
  std::string gone;
  {
    TestServer t;
    gone = t.url();
  }
  ClientOptions g;
  g.server = gone;
  auto refused = Client(g).request("GET", "/echo");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::kUnavailable);
  EXPECT_NE(refused.error().message.find(gone), std::string::npos) << refused.error().message;
}

TEST(ClientTest, ServerUrlIsValidated) {
  for (const char* bad : {"ftp://x:1", "127.0.0.1:9090", "http://", "http://h:port",
                          "http://h:1/path", "http://[::1"}) {
    ClientOptions o;
    o.server = bad;
    auto r = Client(o).request("GET", "/healthz");
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, Code::kInvalid) << bad;
  }
}

TEST(UrlEncodeTest, EncodesReservedBytes) {
  EXPECT_EQ(url_encode("/workspace/a b.txt"), "/workspace/a%20b.txt");
  EXPECT_EQ(url_encode("a&b=c?d#e%f+g"), "a%26b%3Dc%3Fd%23e%25f%2Bg");
  EXPECT_EQ(url_encode("AZaz09-._~"), "AZaz09-._~");
  EXPECT_EQ(url_encode("\xc3\xa9"), "%C3%A9");
  EXPECT_EQ(url_encode(std::string("a\0b", 3)), "a%00b");
}

}  // namespace
}  // namespace agentbox::client
