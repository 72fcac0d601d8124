#include "server/metrics.h"

#include <fmt/format.h>

#include "server/json_codec.h"

namespace agentbox::server {

nlohmann::json features_json() {
  nlohmann::json j = nlohmann::json::object();
  nlohmann::json modes = nlohmann::json::array();
  for (std::string_view m : kNetworkModes) {
    if (network_mode_built(m)) modes.push_back(m);
  }
  j["network_modes"] = std::move(modes);
  for (const Feature& f : kFeatures) j[std::string(f.name)] = f.built;
  return j;
}

void Metrics::record_exec_result(const Result<sandbox::ExecResult>& r) {
  if (!r) {
    record_exec(std::chrono::milliseconds(0), true, false);
    return;
  }
  record_exec(r->duration, r->exit_code != 0, r->timed_out);
}

void Metrics::record_exec(std::chrono::milliseconds duration, bool failed, bool timed_out) {
  execs_.fetch_add(1, std::memory_order_relaxed);
  if (timed_out) {
    execs_timed_out_.fetch_add(1, std::memory_order_relaxed);
  } else if (failed) {
    execs_failed_.fetch_add(1, std::memory_order_relaxed);
  }
  auto ms = duration.count() < 0 ? 0 : static_cast<std::uint64_t>(duration.count());
  duration_ms_sum_.fetch_add(ms, std::memory_order_relaxed);
  double secs = static_cast<double>(ms) / 1000.0;
  for (std::size_t i = 0; i < kBuckets.size(); ++i) {
    if (secs <= kBuckets[i]) {
      bucket_counts_[i].fetch_add(1, std::memory_order_relaxed);
      break;
    }
  }
}

void Metrics::record_event(session::EventKind kind, session::EventCause cause) {
  auto k = static_cast<std::size_t>(kind), c = static_cast<std::size_t>(cause);
  if (k < kKinds && c < kCauses) events_[k * kCauses + c].fetch_add(1, std::memory_order_relaxed);
}

std::string Metrics::render(const std::map<std::string, std::size_t>& sessions_by_state,
                            const std::map<std::string, net::ProxyCounters>& egress,
                            const RunnerCounters& runners) const {
  std::string out;
  auto add = [&out](std::string_view s) { out.append(s); };
  add("# HELP agentbox_sessions Sessions by state.\n# TYPE agentbox_sessions gauge\n");
  std::map<std::string, std::size_t> states = {{"running", 0}, {"suspended", 0}};
  for (const auto& [k, v] : sessions_by_state) states[k] = v;
  for (const auto& [state, n] : states) {
    add(fmt::format("agentbox_sessions{{state=\"{}\"}} {}\n", state, n));
  }
  add("# HELP agentbox_session_events_total Session lifecycle events, by event and cause.\n"
      "# TYPE agentbox_session_events_total counter\n");
  for (std::size_t k = 0; k < kKinds; ++k) {
    for (std::size_t c = 0; c < kCauses; ++c) {
      std::uint64_t n = events_[k * kCauses + c].load(std::memory_order_relaxed);
      if (n == 0) continue;
      add(fmt::format("agentbox_session_events_total{{event=\"{}\",cause=\"{}\"}} {}\n",
                      session::event_kind_name(static_cast<session::EventKind>(k)),
                      session::event_cause_name(static_cast<session::EventCause>(c)), n));
    }
  }
  auto counter = [&](std::string_view name, std::string_view help, std::uint64_t v) {
    add(fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, v));
  };
  counter("agentbox_execs_total", "Commands run.", execs_.load());
  counter("agentbox_execs_failed_total", "Commands that could not run or exited non-zero.",
          execs_failed_.load());
  counter("agentbox_execs_timed_out_total", "Commands killed by their timeout.",
          execs_timed_out_.load());

  add("# HELP agentbox_exec_duration_seconds Wall time of commands.\n"
      "# TYPE agentbox_exec_duration_seconds histogram\n");
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < kBuckets.size(); ++i) {
    cumulative += bucket_counts_[i].load();
    add(fmt::format("agentbox_exec_duration_seconds_bucket{{le=\"{}\"}} {}\n", kBuckets[i],
                    cumulative));
  }
  std::uint64_t total = execs_.load();
  add(fmt::format("agentbox_exec_duration_seconds_bucket{{le=\"+Inf\"}} {}\n", total));
  add(fmt::format("agentbox_exec_duration_seconds_sum {:.3f}\n",
                  static_cast<double>(duration_ms_sum_.load()) / 1000.0));
  add(fmt::format("agentbox_exec_duration_seconds_count {}\n", total));

  counter("agentbox_bytes_in_total", "Bytes received from API clients.", bytes_in_.load());
  counter("agentbox_bytes_out_total", "Bytes sent to API clients.", bytes_out_.load());
  add(fmt::format("# HELP agentbox_runner_connections Connected remote runners.\n"
                  "# TYPE agentbox_runner_connections gauge\nagentbox_runner_connections {}\n",
                  runners.connections));
  counter("agentbox_runner_requests_total", "Requests sent to remote runners.", runners.requests);
  counter("agentbox_runner_requests_failed_total",
          "Runner requests that failed (runner error, timeout, disconnect).", runners.failed);
  counter("agentbox_runner_bytes_out_total", "Bytes sent to remote runners.", runners.bytes_out);
  counter("agentbox_runner_bytes_in_total", "Bytes received from remote runners.",
          runners.bytes_in);
  add("# HELP agentbox_feature Whether a feature is built (1) or answers 501 ENOTSUP (0).\n"
      "# TYPE agentbox_feature gauge\n");
  for (const Feature& f : kFeatures) {
    add(fmt::format("agentbox_feature{{name=\"{}\"}} {}\n", f.name, f.built ? 1 : 0));
  }
  add("# HELP agentbox_network_mode Whether a session network mode is built (1) or not (0).\n"
      "# TYPE agentbox_network_mode gauge\n");
  for (std::string_view m : kNetworkModes) {
    add(fmt::format("agentbox_network_mode{{mode=\"{}\"}} {}\n", m,
                    network_mode_built(m) ? 1 : 0));
  }
  // Per session (running, network mode allowlist): what its egress proxy carried and refused.
  // Session ids are [A-Za-z0-9._-], safe as label values.
  auto per_session = [&](std::string_view name, std::string_view help, auto field) {
    add(fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n", name, help));
    for (const auto& [id, c] : egress) {
      add(fmt::format("{}{{session=\"{}\"}} {}\n", name, id, field(c)));
    }
  };
  per_session("agentbox_egress_bytes_out_total", "Bytes a box sent through its egress proxy.",
              [](const net::ProxyCounters& c) { return c.bytes_out; });
  per_session("agentbox_egress_bytes_in_total", "Bytes a box received through its egress proxy.",
              [](const net::ProxyCounters& c) { return c.bytes_in; });
  per_session("agentbox_egress_denials_total", "Requests the egress proxy refused (403).",
              [](const net::ProxyCounters& c) { return c.denials; });
  per_session("agentbox_egress_connections_total", "Connections a box made to its egress proxy.",
              [](const net::ProxyCounters& c) { return c.connections_total; });
  return out;
}

}  // namespace agentbox::server
