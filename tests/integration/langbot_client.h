#pragma once
// A LangBot client for the tests, written from shared/PROTOCOLS.md part 2 (what
// langbot-plugin-sdk's ActionRPCBoxClient sends): the /rpc/ws control socket and the relay
// socket with LangBot's headers, Python json.dumps framing, fragmented messages over 64 KiB,
// request/response matching by seq_id; and the shapes of a context and a BoxSpec.

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>

#include "integration/daemon.h"
#include "integration/ws_test_util.h"

namespace agentbox::testing::lb {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using ojson = nlohmann::ordered_json;

inline constexpr char kToken[] = "lb-control-token-0123456789abcdef0123";  // 32+ characters
inline constexpr char kInstance[] = "inst-1";

// Python's json.dumps(obj): ", " and ": " separators, non-ASCII escaped (ActionRPC's framing).
inline std::string py_dumps(const ojson& j) {
  if (j.is_object()) {
    std::string s = "{";
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) s += ", ";
      first = false;
      s += ojson(it.key()).dump(-1, ' ', true) + ": " + py_dumps(it.value());
    }
    return s + "}";
  }
  if (j.is_array()) {
    std::string s = "[";
    for (std::size_t i = 0; i < j.size(); ++i) s += (i ? ", " : "") + py_dumps(j[i]);
    return s + "]";
  }
  return j.dump(-1, ' ', true);
}

// A LangBot control or relay socket: the headers LangBot sends, read with a timeout.
class LbSocket {
 public:
  struct Headers {
    std::string instance = kInstance;
    std::string token = kToken;
    std::string workspace;   // relay only
    std::string generation;  // relay only
    std::string origin;
    bool offer_mcp = false;
  };

  // The upgrade: 101, or the refusal's status (its body in refusal_body()).
  int open(const std::string& host_port, const std::string& target, const Headers& h) {
    ws_.set_option(websocket::stream_base::decorator([h](websocket::request_type& req) {
      if (!h.instance.empty()) req.set("X-LangBot-Instance-Id", h.instance);
      if (!h.token.empty()) req.set("X-LangBot-Box-Control-Token", h.token);
      if (!h.workspace.empty()) req.set("X-LangBot-Workspace-Id", h.workspace);
      if (!h.generation.empty()) req.set("X-LangBot-Placement-Generation", h.generation);
      if (!h.origin.empty()) req.set(beast::http::field::origin, h.origin);
      if (h.offer_mcp) req.set(beast::http::field::sec_websocket_protocol, "mcp");
    }));
    ws_.read_message_max(64u << 20);
    auto ec = ws_connect(ioc_, ws_, host_port, target, res_);
    if (ec && ec != websocket::error::upgrade_declined) return -1;
    return res_.result_int();
  }
  std::string refusal_body() const { return res_.body(); }
  std::string selected_protocol() const {
    return std::string(res_[beast::http::field::sec_websocket_protocol]);
  }

  // The next text frame, or nullopt when the socket closed or nothing came within `timeout`.
  std::optional<std::string> read(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    beast::error_code ec;
    auto m = ws_read_for(ioc_, ws_, timeout, &ec);
    timed_out_ = ec == asio::error::timed_out;
    closed_ = ec == websocket::error::closed;
    return m;
  }

  // One message; over 64 KiB it goes as a fragmented message (as the SDK client sends it).
  void write(const std::string& data) {
    ws_.text(true);
    beast::error_code ec;
    constexpr std::size_t kFrag = 64u << 10;
    if (data.size() <= kFrag) {
      ws_.write(asio::buffer(data), ec);
    } else {
      for (std::size_t off = 0; off < data.size() && !ec; off += kFrag) {
        std::size_t n = std::min(kFrag, data.size() - off);
        ws_.write_some(off + n == data.size(), asio::buffer(data.data() + off, n), ec);
      }
    }
    EXPECT_FALSE(ec) << ec.message();
  }
  bool closed() const { return closed_; }
  bool timed_out() const { return timed_out_; }

 private:
  asio::io_context ioc_;
  websocket::stream<tcp::socket> ws_{ioc_};
  websocket::response_type res_;
  bool closed_ = false;
  bool timed_out_ = false;
};

// ActionRPCBoxClient, as far as the tests need it.
class LangBot {
 public:
  int connect(const Daemon& d, LbSocket::Headers h = {}) {
    return sock_.open(d.host_port(), "/rpc/ws", h);
  }
  LbSocket& socket() { return sock_; }

  // Sends a request frame; returns its seq_id.
  std::int64_t send(const std::string& action, const ojson& data,
                    const std::optional<ojson>& context) {
    std::int64_t seq = ++seq_;
    ojson req = ojson::object();
    req["seq_id"] = seq;
    req["action"] = action;
    req["data"] = data;
    if (context) req["context"] = *context;
    sock_.write(py_dumps(req));
    return seq;
  }
  // The response frame of `seq` (other responses are kept for their own wait).
  ojson wait(std::int64_t seq, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    for (;;) {
      if (auto it = early_.find(seq); it != early_.end()) {
        ojson f = it->second;
        early_.erase(it);
        return f;
      }
      auto m = sock_.read(timeout);
      if (!m) return ojson();
      last_raw_ = *m;
      ojson f = ojson::parse(*m, nullptr, false);
      if (!f.is_object() || !f.contains("seq_id")) return f;
      if (f["seq_id"] == seq) return f;
      early_[f["seq_id"].is_number_integer() ? f["seq_id"].get<std::int64_t>() : -1] = f;
    }
  }
  ojson call(const std::string& action, const ojson& data,
             const std::optional<ojson>& context = std::nullopt) {
    return wait(send(action, data, context));
  }
  const std::string& last_raw() const { return last_raw_; }

 private:
  LbSocket sock_;
  std::int64_t seq_ = std::random_device{}() % 100001;  // random.randint(0, 100000)
  std::map<std::int64_t, ojson> early_;
  std::string last_raw_;
};

inline ojson context(const std::string& workspace, std::int64_t gen = 1,
                     const std::string& instance = kInstance) {
  ojson c = ojson::object();
  c["instance_uuid"] = instance;
  c["workspace_uuid"] = workspace;
  c["placement_generation"] = gen;
  return c;
}

// The BoxSpec LangBot sends: every field, nulls included (exclude_none stops at `data`).
inline ojson box_spec(const std::string& session_id, const std::string& cmd = "") {
  ojson s = ojson::object();
  s["cmd"] = cmd;
  s["workdir"] = "/workspace";
  s["timeout_sec"] = 30;
  s["network"] = "off";
  s["session_id"] = session_id;
  s["env"] = ojson::object();
  s["image"] = "rockchin/langbot-sandbox:latest";
  s["host_path"] = nullptr;
  s["host_path_mode"] = "rw";
  s["mount_path"] = "/workspace";
  s["extra_mounts"] = ojson::array();
  s["skill_name"] = nullptr;
  s["persistent"] = false;
  s["cpus"] = 1.0;
  s["memory_mb"] = 512;
  s["pids_limit"] = 128;
  s["read_only_rootfs"] = true;
  s["workspace_quota_mb"] = 0;
  return s;
}

inline std::string message(const ojson& f) {
  return f.is_object() ? f.value("message", "") : "";
}
inline bool ok(const ojson& f) {
  return f.is_object() && f.value("code", -1) == 0;
}

}  // namespace agentbox::testing::lb
