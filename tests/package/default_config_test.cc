// The package's /etc/agentbox/agentboxd.yaml (deploy/debian/agentboxd.yaml) is read by the
// daemon's own parser: as shipped, and with every commented-out setting turned on (each of
// which must take effect: an unknown top-level key would be ignored by the parser, so every key
// is checked here by its effect).
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "server/config.h"
#include "support/support.h"

namespace agentbox::server {
namespace {

const std::string kShipped = std::string(AGENTBOX_SOURCE_TREE) + "/deploy/debian/agentboxd.yaml";

ParseOutcome parse_file(const std::string& file, std::string* err_text) {
  std::vector<const char*> argv{"agentboxd", "--config", file.c_str()};
  std::ostringstream out, err;
  auto r = parse_daemon_args(static_cast<int>(argv.size()), argv.data(), out, err);
  *err_text = err.str() + out.str();
  return r;
}

// The file with its commented settings turned on: "#key: ..." and the block lines under it
// ("#  ...") lose their '#'; prose comments ("# text") stay.
std::string uncommented(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line)) {
    bool setting = line.size() > 1 && line[0] == '#' &&
                   (line[1] != ' ' || line.rfind("#  ", 0) == 0) && line[1] != '#';
    out += (setting ? line.substr(1) : line) + "\n";
  }
  return out;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(DefaultConfig, ShippedFileParsesToThePackagesPaths) {
  std::string err;
  auto r = parse_file(kShipped, &err);
  ASSERT_TRUE(r.config) << err;
  const DaemonConfig& c = *r.config;
  EXPECT_EQ(c.listen, "127.0.0.1:9090");
  EXPECT_EQ(c.data_dir, "/var/lib/agentbox");
  EXPECT_EQ(c.backend, "ns");
  EXPECT_EQ(c.log_level, "info");
  EXPECT_TRUE(c.tokens.empty());
  EXPECT_FALSE(c.cluster.enabled());
  EXPECT_EQ(c.pool, 2u);  // the warm pool is on by default
  auto st = validate_config(c);
  EXPECT_TRUE(st.has_value()) << st.error().message;
}

TEST(DefaultConfig, EveryCommentedSettingParsesAndTakesEffect) {
  agentbox::testing::TempDir dir("agentbox-default-config");
  const std::string file = dir.path() + "/agentboxd.yaml";
  const std::string text = uncommented(read_all(kShipped));
  std::ofstream(file) << text;

  std::string err;
  auto r = parse_file(file, &err);
  ASSERT_TRUE(r.config) << err << "\n" << text;
  const DaemonConfig& c = *r.config;
  EXPECT_EQ(c.tokens.size(), 1u);
  ASSERT_EQ(c.tenants.size(), 2u);
  EXPECT_EQ(c.tenants[0].max_sessions, 50u);
  EXPECT_TRUE(c.tenants[1].admin);
  EXPECT_EQ(c.max_running_boxes, 100u);
  EXPECT_TRUE(c.evict_idle);
  EXPECT_EQ(c.ttl_sec, 1800);
  EXPECT_EQ(c.ttl_action, "suspend");
  EXPECT_EQ(c.default_limits.memory_mb, 2048u);
  EXPECT_EQ(c.default_limits.max_pids, 512u);
  EXPECT_EQ(c.network.hosts.size(), 1u);
  EXPECT_FALSE(c.network.allow_private);
  EXPECT_EQ(c.allowed_mount_roots, std::vector<std::string>{"/srv/agentbox-shared"});
  EXPECT_EQ(c.allowed_origins, std::vector<std::string>{"https://agents.example.org"});
  EXPECT_EQ(c.audit_max_mb, 64u);
  EXPECT_EQ(c.pool, 4u);
  EXPECT_TRUE(c.ui);
  EXPECT_EQ(c.cluster.etcd.size(), 3u);
  EXPECT_EQ(c.cluster.node, "node-1");
  EXPECT_EQ(c.cluster.advertise, "http://10.0.0.21:9090");
  EXPECT_EQ(c.cluster.secret_file, "/etc/agentbox/cluster-secret");
  auto st = validate_config(c);
  EXPECT_TRUE(st.has_value()) << st.error().message;

  // Each top-level key is one of those checked above (a misspelt key would parse, unused).
  const std::set<std::string> checked{"listen",
                                      "data_dir",
                                      "backend",
                                      "log_level",
                                      "tokens",
                                      "tenants",
                                      "max_running_boxes",
                                      "evict_idle",
                                      "ttl_sec",
                                      "ttl_action",
                                      "default_limits",
                                      "network",
                                      "allowed_mount_roots",
                                      "allowed_origins",
                                      "audit_max_mb",
                                      "pool",
                                      "ui",
                                      "cluster"};
  YAML::Node root = YAML::Load(text);
  std::set<std::string> keys;
  for (const auto& kv : root) keys.insert(kv.first.as<std::string>());
  EXPECT_EQ(keys, checked);
}

}  // namespace
}  // namespace agentbox::server
