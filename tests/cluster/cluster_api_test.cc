// Cluster mode through real daemons (API.md "Cluster"): a three-member etcd cluster (Debian's
// etcd-server, support/etcd.h) and three agentboxd nodes on loopback, driven over real HTTP.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "cluster/cluster_fixture.h"

namespace agentbox::testing {
namespace {

using namespace std::chrono_literals;

class ClusterApi : public ClusterFixture {};

TEST_F(ClusterApi, ThreeNodesFormAClusterAndNewSessionsSpreadOverThem) {
  auto c = api(node(1)).get("/v1/cluster");
  ASSERT_EQ(c.status, 200) << c;
  EXPECT_EQ(c.body["mode"], "etcd");
  EXPECT_EQ(c.body["node"], "n1");
  EXPECT_EQ(c.body["etcd"]["healthy"], true);
  EXPECT_EQ(c.body["etcd"]["endpoints"].size(), 3u);
  ASSERT_EQ(c.body["nodes"].size(), 3u);
  std::set<std::string> digests;
  for (const auto& n : c.body["nodes"]) {
    EXPECT_EQ(n["state"], "up") << n;
    EXPECT_TRUE(n["advertise"].get<std::string>().rfind("http://127.0.0.1:", 0) == 0) << n;
    EXPECT_TRUE(is_rfc3339_utc(n["last_seen"])) << n;
    EXPECT_GT(n["free_memory_mb"].get<std::uint64_t>(), 0u) << n;
    digests.insert(n["config_digest"]);
  }
  EXPECT_EQ(digests.size(), 1u);  // one config: one digest

  // 30 new sessions through node 1: spread over the three (equal free memory here).
  std::map<std::string, int> per_node;
  for (int i = 0; i < 30; ++i) {
    auto r = api(node(1)).post("/v1/sessions", {{"id", "spread-" + std::to_string(i)}});
    ASSERT_EQ(r.status, 201) << r;
    ++per_node[r.body["node"].get<std::string>()];
  }
  for (const char* n : {"n1", "n2", "n3"}) EXPECT_NEAR(per_node[n], 10, 3) << n;
  // Each lives on its node: its workspace is in that node's data dir, nowhere else.
  auto g = api(node(3)).get("/v1/sessions/spread-0");
  ASSERT_EQ(g.status, 200) << g;
  const std::string owner = g.body["node"];
  for (auto& n : nodes_) {
    EXPECT_EQ(std::filesystem::exists(n.data->path() + "/workspaces/spread-0"), n.name == owner)
        << n.name;
  }
  // The list through any node is the whole cluster's, each with its node.
  auto list = api(node(2)).get("/v1/sessions");
  ASSERT_EQ(list.status, 200) << list;
  std::map<std::string, std::string> seen;
  for (const auto& s : list.body["sessions"]) seen[s["id"]] = s["node"];
  EXPECT_EQ(seen.size(), 30u);
  EXPECT_EQ(seen["spread-0"], owner);
  // A named node is honoured; an unknown one is 404, naming it.
  create_on(1, "named", "n3");
  auto unknown = api(node(1)).post("/v1/sessions", {{"id", "x"}, {"node", "n9"}});
  EXPECT_EQ(unknown.status, 404) << unknown;
  EXPECT_NE(unknown.message().find("n9"), std::string::npos) << unknown;
}

TEST_F(ClusterApi, FiftyRacingCreatesOfOneIdThroughThreeNodesHaveOneOwner) {
  std::vector<std::thread> threads;
  std::mutex mu;
  std::map<int, int> statuses;
  std::set<std::string> owners;
  for (int i = 0; i < 50; ++i) {
    threads.emplace_back([&, i] {
      auto r = api(node(1 + i % 3)).post("/v1/sessions", {{"id", "raced"}});
      std::lock_guard lock(mu);
      ++statuses[r.status];
      if (r.body.is_object() && r.body.contains("node")) owners.insert(r.body["node"]);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(statuses[201], 1);   // made once
  EXPECT_EQ(statuses[200], 49);  // the others got that session
  EXPECT_EQ(owners.size(), 1u);
  int workspaces = 0;
  for (auto& n : nodes_) {
    workspaces += std::filesystem::exists(n.data->path() + "/workspaces/raced") ? 1 : 0;
  }
  EXPECT_EQ(workspaces, 1);
}

TEST_F(ClusterApi, ExecStreamsAndFilesWorkThroughANodeThatDoesNotOwnTheSession) {
  create_on(1, "far", "n2");
  // exec through n1 (owner n2).
  auto e = api(node(1)).sh("far", "echo hello from $(hostname) >/dev/null; echo hi; pwd");
  ASSERT_EQ(e.status, 200) << e;
  EXPECT_EQ(e.body["exit_code"], 0);
  EXPECT_EQ(e.body["stdout"].get<std::string>().substr(0, 3), "hi\n");
  // An NDJSON stream through n3: each line as the owner sends it.
  auto c3 = api(node(3));
  std::vector<std::string> chunks;
  auto t0 = std::chrono::steady_clock::now();
  std::chrono::milliseconds first_at{0};
  std::chrono::milliseconds last_at{0};
  auto s = c3.client().request_stream(
      "POST", "/v1/sessions/far/exec/stream",
      json{{"command", "echo one; sleep 1; echo two"}}.dump(), [&](std::string_view d) {
        last_at = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - t0);
        if (chunks.empty()) first_at = last_at;
        chunks.emplace_back(d);
        return true;
      });
  ASSERT_TRUE(s) << s.error().message;
  ASSERT_EQ(s->status, 200);
  std::string all;
  for (const auto& ch : chunks) all += ch;
  EXPECT_NE(all.find("\"one\\n\""), std::string::npos) << all;
  EXPECT_NE(all.find("\"two\\n\""), std::string::npos) << all;
  EXPECT_NE(all.find("\"type\":\"exit\""), std::string::npos) << all;
  // Streamed, not buffered: the first line came well before the end, which the command's
  // `sleep 1` keeps a second away (relative times: a slow machine shifts both).
  EXPECT_GE(last_at - first_at, 500ms) << "the first line waited for the end of the command";
  // An 8 MiB upload through n3 and its download through n1, byte for byte.
  std::string data(8u << 20, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 131) >> 3);
  auto up = c3.put(files_target("far", "big.bin"), data);
  ASSERT_TRUE(up.status == 200 || up.status == 201) << up;
  EXPECT_EQ(read_host_file(node(2).data->path() + "/workspaces/far/big.bin").size(), data.size());
  auto down = api(node(1)).get(files_target("far", "big.bin"));
  ASSERT_EQ(down.status, 200);
  EXPECT_TRUE(down.raw == data) << "download differs (" << down.raw.size() << " bytes)";
  // Two more requests on the same kept-alive connection to n1 still work (the relay framed
  // the replies right).
  EXPECT_EQ(api(node(1)).get("/v1/sessions/far").body["node"], "n2");
  auto d = api(node(1)).del("/v1/sessions/far");
  EXPECT_EQ(d.status, 200) << d;
  EXPECT_TRUE(eventually([&] { return api(node(3)).get("/v1/sessions/far").status == 404; }, 5));
}

TEST_F(ClusterApi, AKilledNodesSessionsAre503UntilItComesBack) {
  create_on(1, "on1", "n1");
  create_on(1, "on3", "n3");
  ASSERT_EQ(api(node(1)).sh("on3", "echo kept > f.txt").status, 200);
  node(3).daemon->stop(SIGKILL);
  auto killed = std::chrono::steady_clock::now();
  ApiReply r;
  ASSERT_TRUE(eventually(
      [&] {
        r = api(node(1)).get("/v1/sessions/on3");
        return r.message().find("which is down since") != std::string::npos;
      },
      kLeaseSec + 2))
      << r;
  EXPECT_LE(std::chrono::steady_clock::now() - killed, std::chrono::seconds(kLeaseSec + 2));
  EXPECT_EQ(r.code(), "EUNAVAILABLE");
  EXPECT_NE(r.message().find("session on3 is on node n3, which is down since"), std::string::npos)
      << r;
  // Every route, through every node.
  auto ex = api(node(2)).sh("on3", "true");
  EXPECT_EQ(ex.status, 503) << ex;
  EXPECT_NE(ex.message().find("node n3"), std::string::npos) << ex;
  // The other nodes' sessions are untouched.
  EXPECT_EQ(api(node(2)).sh("on1", "true").status, 200);
  auto c = api(node(1)).get("/v1/cluster");
  for (const auto& n : c.body["nodes"]) {
    EXPECT_EQ(n["state"], n["name"] == "n3" ? "down" : "up") << n;
  }
  // A new id is not placed on a down node.
  auto named = api(node(1)).post("/v1/sessions", {{"id", "new"}, {"node", "n3"}});
  EXPECT_EQ(named.status, 503) << named;
  // n3 back with its data dir: served again, with its files.
  start(node(3));
  ApiReply back;
  ASSERT_TRUE(eventually(
      [&] {
        back = api(node(1)).sh("on3", "cat f.txt");
        return back.status == 200;
      },
      10))
      << back;
  EXPECT_EQ(back.body["stdout"], "kept\n");
}

TEST_F(ClusterApi, WithEtcdDownOwnedSessionsServeAndNewIdsAre503UntilItReturns) {
  create_on(1, "mine", "n1");
  create_on(1, "theirs", "n2");
  etcd_->kill_all();
  // What a node owns is served (and forwarded: the catalog cache knows the owner).
  EXPECT_EQ(api(node(1)).sh("mine", "echo ok").body["stdout"], "ok\n");
  EXPECT_EQ(api(node(1)).sh("theirs", "echo ok").body["stdout"], "ok\n");
  auto made = api(node(1)).post("/v1/sessions", {{"id", "fresh"}});
  EXPECT_EQ(made.status, 503) << made;
  EXPECT_EQ(made.code(), "EUNAVAILABLE");
  EXPECT_NE(made.message().find("session catalog"), std::string::npos) << made;
  auto c = api(node(1)).get("/v1/cluster");
  EXPECT_TRUE(eventually(
      [&] { return api(node(1)).get("/v1/cluster").body["etcd"]["healthy"] == false; }, 5));
  etcd_->restart_all();
  ApiReply again;
  EXPECT_TRUE(eventually(
      [&] {
        again = api(node(1)).post("/v1/sessions", {{"id", "fresh"}});
        return again.status == 201;
      },
      10))
      << again;
  EXPECT_TRUE(eventually(
      [&] { return api(node(2)).get("/v1/cluster").body["etcd"]["healthy"] == true; }, 5));
}

TEST_F(ClusterApi, AForwardHeaderFromAClientIs401AndAudited) {
  create_on(1, "target", "n2");
  const std::string now = std::to_string(::time(nullptr));
  for (const std::string& h :
       {"caller=team;tenant=ops;ts=" + now + ";sig=00ff", std::string("caller=team;tenant=ops"),
        "caller=team;tenant=team;ts=1;sig=" + std::string(64, 'a')}) {
    auto r = api(node(2)).call("POST", "/v1/sessions/target/exec", R"({"command":"true"})",
                               "application/json", {{"X-Agentbox-Forwarded", h}});
    EXPECT_EQ(r.status, 401) << h << " " << r;
    EXPECT_EQ(r.code(), "EUNAUTHORIZED");
  }
  EXPECT_NE(slurp(node(2).data->path() + "/audit.log").find("cluster.forward_refused"),
            std::string::npos);
}

TEST_F(ClusterApi, CordonIsForAdminsAndStopsPlacementsOnTheNode) {
  auto denied = api(node(1)).post("/v1/cluster/nodes/n2/cordon", json::object());
  EXPECT_EQ(denied.status, 403) << denied;
  auto ok = api(node(1), kAdminToken).post("/v1/cluster/nodes/n2/cordon", json::object());
  ASSERT_EQ(ok.status, 200) << ok;
  EXPECT_EQ(ok.body["state"], "cordoned");
  ASSERT_TRUE(eventually(
      [&] {
        auto c = api(node(3)).get("/v1/cluster");
        for (const auto& n : c.body["nodes"]) {
          if (n["name"] == "n2") return n["state"] == "cordoned";
        }
        return false;
      },
      5));
  for (int i = 0; i < 9; ++i) {
    auto r = api(node(3)).post("/v1/sessions", {{"id", "c" + std::to_string(i)}});
    ASSERT_EQ(r.status, 201) << r;
    EXPECT_NE(r.body["node"], "n2") << r;
  }
  auto named = api(node(3)).post("/v1/sessions", {{"id", "cx"}, {"node", "n2"}});
  EXPECT_EQ(named.status, 409) << named;
  auto un = api(node(1), kAdminToken).post("/v1/cluster/nodes/n2/uncordon", json::object());
  ASSERT_EQ(un.status, 200) << un;
  EXPECT_EQ(api(node(3)).post("/v1/sessions", {{"id", "cx"}, {"node", "n2"}}).status, 201);
  EXPECT_EQ(api(node(1), kAdminToken).post("/v1/cluster/nodes/n9/cordon", json::object()).status,
            404);
}

TEST_F(ClusterApi, MoveTakesASessionToAnotherNodeWithItsFilesAndSettings) {
  auto made = api(node(1)).post("/v1/sessions", {{"id", "mv"},
                                                 {"node", "n1"},
                                                 {"labels", {{"team", "x"}}},
                                                 {"env", {{"FOO", "bar"}}},
                                                 {"ttl_sec", 777}});
  ASSERT_EQ(made.status, 201) << made;
  ASSERT_EQ(api(node(1)).sh("mv", "mkdir -p d; echo kept > d/f.txt").status, 200);
  // Through n3, which neither holds it nor takes it.
  auto m = api(node(3)).post("/v1/sessions/mv/move", {{"node", "n2"}});
  ASSERT_EQ(m.status, 200) << m;
  EXPECT_EQ(m.body["node"], "n2");
  EXPECT_EQ(m.body["labels"]["team"], "x");
  EXPECT_EQ(m.body["ttl_sec"], 777);
  // Its files are on n2 now, and only there.
  EXPECT_EQ(read_host_file(node(2).data->path() + "/workspaces/mv/d/f.txt"), "kept\n");
  EXPECT_FALSE(std::filesystem::exists(node(1).data->path() + "/workspaces/mv"));
  // Every node sends it to n2 (the catalog says so), with its env.
  for (int via : {1, 2, 3}) {
    ApiReply r;
    EXPECT_TRUE(eventually(
        [&] {
          r = api(node(via)).sh("mv", "cat d/f.txt; echo $FOO; pwd");
          return r.status == 200 &&
                 r.body["stdout"] == "kept\nbar\n" + node(2).data->path() + "/workspaces/mv\n";
        },
        5))
        << via << ": " << r;
  }
  // Nothing left behind on n1 (no archive, no workspace).
  EXPECT_TRUE(!std::filesystem::exists(node(1).data->path() + "/archives") ||
              std::filesystem::is_empty(node(1).data->path() + "/archives"));
  // To where it is: the session as it is; to nowhere: 404; to a cordoned node: 409.
  EXPECT_EQ(api(node(1)).post("/v1/sessions/mv/move", {{"node", "n2"}}).body["node"], "n2");
  EXPECT_EQ(api(node(1)).post("/v1/sessions/mv/move", {{"node", "n9"}}).status, 404);
  ASSERT_EQ(api(node(1), kAdminToken).post("/v1/cluster/nodes/n3/cordon", json::object()).status,
            200);
  ApiReply seen;
  ASSERT_TRUE(eventually(
      [&] {
        seen = api(node(2)).get("/v1/cluster");
        for (const auto& n : seen.body["nodes"]) {
          if (n["name"] == "n3") return n["state"] == "cordoned";
        }
        return false;
      },
      5))
      << seen;
  auto cordoned = api(node(1)).post("/v1/sessions/mv/move", {{"node", "n3"}});
  EXPECT_EQ(cordoned.status, 409) << cordoned;
  auto bad = api(node(1)).post("/v1/sessions/mv/move", {{"node", 3}});
  EXPECT_EQ(bad.status, 400) << bad;
  EXPECT_NE(bad.message().find("node"), std::string::npos) << bad;
  EXPECT_EQ(api(node(1)).post("/v1/sessions/nope/move", {{"node", "n1"}}).status, 404);
}

TEST_F(ClusterApi, AMoveTheTargetRefusesLeavesTheSessionWhereItWas) {
  // Tenant "small" may hold one session per node: n2 holds one, so it refuses a second.
  auto a = api(node(1), kSmallToken).post("/v1/sessions", {{"id", "q1"}, {"node", "n2"}});
  ASSERT_EQ(a.status, 201) << a;
  auto b = api(node(1), kSmallToken).post("/v1/sessions", {{"id", "q2"}, {"node", "n1"}});
  ASSERT_EQ(b.status, 201) << b;
  ASSERT_EQ(api(node(1), kSmallToken).sh("q2", "echo mine > f.txt").status, 200);
  auto m = api(node(3), kSmallToken).post("/v1/sessions/q2/move", {{"node", "n2"}});
  EXPECT_EQ(m.status, 429) << m;
  EXPECT_NE(m.message().find("was not moved (it stays on node n1)"), std::string::npos) << m;
  // Still on n1 with its files, served through every node.
  EXPECT_TRUE(eventually(
      [&] { return api(node(2), kSmallToken).get("/v1/sessions/q2").body["node"] == "n1"; }, 5));
  EXPECT_TRUE(eventually(
      [&] { return api(node(3), kSmallToken).sh("q2", "cat f.txt").body["stdout"] == "mine\n"; },
      5));
  EXPECT_FALSE(std::filesystem::exists(node(2).data->path() + "/workspaces/q2"));
  EXPECT_TRUE(!std::filesystem::exists(node(1).data->path() + "/archives") ||
              std::filesystem::is_empty(node(1).data->path() + "/archives"));
  // Another tenant's session is not there to move.
  EXPECT_EQ(api(node(1)).post("/v1/sessions/q2/move", {{"node", "n3"}}).status, 404);
}

TEST_F(ClusterApi, ARemoteSessionIsPlacedOnTheNodeItsRunnerIsConnectedTo) {
  TempDir ws("agentbox-cluster-runner-ws");
  auto connected_to = [&](int i) {
    const ApiReply r = api(node(i)).get("/v1/runners");
    for (const auto& x : r.body["runners"]) {
      if (x["user"] == "alice") return x["connected"] == true;
    }
    return false;
  };
  auto runner = std::make_unique<RunnerProcess>("127.0.0.1:" + std::to_string(node(3).port),
                                                "alice", kRunnerToken, ws.path());
  ASSERT_TRUE(eventually([&] { return connected_to(3); }, 30));
  // Made through n1, which has no runner: it lands where alice's runner is.
  auto made = api(node(1)).post("/v1/sessions", {{"id", "rs"}, {"runner", "alice"}});
  ASSERT_EQ(made.status, 201) << made;
  EXPECT_EQ(made.body["node"], "n3");
  EXPECT_EQ(made.body["backend"], "remote");
  for (int via : {1, 2, 3}) {
    auto r = api(node(via)).sh("rs", "echo hi" + std::to_string(via) + " > f.txt; pwd");
    ASSERT_EQ(r.status, 200) << via << ": " << r;
    const std::string dir = r.body["stdout"].get<std::string>();
    ASSERT_FALSE(dir.empty()) << r;
    EXPECT_EQ(dir.rfind(ws.path(), 0), 0u) << dir;  // the runner's workspace, on this host
    EXPECT_EQ(read_host_file(dir.substr(0, dir.size() - 1) + "/f.txt"),
              "hi" + std::to_string(via) + "\n");
  }
  // With the runner gone no node has it: the create is refused as on one daemon, and nothing
  // stays in the catalog.
  runner.reset();
  ASSERT_TRUE(eventually([&] { return !connected_to(3); }, 10));
  auto off = api(node(1)).post("/v1/sessions", {{"id", "rs2"}, {"runner", "alice"}});
  EXPECT_EQ(off.status, 503) << off;
  EXPECT_EQ(api(node(2)).get("/v1/sessions/rs2").status, 404);
}

TEST(ClusterSingle, ADaemonWithoutAClusterIsAClusterOfOne) {
  Daemon d({"--node-name", "solo"});
  Api a(d);
  auto c = a.get("/v1/cluster");
  ASSERT_EQ(c.status, 200) << c;
  EXPECT_EQ(c.body["mode"], "single");
  EXPECT_EQ(c.body["node"], "solo");
  ASSERT_EQ(c.body["nodes"].size(), 1u);
  EXPECT_EQ(c.body["nodes"][0]["name"], "solo");
  EXPECT_EQ(c.body["nodes"][0]["state"], "up");
  auto s = a.post("/v1/sessions", {{"id", "one"}});
  ASSERT_EQ(s.status, 201) << s;
  EXPECT_EQ(s.body["node"], "solo");
  // "node" is for cluster mode: refused, naming it.
  auto n = a.post("/v1/sessions", {{"id", "two"}, {"node", "solo"}});
  EXPECT_EQ(n.status, 501) << n;
  EXPECT_NE(n.message().find("node"), std::string::npos);
  // A forward header is never accepted from a client.
  auto f = a.call("GET", "/v1/sessions/one", {}, "application/json",
                  {{"X-Agentbox-Forwarded", "caller=x;tenant=default;ts=1;sig=00"}});
  EXPECT_EQ(f.status, 401) << f;
  // Cordons are for admins (here: nobody is one), and for clusters.
  auto cordon = a.post("/v1/cluster/nodes/solo/cordon", json::object());
  EXPECT_EQ(cordon.status, 403) << cordon;
}

}  // namespace
}  // namespace agentbox::testing
