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

}  // namespace
}  // namespace agentbox::server
