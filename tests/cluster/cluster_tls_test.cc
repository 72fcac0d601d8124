// Cluster mode on an etcd that speaks TLS only and wants client certificates: two nodes given
// the CA, a certificate and its key (YAML keys and flags) place, forward and list as over
// http://; a node that trusts another CA starts, says in its 503 why the catalog cannot be
// reached, and makes nothing. (The TLS files' checks: tests/server/config_test.cc.)

#include <gtest/gtest.h>

#include "integration/api_test_util.h"
#include "integration/daemon.h"
#include "support/etcd.h"

namespace agentbox::testing {
namespace {

constexpr char kToken[] = "tls-team-token-0123456789";

struct TlsNode {
  int port = free_tcp_port("127.0.0.1");
  TempDir data{"agentbox-cluster-node"};
  std::unique_ptr<Daemon> daemon;
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

class ClusterTls : public ::testing::Test {
 protected:
  // The config of a node: tenants and the cluster (with the TLS files) in YAML.
  std::string config(const std::string& ca) {
    const std::string path = dir_ / ("agentboxd-" + std::to_string(++configs_) + ".yaml");
    spit(path, "tenants:\n  - {name: team, tokens: [" + std::string(kToken) +
                   "]}\n"
                   "cluster:\n"
                   "  etcd: [" +
                   etcd_.endpoints_csv() +
                   "]\n"
                   "  lease_sec: 2\n"
                   "  secret_file: " +
                   (dir_ / "secret") +
                   "\n"
                   "  etcd_ca_file: " +
                   ca + "\n  etcd_cert_file: " + etcd_.client_cert_file() +
                   "\n  etcd_key_file: " + etcd_.client_key_file() + "\n");
    return path;
  }
  void start(TlsNode& n, const std::string& name, const std::string& ca) {
    n.daemon = std::make_unique<Daemon>(std::vector<std::string>{
        "--config", config(ca), "--listen", "127.0.0.1:" + std::to_string(n.port), "--data-dir",
        n.data.path(), "--node-name", name, "--advertise-url", n.url()});
  }

  EtcdCluster etcd_{1, /*tls=*/true};
  TempDir dir_{"agentbox-cluster-tls"};
  int configs_ = 0;
};

TEST_F(ClusterTls, NodesOnAnHttpsEtcdPlaceForwardAndListAndAWrongCaIsSaid) {
  spit(dir_ / "secret", "a-cluster-secret-of-some-length\n");
  TlsNode n1, n2;
  start(n1, "n1", etcd_.ca_file());
  start(n2, "n2", etcd_.ca_file());
  Api a1(*n1.daemon, kToken), a2(*n2.daemon, kToken);
  ASSERT_TRUE(eventually(
      [&] {
        auto r = a1.get("/v1/cluster");
        if (r.status != 200 || r.body["nodes"].size() != 2) return false;
        for (const auto& x : r.body["nodes"]) {
          if (x["state"] != "up") return false;
        }
        return true;
      },
      10))
      << a1.get("/v1/cluster") << "\n"
      << n1.daemon->log();
  auto made = a1.post("/v1/sessions", {{"id", "over-tls"}, {"node", "n2"}});
  ASSERT_EQ(made.status, 201) << made;
  EXPECT_EQ(made.body["node"], "n2");
  auto ran = a1.sh("over-tls", "echo hello > f && cat f");
  ASSERT_EQ(ran.status, 200) << ran;
  EXPECT_EQ(ran.body["stdout"], "hello\n");
  auto listed = a2.get("/v1/sessions");
  ASSERT_EQ(listed.status, 200) << listed;
  ASSERT_EQ(listed.body["sessions"].size(), 1u) << listed;
  EXPECT_EQ(listed.body["sessions"][0]["node"], "n2");

  // A node that trusts another CA: up, but no catalog, and its refusal says why.
  TlsNode n3;
  start(n3, "n3", etcd_.other_ca_file());
  Api a3(*n3.daemon, kToken);
  ApiReply refused;
  ASSERT_TRUE(eventually(
      [&] {
        refused = a3.post("/v1/sessions", {{"id", "not-made"}});
        return refused.status == 503 &&
               refused.message().find("certificate verify failed") != std::string::npos;
      },
      10))
      << refused;
  EXPECT_EQ(a1.get("/v1/sessions/not-made").status, 404) << "nothing was placed";
}

}  // namespace
}  // namespace agentbox::testing
