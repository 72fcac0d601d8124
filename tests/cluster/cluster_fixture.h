#pragma once
// The cluster suites' fixture: a three-member etcd cluster (Debian's etcd-server,
// support/etcd.h) and three agentboxd nodes on loopback (host backend), n1..n3, alike but for
// their names, ports and data dirs.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "integration/api_test_util.h"
#include "integration/daemon.h"
#include "support/etcd.h"

namespace agentbox::testing {

inline constexpr char kToken[] = "team-token-0123456789";
inline constexpr char kAdminToken[] = "ops-token-0123456789";
inline constexpr char kSmallToken[] = "small-token-0123456789";  // max_sessions 1 (per node)
inline constexpr char kRunnerToken[] = "alice-runner-token-0123456789";  // runner user alice
inline constexpr int kLeaseSec = 2;
// LangBot's control token on every node (integration/langbot_client.h sends it).
inline constexpr const char* lb_control_token() {
  return "lb-control-token-0123456789abcdef0123";
}

// One node: a daemon on a fixed 127.0.0.1 port (its advertise URL) with its own data dir that
// outlives the daemon (kill and start again: the node comes back with its sessions).
struct Node {
  std::string name;
  int port = 0;
  std::unique_ptr<TempDir> data;
  std::unique_ptr<Daemon> daemon;
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

class ClusterFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = std::make_unique<EtcdCluster>(3);
    spit(dir_ / "secret", "a-cluster-secret-of-some-length\n");
    for (int i = 1; i <= 3; ++i) {
      Node n;
      n.name = "n" + std::to_string(i);
      n.port = free_tcp_port("127.0.0.1");
      n.data = std::make_unique<TempDir>("agentbox-cluster-node");
      nodes_.push_back(std::move(n));
    }
    for (auto& n : nodes_) start(n);
    ASSERT_TRUE(eventually(
        [&] {
          for (auto& n : nodes_) {
            auto r = api(n).get("/v1/cluster");
            if (r.status != 200 || r.body["nodes"].size() != 3) return false;
            for (const auto& x : r.body["nodes"]) {
              if (x["state"] != "up") return false;
            }
          }
          return true;
        },
        10));
  }

  // The config: tenants (and so the config digest) alike on every node; the cluster from YAML,
  // the node's name and address from flags.
  std::string config_file() {
    std::string path = dir_ / "agentboxd.yaml";
    std::string etcd;
    for (const auto& e : etcd_->endpoints()) etcd += "    - " + e + "\n";
    spit(path,
         "tenants:\n"
         "  - {name: team, tokens: [" +
             std::string(kToken) +
             "]}\n"
             "  - {name: ops, tokens: [" +
             std::string(kAdminToken) +
             "], admin: true}\n"
             "  - {name: small, tokens: [" +
             std::string(kSmallToken) +
             "], max_sessions: 1}\n"
             "runners:\n"
             "  - {user: alice, token: " +
             std::string(kRunnerToken) +
             ", tenant: team}\n"
             "langbot: {control_token: " +
             std::string(lb_control_token()) +
             ", tenant: team}\n"
             "cluster:\n"
             "  etcd:\n" +
             etcd + "  lease_sec: " + std::to_string(kLeaseSec) +
             "\n"
             "  secret_file: " +
             (dir_ / "secret") + "\n");
    return path;
  }

  void start(Node& n) {
    n.daemon = std::make_unique<Daemon>(std::vector<std::string>{
        "--config", config_file(), "--listen", "127.0.0.1:" + std::to_string(n.port), "--data-dir",
        n.data->path(), "--node-name", n.name, "--advertise-url", n.url()});
  }

  Api api(const Node& n, const std::string& token = kToken) { return Api(*n.daemon, token); }
  Node& node(int i) { return nodes_.at(static_cast<std::size_t>(i - 1)); }

  // Makes session `id` on node `on` through node `via`.
  void create_on(int via, const std::string& id, const std::string& on) {
    auto r = api(node(via)).post("/v1/sessions", {{"id", id}, {"node", on}});
    ASSERT_EQ(r.status, 201) << r;
    ASSERT_EQ(r.body["node"], on) << r;
  }

  // "127.0.0.1:PORT" of every node (a load balancer's backends).
  std::vector<std::string> backends() const {
    std::vector<std::string> out;
    for (const auto& n : nodes_) out.push_back("127.0.0.1:" + std::to_string(n.port));
    return out;
  }

  TempDir dir_{"agentbox-cluster-test"};
  std::unique_ptr<EtcdCluster> etcd_;
  std::vector<Node> nodes_;
};

}  // namespace agentbox::testing
