#pragma once
// Small helpers shared by the api_*_test.cc suites: JSON calls through the real client library
// against a real daemon, and polling for conditions on a noisy machine.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "client/client.h"
#include "integration/daemon.h"

namespace agentbox::testing {

using nlohmann::json;

struct ApiReply {
  int status = 0;
  json body;        // parsed JSON (discarded value when the body is not JSON)
  std::string raw;  // the body as received
  std::map<std::string, std::string> headers;

  // The {"error":{"code"}} of an error reply, "" otherwise.
  std::string code() const {
    if (!body.is_object() || !body.contains("error") || !body["error"].is_object()) return "";
    return body["error"].value("code", "");
  }
  std::string message() const {
    if (!body.is_object() || !body.contains("error") || !body["error"].is_object()) return "";
    return body["error"].value("message", "");
  }
};

inline std::ostream& operator<<(std::ostream& os, const ApiReply& r) {
  return os << "HTTP " << r.status << " " << r.raw.substr(0, 2000);
}

class Api {
 public:
  explicit Api(const Daemon& d, std::string token = "") : client_(d.options(std::move(token))) {}

  ApiReply call(std::string_view method, std::string_view target, std::string_view body = {},
                std::string_view content_type = "application/json",
                const client::Client::Headers& headers = {}) {
    auto r = client_.request(method, target, body, content_type, headers);
    if (!r) {
      ADD_FAILURE() << method << " " << target << ": " << r.error().message;
      return {};
    }
    ApiReply out;
    out.status = r->status;
    out.raw = r->body;
    out.headers = r->headers;
    out.body = json::parse(r->body, nullptr, false);
    return out;
  }
  ApiReply post(std::string_view target, const json& body) {
    return call("POST", target, body.dump());
  }
  ApiReply get(std::string_view target) { return call("GET", target); }
  ApiReply del(std::string_view target) { return call("DELETE", target); }
  ApiReply put(std::string_view target, std::string_view bytes) {
    return call("PUT", target, bytes, "application/octet-stream");
  }

  // POST /v1/sessions {"id": id}; expects 200 or 201.
  void create(const std::string& id) {
    auto r = post("/v1/sessions", {{"id", id}});
    ASSERT_TRUE(r.status == 200 || r.status == 201) << r;
  }
  ApiReply exec(const std::string& id, const json& body) {
    return post("/v1/sessions/" + id + "/exec", body);
  }
  ApiReply sh(const std::string& id, const std::string& command) {
    return exec(id, {{"command", command}});
  }

  client::Client& client() { return client_; }

 private:
  client::Client client_;
};

inline std::string files_target(const std::string& id, const std::string& path,
                                const std::string& extra = "") {
  return "/v1/sessions/" + id + "/files?path=" + client::url_encode(path) + extra;
}

// Runs `cmd` through the shell (a test client, e.g. a Node script); its stdout, and its exit
// status in *status.
inline std::string run_shell(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  *status = ::pclose(p);
  return out;
}

// The backend the fixture's daemons run (AGENTBOX_TEST_BACKEND, default host).
inline std::string test_backend() {
  const char* b = std::getenv("AGENTBOX_TEST_BACKEND");
  return b != nullptr && *b != '\0' ? b : "host";
}

// Polls `cond` every 50 ms for up to `seconds`.
inline bool eventually(const std::function<bool()>& cond, double seconds = 10) {
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cond();
}

inline std::string read_host_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// An RFC 3339 UTC timestamp like 2026-11-21T22:00:00Z (fractional seconds allowed).
inline bool is_rfc3339_utc(const std::string& s) {
  if (s.size() < 20 || s.back() != 'Z') return false;
  for (std::size_t i : {4u, 7u}) {
    if (s[i] != '-') return false;
  }
  return s[10] == 'T' && s[13] == ':' && s[16] == ':';
}

}  // namespace agentbox::testing
