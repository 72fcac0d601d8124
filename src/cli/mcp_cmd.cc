// agentbox mcp SESSION: the session's MCP tools over stdio, for desktop agents that start a
// command rather than speak HTTP (MCP's stdio transport: one JSON-RPC message per line).
//
// A bridge, not a second MCP server: every message goes as it is to the daemon's
// POST /v1/sessions/{id}/mcp (the streamable HTTP endpoint, mcp.cc), and every reply comes back
// as one line on stdout, so the tools, their schemas and their results are the endpoint's own.
// The bridge adds only what stdio needs:
// - requests run side by side (a long exec does not hold up a ping) on up to kMaxInFlight
//   worker threads, each with its own connection; replies are written whole, one per line, in the order they end;
// - the Mcp-Session-Id and MCP-Protocol-Version the endpoint issues at `initialize` go on every
//   later message; when the endpoint has forgotten the session (a daemon restart: it keeps them
//   in memory), the bridge replays the client's `initialize` once and sends the message again,
//   so the desktop agent never sees the restart;
// - a reply that is not JSON-RPC (the daemon unreachable, a bad token, an unknown session)
//   becomes a JSON-RPC error for the request it answers, and a line on stderr;
// - at the end of stdin it waits for the requests in flight, ends the MCP session (DELETE) and
//   exits 0. stdout carries nothing but protocol; diagnostics go to stderr.

#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli.h"

namespace agentbox::cli {
namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxInFlight = 8;
// A line longer than this is refused without being sent (the endpoint caps bodies lower).
constexpr std::size_t kMaxLineBytes = 64u << 20;
constexpr int kParseError = -32700;
constexpr int kServerError = -32000;   // JSON-RPC's implementation-defined server error range
constexpr int kSessionNotFound = -32001;  // the endpoint's "MCP session not found"

json rpc_error(const json& id, int code, std::string message) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", std::move(message)}}}};
}

class Bridge {
 public:
  Bridge(const Globals& g, std::string session, int out_fd)
      : g_(g), target_(session_target(session) + "/mcp"), out_fd_(out_fd) {}

  ~Bridge() { stop(); }

  // One line of stdin.
  void line(std::string_view text) {
    json msg = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (msg.is_discarded()) {
      write(rpc_error(nullptr, kParseError, "malformed JSON on stdin (one message per line)"));
      return;
    }
    if (msg.is_object() && msg.value("method", json()) == "initialize") {
      // Nothing else is in flight while the session is (re)made.
      drain();
      forward(std::string(text), std::move(msg));
      return;
    }
    std::unique_lock lock(mu_);
    if (workers_.size() < kMaxInFlight && busy_ + queue_.size() >= workers_.size()) {
      workers_.emplace_back([this] { work(); });
    }
    queue_.push_back({std::string(text), std::move(msg)});
    wake_.notify_one();
  }
  void too_long() {
    write(rpc_error(nullptr, kParseError,
                    "message on stdin is over " + std::to_string(kMaxLineBytes) + " bytes"));
  }

  // The end of stdin: wait for what is in flight, then end the MCP session.
  void finish() {
    drain();
    stop();
    std::string id;
    {
      std::lock_guard lock(mu_);
      id = mcp_id_;
    }
    if (id.empty()) return;
    client::Client c(g_.options());
    (void)c.request("DELETE", target_, {}, {}, {{"Mcp-Session-Id", id}});
  }

  bool out_closed() const { return out_closed_; }

 private:
  struct Job {
    std::string body;
    json msg;
  };

  void work() {
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      Job job = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
      lock.unlock();
      forward(std::move(job.body), std::move(job.msg));
      lock.lock();
      --busy_;
      idle_.notify_all();
    }
  }

  // Until every queued message has been answered.
  void drain() {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return queue_.empty() && busy_ == 0; });
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  std::unique_ptr<client::Client> take_client() {
    std::lock_guard lock(mu_);
    if (pool_.empty()) return std::make_unique<client::Client>(g_.options());
    auto c = std::move(pool_.back());
    pool_.pop_back();
    return c;
  }
  void give_back(std::unique_ptr<client::Client> c) {
    std::lock_guard lock(mu_);
    pool_.push_back(std::move(c));
  }

  client::Client::Headers headers() {
    std::lock_guard lock(mu_);
    client::Client::Headers h = {{"Accept", "application/json, text/event-stream"}};
    if (!mcp_id_.empty()) h.emplace_back("Mcp-Session-Id", mcp_id_);
    if (!protocol_.empty()) h.emplace_back("MCP-Protocol-Version", protocol_);
    return h;
  }

  Result<client::Response> post(client::Client& c, const std::string& body) {
    return c.request("POST", target_, body, "application/json", headers());
  }

  // Sends one message and writes what answers it.
  void forward(std::string body, json msg) {
    const bool is_object = msg.is_object();
    const json id = is_object && msg.contains("id") ? msg["id"] : json(nullptr);
    const bool is_request = is_object && msg.contains("id") && msg.contains("method");
    const std::string method = is_object ? msg.value("method", std::string()) : std::string();
    auto c = take_client();
    auto r = post(*c, body);
    if (r && lost_session(*r) && method != "initialize" && reinitialize(*c)) r = post(*c, body);
    if (!r) {
      std::cerr << "agentbox mcp: " << r.error().message << "\n";
      if (is_request) {
        write(rpc_error(id, kServerError, "agentbox: " + std::string(code_name(r.error().code)) +
                                              ": " + r.error().message));
      }
      return;  // the connection is dropped with the client
    }
    give_back(std::move(c));
    if (method == "initialize" && r->status == 200) remember(body, *r);
    if (r->body.empty()) return;  // 202: a notification was taken
    // ordered: the endpoint's reply goes out as it came, one line.
    auto reply = nlohmann::ordered_json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    if (reply.is_object() && reply.contains("jsonrpc")) {
      // A JSON-RPC answer. One to a notification (there is none but for malformed ones) has no
      // request to go to: it goes to stderr.
      if (is_request || !reply.contains("error")) {
        write(reply);
      } else {
        std::cerr << "agentbox mcp: " << reply["error"].dump() << "\n";
      }
      return;
    }
    // The daemon's own error shape: a bad token, an unknown session, a quota.
    std::string what = "HTTP " + std::to_string(r->status);
    if (auto e = client::api_error(*r)) what = e->code + ": " + e->message;
    std::cerr << "agentbox mcp: " << what << "\n";
    if (is_request) write(rpc_error(id, kServerError, "agentbox: " + what));
  }

  static bool lost_session(const client::Response& r) {
    if (r.status != 404) return false;
    json reply = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    return reply.is_object() && reply.contains("error") && reply["error"].is_object() &&
           reply["error"].value("code", 0) == kSessionNotFound;
  }

  void remember(const std::string& init_body, const client::Response& r) {
    json reply = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    std::lock_guard lock(mu_);
    if (auto it = r.headers.find("mcp-session-id"); it != r.headers.end()) mcp_id_ = it->second;
    if (reply.is_object() && reply.contains("result") && reply["result"].is_object()) {
      protocol_ = reply["result"].value("protocolVersion", std::string());
    }
    init_body_ = init_body;
  }

  // The endpoint forgot our MCP session (it keeps them in memory): replay the client's
  // initialize and its initialized notification. Only the first of the requests that found
  // the session gone does it; the others see the new id.
  bool reinitialize(client::Client& c) {
    std::unique_lock lock(reinit_mu_);
    std::string init;
    std::string stale;
    {
      std::lock_guard l(mu_);
      init = init_body_;
      stale = mcp_id_;
      mcp_id_.clear();
    }
    if (init.empty()) return false;
    auto r = c.request("POST", target_, init, "application/json", headers());
    if (!r || r->status != 200) {
      std::lock_guard l(mu_);
      if (mcp_id_.empty()) mcp_id_ = stale;
      return false;
    }
    remember(init, *r);
    std::cerr << "agentbox mcp: the MCP session was gone (daemon restart?); initialized again\n";
    (void)c.request("POST", target_, R"({"jsonrpc":"2.0","method":"notifications/initialized"})",
                    "application/json", headers());
    return true;
  }

  template <class Json>
  void write(const Json& reply) {
    std::string text = reply.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    std::lock_guard lock(out_mu_);
    if (out_closed_) return;
    if (!write_all(out_fd_, text)) out_closed_ = true;
  }

  const Globals& g_;
  const std::string target_;
  const int out_fd_;
  std::mutex mu_;  // all below but the output and the worker threads
  std::condition_variable wake_;  // a job was queued, or stopping_
  std::condition_variable idle_;  // a job ended
  std::deque<Job> queue_;
  std::size_t busy_ = 0;
  bool stopping_ = false;
  std::string mcp_id_;
  std::string protocol_;
  std::string init_body_;
  std::vector<std::unique_ptr<client::Client>> pool_;
  std::mutex reinit_mu_;
  std::mutex out_mu_;
  bool out_closed_ = false;
  std::vector<std::thread> workers_;  // started by the reading thread, at most kMaxInFlight
};

}  // namespace

int mcp_stdio(const Globals& g, const std::string& session, int in_fd, int out_fd) {
  if (session.empty()) return usage("mcp needs a session id");
  Bridge bridge(g, session, out_fd);
  std::string pending;
  bool discarding = false;  // inside a line that is over kMaxLineBytes
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = ::read(in_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::cerr << "agentbox mcp: reading stdin: " << std::strerror(errno) << "\n";
      break;
    }
    if (n == 0) break;
    std::string_view chunk(buf, static_cast<std::size_t>(n));
    while (!chunk.empty()) {
      std::size_t nl = chunk.find('\n');
      std::string_view part = chunk.substr(0, nl);
      if (!discarding) pending.append(part);
      if (pending.size() > kMaxLineBytes) {
        pending.clear();
        if (!discarding) bridge.too_long();
        discarding = true;
      }
      if (nl == std::string_view::npos) break;
      chunk.remove_prefix(nl + 1);
      if (!discarding) {
        if (!pending.empty() && pending.back() == '\r') pending.pop_back();
        if (pending.find_first_not_of(" \t") != std::string::npos) bridge.line(pending);
      }
      pending.clear();
      discarding = false;
    }
    if (bridge.out_closed()) break;
  }
  if (!discarding && pending.find_first_not_of(" \t\r") != std::string::npos) {
    bridge.line(pending);
  }
  bridge.finish();
  return kExitOk;
}

}  // namespace agentbox::cli
