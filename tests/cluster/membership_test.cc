// cluster::Cluster (membership, catalog, placement, cordons) with several nodes in one process
// against a real etcd; and the forward signature.

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "cluster/cluster.h"
#include "cluster/forward_auth.h"
#include "support/etcd.h"

namespace agentbox::cluster {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Cluster> make_node(const testing::EtcdCluster& etcd, const std::string& name,
                                   int lease_sec = 2,
                                   std::vector<std::pair<std::string, std::string>> local = {}) {
  ClusterOptions o;
  o.etcd = etcd.endpoints();
  o.node = name;
  o.advertise = "http://" + name + ".invalid:1";
  o.lease_sec = lease_sec;
  o.secret = "s3cret";
  o.config_digest = "digest-" + name;
  auto c = std::make_unique<Cluster>(
      o,
      [] {
        return NodeLoad{0, 0, 1000};
      },
      [local] { return local; });
  c->start();
  return c;
}

template <class F>
bool eventually(F&& f, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (f()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return f();
}

std::map<std::string, std::string> states(const Cluster& c) {
  std::map<std::string, std::string> out;
  for (const auto& n : c.nodes()) out[n.name] = n.state();
  return out;
}

// Node `name`'s state as `c` sees it now ("" while it is not in c's cache).
std::string state_of(const Cluster& c, const std::string& name) {
  auto all = states(c);
  auto it = all.find(name);
  return it == all.end() ? std::string() : it->second;
}

TEST(ClusterMembership, NodesSeeEachOtherAndADepartedNodeIsDown) {
  testing::EtcdCluster etcd(1);
  auto a = make_node(etcd, "a");
  auto b = make_node(etcd, "b");
  auto c = make_node(etcd, "c");
  using M = std::map<std::string, std::string>;
  const M all_up = {{"a", "up"}, {"b", "up"}, {"c", "up"}};
  ASSERT_TRUE(eventually([&] { return states(*a) == all_up; }, 3s));
  EXPECT_EQ(a->nodes().front().name, "a");  // self first
  EXPECT_EQ(b->nodes().front().config_digest, "digest-b");
  EXPECT_TRUE(a->etcd_healthy());
  c->stop();  // revokes its lease: down at once for the others
  EXPECT_TRUE(eventually([&] { return state_of(*a, "c") == "down"; }, 2s));
  EXPECT_TRUE(eventually([&] { return state_of(*b, "c") == "down"; }, 2s));
}

TEST(ClusterMembership, RacingPlacementsOfOneIdAgreeAndNewIdsSpread) {
  testing::EtcdCluster etcd(1);
  std::vector<std::unique_ptr<Cluster>> nodes;
  for (const char* n : {"a", "b", "c"}) nodes.push_back(make_node(etcd, n));
  ASSERT_TRUE(eventually([&] { return nodes[0]->peers_up().size() == 2; }, 3s));
  ASSERT_TRUE(eventually([&] { return nodes[2]->peers_up().size() == 2; }, 3s));
  std::vector<std::thread> threads;
  std::mutex mu;
  std::set<std::string> owners;
  for (int i = 0; i < 30; ++i) {
    threads.emplace_back([&, i] {
      auto o = nodes[static_cast<std::size_t>(i % 3)]->place("raced", "t");
      ASSERT_TRUE(o) << o.error().message;
      std::lock_guard lock(mu);
      owners.insert(o->node);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(owners.size(), 1u);
  // 60 new ids placed through one node spread over the three (free memory is equal here).
  std::map<std::string, int> count;
  for (int i = 0; i < 60; ++i) {
    auto o = nodes[0]->place("s" + std::to_string(i), "t");
    ASSERT_TRUE(o) << o.error().message;
    ++count[o->node];
  }
  for (const char* n : {"a", "b", "c"}) EXPECT_NEAR(count[n], 20, 2) << n;
  // Every node learns the owners through its watch.
  EXPECT_TRUE(eventually([&] { return nodes[2]->owner("s59").has_value(); }, 2s));
  EXPECT_EQ(nodes[2]->owner("s59")->node, nodes[0]->owner("s59")->node);
  // forget() by the owner removes the entry everywhere.
  std::string owner = nodes[0]->owner("s1")->node;
  Cluster* holder = owner == "a" ? nodes[0].get() : owner == "b" ? nodes[1].get() : nodes[2].get();
  holder->forget("s1");
  EXPECT_TRUE(eventually([&] { return !nodes[0]->owner("s1").has_value(); }, 2s));
}

TEST(ClusterMembership, CordonStopsPlacementsAndANamedNodeIsChecked) {
  testing::EtcdCluster etcd(1);
  auto a = make_node(etcd, "a");
  auto b = make_node(etcd, "b");
  ASSERT_TRUE(eventually([&] { return a->peers_up().size() == 1; }, 3s));
  ASSERT_TRUE(a->set_cordon("b", true));
  EXPECT_TRUE(eventually([&] { return state_of(*b, "b") == "cordoned"; }, 2s));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a->place("c" + std::to_string(i), "t")->node, "a");
  auto named = a->place("n1", "t", "b");
  ASSERT_FALSE(named);
  EXPECT_EQ(named.error().code, Code::kExists);
  auto unknown = a->place("n2", "t", "zz");
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, Code::kNotFound);
  ASSERT_TRUE(a->set_cordon("b", false));
  EXPECT_EQ(a->place("n3", "t", "b")->node, "b");
  EXPECT_EQ(a->set_cordon("zz", true).error().code, Code::kNotFound);
}

TEST(ClusterMembership, LocalSessionsAreEnteredOnStartAndEtcdDownRefusesOnlyNewIds) {
  testing::EtcdCluster etcd(1);
  auto a = make_node(etcd, "a", 1, {{"kept", "t"}});
  EXPECT_TRUE(a->owner("kept").has_value());
  EXPECT_TRUE(a->owner("kept")->self);
  {
    auto b = make_node(etcd, "b", 1);
    ASSERT_TRUE(eventually([&] { return b->owner("kept").has_value(); }, 2s));
    EXPECT_EQ(b->owner("kept")->node, "a");
    EXPECT_TRUE(b->owner("kept")->up);
  }
  // etcd gone: no new placement, but the cache still answers for what the node owns.
  etcd.kill(0);
  auto place = a->place("new-id", "t");
  ASSERT_FALSE(place);
  EXPECT_EQ(place.error().code, Code::kUnavailable);
  EXPECT_NE(place.error().message.find("session catalog"), std::string::npos)
      << place.error().message;
  EXPECT_TRUE(a->owner("kept")->self);  // the cache still serves
  etcd.restart(0);
  EXPECT_TRUE(eventually([&] { return a->place("new-id", "t").has_value(); }, 5s));
  EXPECT_TRUE(eventually([&] { return a->etcd_healthy(); }, 3s));
}

TEST(ForwardAuth, SignatureVerifiesOnlyUnchangedAndFresh) {
  const std::int64_t now = 1'700'000'000;
  std::string h = sign_forward("k", "POST", "/v1/sessions/x/exec", "alice", "team", now);
  auto ok = verify_forward("k", h, "POST", "/v1/sessions/x/exec", now + 30);
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->caller, "alice");
  EXPECT_EQ(ok->tenant, "team");
  EXPECT_FALSE(verify_forward("other", h, "POST", "/v1/sessions/x/exec", now));
  EXPECT_FALSE(verify_forward("k", h, "GET", "/v1/sessions/x/exec", now));
  EXPECT_FALSE(verify_forward("k", h, "POST", "/v1/sessions/y/exec", now));
  EXPECT_FALSE(verify_forward("k", h, "POST", "/v1/sessions/x/exec", now + 61));
  EXPECT_FALSE(verify_forward("k", h, "POST", "/v1/sessions/x/exec", now - 61));
  std::string forged = h;
  forged.replace(forged.find("tenant=team"), 11, "tenant=root");
  auto bad = verify_forward("k", forged, "POST", "/v1/sessions/x/exec", now);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Code::kUnauthorized);
  EXPECT_FALSE(verify_forward("k", "caller=a;tenant=b", "POST", "/", now));
  EXPECT_FALSE(verify_forward("", h, "POST", "/v1/sessions/x/exec", now));
}

}  // namespace
}  // namespace agentbox::cluster

namespace agentbox::cluster {
namespace {
TEST(ClusterMembership, OtherNodesLearnAPlacementThroughTheWatchOnThreeMembers) {
  testing::EtcdCluster etcd(3);
  auto a = make_node(etcd, "a");
  auto b = make_node(etcd, "b");
  ASSERT_TRUE(eventually([&] { return a->peers_up().size() == 1; }, 3s));
  ASSERT_TRUE(a->place("zz", "t", "a"));
  EXPECT_TRUE(eventually([&] { return b->owner("zz").has_value(); }, 3s));
}
}  // namespace
}  // namespace agentbox::cluster
