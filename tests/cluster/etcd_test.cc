// cluster::EtcdClient against real etcd members (Debian's etcd-server).

#include "cluster/etcd.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "support/etcd.h"

namespace agentbox::cluster {
namespace {

using namespace std::chrono_literals;

EtcdOptions options_for(const testing::EtcdCluster& etcd) {
  EtcdOptions o;
  o.endpoints = etcd.endpoints();
  o.timeout = 1000ms;
  return o;
}

TEST(Etcd, PutRangeAndEraseBinarySafeKeysAndValues) {
  testing::EtcdCluster etcd(1);
  EtcdClient c(options_for(etcd));
  std::string value("a\0b\xff{\"json\"}", 12);
  ASSERT_TRUE(c.put("/t/one", value));
  ASSERT_TRUE(c.put("/t/two", "2"));
  ASSERT_TRUE(c.put("/u/other", "x"));
  auto one = c.range("/t/one");
  ASSERT_TRUE(one) << one.error().message;
  ASSERT_EQ(one->kvs.size(), 1u);
  EXPECT_EQ(one->kvs[0].value, value);
  EXPECT_GT(one->revision, 0);
  auto all = c.range_prefix("/t/");
  ASSERT_TRUE(all);
  ASSERT_EQ(all->kvs.size(), 2u);
  EXPECT_EQ(all->kvs[0].key, "/t/one");
  EXPECT_EQ(all->kvs[1].key, "/t/two");
  auto gone = c.erase("/t/", prefix_end("/t/"));
  ASSERT_TRUE(gone);
  EXPECT_EQ(*gone, 2);
  EXPECT_TRUE(c.range_prefix("/t/")->kvs.empty());
  EXPECT_EQ(c.range("/u/other")->kvs.size(), 1u);
}

TEST(Etcd, CreateIfAbsentHasOneWinnerAmongRacers) {
  testing::EtcdCluster etcd(1);
  EtcdClient c(options_for(etcd));
  constexpr int kRacers = 16;
  std::vector<std::thread> threads;
  std::atomic<int> winners{0};
  std::mutex mu;
  std::vector<std::string> seen;
  for (int i = 0; i < kRacers; ++i) {
    threads.emplace_back([&, i] {
      auto r = c.create_if_absent("/race/key", "owner-" + std::to_string(i));
      ASSERT_TRUE(r) << r.error().message;
      std::lock_guard lock(mu);
      if (r->succeeded) {
        ++winners;
        seen.push_back("owner-" + std::to_string(i));
      } else {
        seen.push_back(r->existing.value);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(winners.load(), 1);
  ASSERT_EQ(seen.size(), static_cast<std::size_t>(kRacers));
  for (const auto& s : seen) EXPECT_EQ(s, seen[0]);  // every racer names the one owner
  EXPECT_EQ(c.range("/race/key")->kvs.at(0).value, seen[0]);
  // erase_if_value: only while the value is still the one named.
  EXPECT_FALSE(*c.erase_if_value("/race/key", "someone-else"));
  EXPECT_TRUE(*c.erase_if_value("/race/key", seen[0]));
  EXPECT_TRUE(c.range("/race/key")->kvs.empty());
}

TEST(Etcd, LeaseBoundKeyGoesWhenTheLeaseExpiresAndKeepaliveHoldsIt) {
  testing::EtcdCluster etcd(1);
  EtcdClient c(options_for(etcd));
  auto lease = c.lease_grant(2);
  ASSERT_TRUE(lease) << lease.error().message;
  ASSERT_TRUE(c.put("/alive/n1", "", *lease));
  EXPECT_EQ(c.range("/alive/n1")->kvs.at(0).lease, *lease);
  // Kept alive for 3 s (past its TTL): still there.
  for (int i = 0; i < 6; ++i) {
    auto ttl = c.lease_keepalive(*lease);
    ASSERT_TRUE(ttl) << ttl.error().message;
    EXPECT_GT(*ttl, 0);
    std::this_thread::sleep_for(500ms);
  }
  EXPECT_EQ(c.range("/alive/n1")->kvs.size(), 1u);
  // Left alone: gone within TTL + 1 s, and a keepalive then says 0 (expired).
  auto deadline = std::chrono::steady_clock::now() + 4s;
  while (!c.range("/alive/n1")->kvs.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(c.range("/alive/n1")->kvs.empty());
  EXPECT_EQ(*c.lease_keepalive(*lease), 0);
  // Revoke ends a lease at once.
  auto l2 = c.lease_grant(30);
  ASSERT_TRUE(l2);
  ASSERT_TRUE(c.put("/alive/n2", "", *l2));
  ASSERT_TRUE(c.lease_revoke(*l2));
  EXPECT_TRUE(c.range("/alive/n2")->kvs.empty());
}

TEST(Etcd, WatchSeesPutsAndDeletesInOrderAndStops) {
  testing::EtcdCluster etcd(1);
  EtcdClient c(options_for(etcd));
  auto start = c.range_prefix("/w/");
  ASSERT_TRUE(start);
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::string> seen;
  std::thread watcher([&] {
    while (!stop.load()) {
      (void)c.watch(
          "/w/", prefix_end("/w/"), start->revision + 1,
          [&](const WatchEvent& ev) {
            std::lock_guard lock(mu);
            seen.push_back((ev.deleted ? "DEL " : "PUT ") + ev.kv.key + "=" + ev.kv.value);
          },
          stop, 500ms);
    }
  });
  ASSERT_TRUE(c.put("/w/a", "1"));
  ASSERT_TRUE(c.put("/w/b", "2"));
  ASSERT_TRUE(c.put("/x/outside", "3"));
  ASSERT_TRUE(c.erase("/w/a"));
  auto deadline = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    {
      std::lock_guard lock(mu);
      if (seen.size() >= 3 || std::chrono::steady_clock::now() > deadline) break;
    }
    std::this_thread::sleep_for(20ms);
  }
  stop = true;
  auto t0 = std::chrono::steady_clock::now();
  watcher.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);  // a stopped watch ends promptly
  std::lock_guard lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"PUT /w/a=1", "PUT /w/b=2", "DEL /w/a="}));
}

TEST(Etcd, ThreeMembersSurviveOneDownAndNoQuorumIsUnavailable) {
  testing::EtcdCluster etcd(3);
  EtcdClient c(options_for(etcd));
  ASSERT_TRUE(c.put("/q/k", "v"));
  etcd.kill(0);  // the client's preferred endpoint, most likely: it moves on
  auto r = c.range("/q/k");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->kvs.at(0).value, "v");
  ASSERT_TRUE(c.put("/q/k2", "v2"));
  etcd.kill(1);  // one of three left: no quorum
  auto w = c.put("/q/k3", "v3");
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, Code::kUnavailable) << w.error().message;
  etcd.kill(2);
  auto none = c.range("/q/k");
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Code::kUnavailable);
  EXPECT_NE(none.error().message.find("etcd unreachable"), std::string::npos);
  etcd.restart_all();
  auto back = c.range("/q/k2");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->kvs.at(0).value, "v2");
}

// etcd over https:// with client certificates (--client-cert-auth): the client verifies the
// members' certificate against the CA it is given and shows its own; the calls and the watch
// work as over http://, and a client that trusts another CA or shows no certificate gets
// nothing, with an error that says why.
TEST(Etcd, TlsWithAClientCertificateWorksAndAnUntrustedOneIsRefusedByName) {
  testing::EtcdCluster etcd(1, /*tls=*/true);
  ASSERT_EQ(etcd.endpoints().at(0).rfind("https://", 0), 0u);
  EtcdOptions o = options_for(etcd);
  o.ca_file = etcd.ca_file();
  o.cert_file = etcd.client_cert_file();
  o.key_file = etcd.client_key_file();
  EtcdClient c(o);
  ASSERT_TRUE(c.put("/tls/a", "1"));
  auto a = c.range("/tls/a");
  ASSERT_TRUE(a) << a.error().message;
  ASSERT_EQ(a->kvs.size(), 1u);
  EXPECT_EQ(a->kvs[0].value, "1");
  // The watch (a streamed reply) over TLS too.
  std::atomic<bool> stop{false};
  std::atomic<int> seen{0};
  std::thread watcher([&] {
    while (!stop.load()) {
      (void)c.watch(
          "/tls/", prefix_end("/tls/"), a->revision + 1, [&](const WatchEvent&) { seen++; }, stop,
          500ms);
    }
  });
  ASSERT_TRUE(c.put("/tls/b", "2"));
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (seen.load() < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  stop = true;
  watcher.join();
  EXPECT_EQ(seen.load(), 1);

  EtcdOptions wrong_ca = o;
  wrong_ca.ca_file = etcd.other_ca_file();
  auto refused = EtcdClient(wrong_ca).range("/tls/a");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::kUnavailable);
  EXPECT_NE(refused.error().message.find("certificate verify failed"), std::string::npos)
      << refused.error().message;

  EtcdOptions no_cert = o;
  no_cert.cert_file.clear();
  no_cert.key_file.clear();
  auto anonymous = EtcdClient(no_cert).range("/tls/a");
  ASSERT_FALSE(anonymous) << "etcd asks for a client certificate";
  EXPECT_EQ(anonymous.error().code, Code::kUnavailable);

  EtcdOptions plain = o;
  plain.endpoints = {"http://" + etcd.endpoints()[0].substr(8)};
  EXPECT_FALSE(EtcdClient(plain).range("/tls/a")) << "http:// to a TLS-only member";
}

}  // namespace
}  // namespace agentbox::cluster
