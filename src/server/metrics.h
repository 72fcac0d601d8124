#pragma once
// Counters for GET /metrics (Prometheus text exposition format 0.0.4). Lock-free; any thread.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"
#include "net/proxy.h"
#include "sandbox/sandbox.h"
#include "session/events.h"

namespace agentbox::server {

// What this build does and does not do (API.md "General": what is not built is 501 ENOTSUP).
// GET /readyz shows it as "features", GET /metrics as agentbox_feature / agentbox_network_mode
// gauges. One list: when a feature lands, flip it here (network modes: kNetworkModesBuilt).
struct Feature {
  std::string_view name;
  bool built;
};
inline constexpr Feature kFeatures[] = {
    {"sessions", true},          {"exec", true},           {"exec_stream", true},
    {"files", true},             {"seed001", true},        {"seed002_aliases", true},
    {"archives", true},          {"tenants", true},        {"default_limits", true},
    {"templates", true},         {"processes", true},      {"pty", true},
    {"live_mounts", true},       {"packages", true},       {"runners", true},
    {"events", true},            {"langbot_rpc", true},    {"e2b", true},
    {"mcp", true},               {"repair", true},         {"limits_cpu_time_sec", true},
    {"limits_tmp_mb", true},     {"managed_processes", true}, {"killed_by", true},
    {"images", true},
};
inline constexpr std::string_view kNetworkModes[] = {"none", "allowlist", "open"};

// {"network_modes": ["none"], "templates": false, ...}: every feature by name, and the network
// modes that work.
nlohmann::json features_json();

// The runner hub's counters as /metrics shows them.
struct RunnerCounters {
  std::uint64_t connections = 0, requests = 0, failed = 0, bytes_out = 0, bytes_in = 0;
};

class Metrics {
 public:
  // Upper bounds (seconds) of the exec duration histogram's buckets; +Inf is implied.
  static constexpr std::array<double, 14> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                      1,     2.5,  5,     10,   30,  60,  300};

  // One finished exec: `failed` = it could not run or exited non-zero (timeouts count apart).
  void record_exec(std::chrono::milliseconds duration, bool failed, bool timed_out);
  // record_exec() of an exec's outcome (an Error: it could not run).
  void record_exec_result(const Result<sandbox::ExecResult>& r);
  void add_bytes_in(std::uint64_t n) { bytes_in_.fetch_add(n, std::memory_order_relaxed); }
  void add_bytes_out(std::uint64_t n) { bytes_out_.fetch_add(n, std::memory_order_relaxed); }
  // One session lifecycle event (the server subscribes this to the SessionManager).
  void record_event(session::EventKind kind, session::EventCause cause);

  // The exposition text; `sessions_by_state` and `egress` (the egress proxy counters of the
  // running allowlist sessions, by session id) come from the SessionManager.
  // `runners`: the runner hub's counters (runner_hub.h RunnerStats), zero without runners.
  std::string render(const std::map<std::string, std::size_t>& sessions_by_state,
                     const std::map<std::string, net::ProxyCounters>& egress = {},
                     const RunnerCounters& runners = {}) const;

 private:
  std::atomic<std::uint64_t> execs_{0};
  std::atomic<std::uint64_t> execs_failed_{0};
  std::atomic<std::uint64_t> execs_timed_out_{0};
  std::array<std::atomic<std::uint64_t>, kBuckets.size()> bucket_counts_{};  // non-cumulative
  std::atomic<std::uint64_t> duration_ms_sum_{0};
  std::atomic<std::uint64_t> bytes_in_{0};
  std::atomic<std::uint64_t> bytes_out_{0};
  static constexpr std::size_t kKinds = 5, kCauses = 5;  // events.h
  std::array<std::atomic<std::uint64_t>, kKinds * kCauses> events_{};
};

}  // namespace agentbox::server
