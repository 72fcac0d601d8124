// The transport under every surface, against the real daemon over loopback: chunked request
// bodies (good, malformed, too big) on a JSON route and on the file upload, WebSocket upgrades
// (auth by header and by ?token=, the message bound, refusals), GET /v1/events delivering the
// caller's tenant's lifecycle events, not-built routes answering 501 ENOTSUP, and a big exec
// body parsed off the network thread.

#include <poll.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/write.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <filesystem>
#include <fstream>
#include <optional>

#include "integration/api_test_util.h"
#include "integration/ws_test_util.h"

namespace agentbox::testing {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

constexpr char kTokenA[] = "token-a-0123456789";
constexpr char kTokenB[] = "token-b-0123456789";
constexpr char kTokenAdmin[] = "token-admin-0123456789";

class ConfigFile {
 public:
  explicit ConfigFile(const std::string& yaml) {
    char tmpl[] = "/tmp/agentbox-transport-XXXXXX.yaml";
    int fd = ::mkstemps(tmpl, 5);
    if (fd < 0) throw std::runtime_error("mkstemps failed");
    ::close(fd);
    path_ = tmpl;
    std::ofstream(path_) << yaml;
  }
  ~ConfigFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string tenants_yaml() {
  return std::string("tenants:\n") + "  - {name: a, tokens: [" + kTokenA + "]}\n" +
         "  - {name: b, tokens: [" + kTokenB + "]}\n" + "  - {name: ops, tokens: [" + kTokenAdmin +
         "], admin: true}\n";
}

// A Beast WebSocket client on its own io_context; reads wait at most a timeout.
class WsClient {
 public:
  // Connects and upgrades to `target`; `bearer` ("" for none) goes in the Authorization header.
  // Returns the handshake error (upgrade_declined with the HTTP answer in response()).
  beast::error_code open(const std::string& host_port, const std::string& target,
                         const std::string& bearer) {
    if (!bearer.empty()) {
      ws_.set_option(websocket::stream_base::decorator([bearer](websocket::request_type& req) {
        req.set(beast::http::field::authorization, "Bearer " + bearer);
      }));
    }
    return ws_connect(ioc_, ws_, host_port, target, res_);
  }
  const websocket::response_type& response() const { return res_; }

  // The next message, or nullopt when the socket closed (reason() says why) or nothing came
  // within `timeout`.
  std::optional<std::string> read(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    beast::error_code ec;
    auto m = ws_read_for(ioc_, ws_, timeout, &ec);
    if (ec != asio::error::timed_out) last_error_ = ec;
    return m;
  }
  beast::error_code write(const std::string& data) {
    beast::error_code ec;
    ws_.text(true);
    ws_.write(asio::buffer(data), ec);
    return ec;
  }
  websocket::close_reason reason() const { return ws_.reason(); }
  beast::error_code last_error() const { return last_error_; }

 private:
  asio::io_context ioc_;
  websocket::stream<tcp::socket> ws_{ioc_};
  websocket::response_type res_;
  beast::error_code last_error_;
};

json body_of(const std::string& raw) {
  auto pos = raw.find("\r\n\r\n");
  if (pos == std::string::npos) return json();
  return json::parse(raw.substr(pos + 4), nullptr, false);
}

std::string error_code_of(const std::string& raw) {
  json j = body_of(raw);
  if (!j.is_object() || !j.contains("error")) return "";
  return j["error"].value("code", "");
}

std::string error_message_of(const std::string& raw) {
  json j = body_of(raw);
  if (!j.is_object() || !j.contains("error")) return "";
  return j["error"].value("message", "");
}

std::string chunk(const std::string& data) {
  char size_line[32];
  snprintf(size_line, sizeof size_line, "%zx\r\n", data.size());
  return std::string(size_line) + data + "\r\n";
}

class TransportApi : public ::testing::Test {
 protected:
  ConfigFile config_{tenants_yaml()};
  Daemon daemon_{{"--config", config_.path()}};
  Api a_{daemon_, kTokenA};
  Api b_{daemon_, kTokenB};
  Api admin_{daemon_, kTokenAdmin};

  std::string auth_a() const { return std::string("Authorization: Bearer ") + kTokenA + "\r\n"; }
  void expect_healthy() {
    auto h = a_.get("/healthz");
    EXPECT_EQ(h.status, 200) << h;
  }
};

TEST_F(TransportApi, ChunkedJsonBodyIsReadAndAMalformedOneIs400NamingTheFault) {
  {
    RawConnection raw(daemon_.host_port());
    raw.send("POST /v1/sessions HTTP/1.1\r\nHost: x\r\n" + auth_a() +
             "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
             chunk(R"({"id":)") + chunk(R"("chunky"})") + "0\r\n\r\n");
    std::string reply = raw.read_response();
    EXPECT_EQ(http_status_of(reply), 201) << reply;
    EXPECT_EQ(body_of(reply)["id"], "chunky") << reply;
    // Keep-alive: the same connection serves the next request.
    raw.send("GET /v1/sessions/chunky HTTP/1.1\r\nHost: x\r\n" + auth_a() + "\r\n");
    EXPECT_EQ(http_status_of(raw.read_response()), 200);
  }
  {
    // A chunk size that is not hex: answered, not dropped, and nothing is created.
    RawConnection raw(daemon_.host_port());
    raw.send("POST /v1/sessions HTTP/1.1\r\nHost: x\r\n" + auth_a() +
             "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
             chunk(R"({"id":"bad")") + "zz\r\n}\r\n0\r\n\r\n");
    std::string reply = raw.read_response();
    EXPECT_EQ(http_status_of(reply), 400) << reply;
    EXPECT_EQ(error_code_of(reply), "EINVAL") << reply;
    EXPECT_NE(error_message_of(reply).find("chunk"), std::string::npos) << reply;
    EXPECT_EQ(a_.get("/v1/sessions/bad").status, 404);
  }
  {
    // Over the JSON cap (1 MiB) while it streams: 413.
    RawConnection raw(daemon_.host_port());
    raw.send("POST /v1/sessions HTTP/1.1\r\nHost: x\r\n" + auth_a() +
             "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
             chunk(R"({"id":"big","labels":{"x":")"));
    std::string filler(64u << 10, 'a');
    for (int i = 0; i < 20; ++i) {
      if (!raw.send(chunk(filler))) break;
    }
    std::string reply = raw.read_response();
    EXPECT_EQ(http_status_of(reply), 413) << reply.substr(0, 300);
    EXPECT_EQ(error_code_of(reply), "ETOOBIG") << reply.substr(0, 300);
  }
  expect_healthy();
}

TEST_F(TransportApi, ChunkedFileUploadAndAMalformedOneLeavesTheFileAsItWas) {
  a_.create("up");
  const std::string target = files_target("up", "f.txt");
  {
    RawConnection raw(daemon_.host_port());
    raw.send("PUT " + target + " HTTP/1.1\r\nHost: x\r\n" + auth_a() +
             "Transfer-Encoding: chunked\r\n\r\n" + chunk("hello, ") + chunk("chunked world") +
             "0\r\n\r\n");
    std::string reply = raw.read_response();
    EXPECT_EQ(http_status_of(reply), 200) << reply;
    EXPECT_EQ(body_of(reply)["size"], 20) << reply;
  }
  EXPECT_EQ(a_.get(target).raw, "hello, chunked world");
  {
    RawConnection raw(daemon_.host_port());
    raw.send("PUT " + target + " HTTP/1.1\r\nHost: x\r\n" + auth_a() +
             "Transfer-Encoding: chunked\r\n\r\n" + chunk("overwritten?") + "not-hex\r\n");
    std::string reply = raw.read_response();
    EXPECT_EQ(http_status_of(reply), 400) << reply;
    EXPECT_EQ(error_code_of(reply), "EINVAL") << reply;
    EXPECT_NE(error_message_of(reply).find("chunk"), std::string::npos) << reply;
  }
  EXPECT_EQ(a_.get(target).raw, "hello, chunked world");
  expect_healthy();
}

TEST_F(TransportApi, WebSocketUpgradeIsAuthenticatedByHeaderOrQueryToken) {
  {
    WsClient ws;
    EXPECT_FALSE(ws.open(daemon_.host_port(), "/v1/events", kTokenA));
    EXPECT_EQ(ws.response().result_int(), 101);
  }
  {
    WsClient ws;
    EXPECT_FALSE(ws.open(daemon_.host_port(), std::string("/v1/events?token=") + kTokenB, ""));
    EXPECT_EQ(ws.response().result_int(), 101);
  }
  for (std::string target : {"/v1/events?token=wrong", "/v1/events"}) {
    WsClient ws;
    auto ec = ws.open(daemon_.host_port(), target, "");
    EXPECT_EQ(ec, websocket::error::upgrade_declined) << target;
    EXPECT_EQ(ws.response().result_int(), 401) << target;
  }
  {
    WsClient ws;
    auto ec = ws.open(daemon_.host_port(), "/v1/events", "not-a-token");
    EXPECT_EQ(ec, websocket::error::upgrade_declined);
    EXPECT_EQ(ws.response().result_int(), 401);
  }
  // ?token= is for WebSocket upgrades only: a plain request with it is still unauthenticated.
  RawConnection raw(daemon_.host_port());
  raw.send(std::string("GET /v1/sessions?token=") + kTokenA + " HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(http_status_of(raw.read_response()), 401);
}

TEST_F(TransportApi, UpgradeOnAnHttpRouteAndPlainGetOnAWebSocketRouteAre4xxNamingTheFault) {
  {
    WsClient ws;
    auto ec = ws.open(daemon_.host_port(), "/v1/sessions", kTokenA);
    EXPECT_EQ(ec, websocket::error::upgrade_declined);
    EXPECT_EQ(ws.response().result_int(), 400);
    EXPECT_NE(ws.response().body().find("not a WebSocket route"), std::string::npos)
        << ws.response().body();
  }
  auto plain = a_.get("/v1/events");
  EXPECT_EQ(plain.status, 426) << plain;
  EXPECT_EQ(plain.code(), "EINVAL") << plain;
  EXPECT_NE(plain.message().find("WebSocket"), std::string::npos) << plain;
  expect_healthy();
}

TEST_F(TransportApi, AMessageOverTheBoundClosesThatSocketWith1009AndNothingElse) {
  WsClient other;
  ASSERT_FALSE(other.open(daemon_.host_port(), "/v1/events", kTokenA));
  WsClient ws;
  ASSERT_FALSE(ws.open(daemon_.host_port(), "/v1/events", kTokenA));
  (void)ws.write(std::string((16u << 20) + 1, 'x'));
  EXPECT_FALSE(ws.read().has_value());
  EXPECT_EQ(ws.last_error(), websocket::error::closed) << ws.last_error().message();
  EXPECT_EQ(ws.reason().code, websocket::close_code::too_big);
  // The daemon and the other socket go on: the other one still gets events.
  expect_healthy();
  a_.create("after-big");
  auto ev = other.read();
  ASSERT_TRUE(ev.has_value()) << other.last_error().message();
  json j = json::parse(*ev);
  EXPECT_EQ(j["event"], "created");
  EXPECT_EQ(j["session"]["id"], "after-big");
}

TEST_F(TransportApi, EventsDeliverTheCallersTenantsLifecycleOnlyAndAllToAnAdmin) {
  WsClient wa;
  ASSERT_FALSE(wa.open(daemon_.host_port(), "/v1/events", kTokenA));
  WsClient wadmin;
  ASSERT_FALSE(wadmin.open(daemon_.host_port(), "/v1/events", kTokenAdmin));

  a_.create("ev-a");
  b_.create("ev-b");  // between a's two events: were it leaked to a, it would show up next
  ASSERT_EQ(a_.del("/v1/sessions/ev-a").status, 200);

  auto first = wa.read();
  ASSERT_TRUE(first.has_value()) << wa.last_error().message();
  json created = json::parse(*first);
  EXPECT_EQ(created["event"], "created");
  EXPECT_EQ(created["cause"], "api");
  EXPECT_EQ(created["session"]["id"], "ev-a");
  EXPECT_EQ(created["session"]["tenant"], "a");
  EXPECT_EQ(created["session"]["state"], "running");
  EXPECT_TRUE(is_rfc3339_utc(created["time"].get<std::string>())) << created;
  auto second = wa.read();
  ASSERT_TRUE(second.has_value()) << wa.last_error().message();
  json destroyed = json::parse(*second);
  EXPECT_EQ(destroyed["event"], "destroyed");
  EXPECT_EQ(destroyed["session"]["id"], "ev-a");

  std::vector<std::pair<std::string, std::string>> seen;
  for (int i = 0; i < 3; ++i) {
    auto m = wadmin.read();
    ASSERT_TRUE(m.has_value()) << wadmin.last_error().message();
    json j = json::parse(*m);
    seen.emplace_back(j["event"], j["session"]["id"]);
  }
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, std::string>>{
                      {"created", "ev-a"}, {"created", "ev-b"}, {"destroyed", "ev-a"}}));
  // Nothing else was queued for a: b's session never reaches it.
  EXPECT_FALSE(wa.read(std::chrono::milliseconds(300)).has_value());
}

// Whether `fd` has something to read now.
bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

// The exec body is parsed in the pool: while it is being parsed, another client's /healthz is
// answered. The body is quick to send and slow to parse (millions of array elements in a field
// the exec ignores); its reply (400, a bad timeout_sec) can only come after the parse.
// KNOWN WEAKNESS: with the parse moved back onto the network thread this test still passed once
// (the health check can be served while the big body is still being read), so it does not yet
// pin the fix down; it needs a way to know the daemon has the whole body before /healthz goes.
TEST_F(TransportApi, ABigExecBodyDoesNotHoldUpOtherClients) {
  std::string body = R"({"command":"true","timeout_sec":"not a number","pad":[)";
  const std::size_t elements = 5u << 20;  // ~10 MiB of "0,"
  body.reserve(body.size() + elements * 2 + 4);
  for (std::size_t i = 0; i < elements; ++i) body += i ? ",0" : "0";
  body += "]}";
  asio::io_context ioc;
  tcp::socket exec(ioc);
  auto colon = daemon_.host_port().rfind(':');
  exec.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"),
                             static_cast<unsigned short>(
                                 std::stoi(daemon_.host_port().substr(colon + 1)))));
  std::string head = "POST /v1/sessions/big/exec HTTP/1.1\r\nHost: x\r\n" + auth_a() +
                     "Content-Type: application/json\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n";
  asio::write(exec, asio::buffer(head));
  asio::write(exec, asio::buffer(body));

  RawConnection health(daemon_.host_port());
  ASSERT_TRUE(health.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string h = health.read_response();
  EXPECT_EQ(http_status_of(h), 200) << h;
  // Order, not time: the health check's answer came while the exec's had not.
  EXPECT_FALSE(readable(exec.native_handle()));

  pollfd p{exec.native_handle(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 60000), 1);
  std::string e(4096, '\0');
  e.resize(exec.read_some(asio::buffer(e)));
  EXPECT_EQ(http_status_of(e), 400) << e.substr(0, 300);
  EXPECT_NE(e.find("timeout_sec"), std::string::npos) << e.substr(0, 300);
}

}  // namespace
}  // namespace agentbox::testing
