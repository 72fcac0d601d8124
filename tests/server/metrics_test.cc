#include "server/metrics.h"

#include <gtest/gtest.h>

namespace agentbox::server {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

TEST(Metrics, CountsAndHistogramAreCumulative) {
  Metrics m;
  m.record_exec(std::chrono::milliseconds(3), false, false);
  m.record_exec(std::chrono::milliseconds(700), true, false);
  m.record_exec(std::chrono::milliseconds(1500), false, true);
  m.add_bytes_in(10);
  m.add_bytes_out(20);
  std::string t = m.render({{"running", 2}});
  EXPECT_TRUE(has_line(t, "agentbox_sessions{state=\"running\"} 2")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_sessions{state=\"suspended\"} 0")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_execs_total 3")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_execs_failed_total 1")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_execs_timed_out_total 1")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_exec_duration_seconds_bucket{le=\"0.005\"} 1")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_exec_duration_seconds_bucket{le=\"1\"} 2")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_exec_duration_seconds_bucket{le=\"2.5\"} 3")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_exec_duration_seconds_bucket{le=\"+Inf\"} 3")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_exec_duration_seconds_count 3")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_exec_duration_seconds_sum 2.203")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_bytes_in_total 10")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_bytes_out_total 20")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_runner_connections 0")) << t;
  EXPECT_TRUE(has_line(t, "# TYPE agentbox_exec_duration_seconds histogram")) << t;
}

// Per-session egress counters of the allowlist proxies.
TEST(Metrics, EgressCountersPerSession) {
  net::ProxyCounters c;
  c.bytes_out = 120;
  c.bytes_in = 4096;
  c.denials = 3;
  c.connections_total = 5;
  std::string t = Metrics{}.render({}, {{"s1", c}});
  EXPECT_TRUE(has_line(t, "agentbox_egress_bytes_out_total{session=\"s1\"} 120")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_egress_bytes_in_total{session=\"s1\"} 4096")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_egress_denials_total{session=\"s1\"} 3")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_egress_connections_total{session=\"s1\"} 5")) << t;
}

// What is and is not built, as gauges and as /readyz's "features" (one list, metrics.h).
TEST(Metrics, FeaturesSayWhatIsBuilt) {
  std::string t = Metrics{}.render({});
  EXPECT_TRUE(has_line(t, "# TYPE agentbox_feature gauge")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_feature{name=\"exec\"} 1")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_feature{name=\"templates\"} 1")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_network_mode{mode=\"none\"} 1")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_network_mode{mode=\"allowlist\"} 1")) << t;
  EXPECT_TRUE(has_line(t, "agentbox_network_mode{mode=\"open\"} 1")) << t;
  nlohmann::json f = features_json();
  EXPECT_EQ(f["network_modes"], nlohmann::json::array({"none", "allowlist", "open"}));
  // Wave 2: every feature of API.md is built.
  for (const auto& fe : kFeatures) EXPECT_EQ(f[std::string(fe.name)], true) << fe.name;
  EXPECT_EQ(f["processes"], true);
  EXPECT_EQ(f["exec"], true);
  EXPECT_EQ(f["limits_cpu_time_sec"], true);
  EXPECT_EQ(f["limits_tmp_mb"], true);
  EXPECT_EQ(f["killed_by"], true);
  EXPECT_EQ(f.size(), std::size(kFeatures) + 1);
}

}  // namespace
}  // namespace agentbox::server

namespace agentbox::server {
namespace {

TEST(Metrics, SessionEventsAreCountedByEventAndCause) {
  Metrics m;
  m.record_event(session::EventKind::kCreated, session::EventCause::kApi);
  m.record_event(session::EventKind::kCreated, session::EventCause::kApi);
  m.record_event(session::EventKind::kSuspended, session::EventCause::kReaper);
  std::string text = m.render({});
  EXPECT_NE(text.find("agentbox_session_events_total{event=\"created\",cause=\"api\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find("agentbox_session_events_total{event=\"suspended\",cause=\"reaper\"} 1\n"),
      std::string::npos)
      << text;
  EXPECT_EQ(text.find("event=\"destroyed\""), std::string::npos) << text;
}

}  // namespace
}  // namespace agentbox::server
