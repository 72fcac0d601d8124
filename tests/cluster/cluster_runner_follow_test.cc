// A remote session's ownership follows its runner (API.md "Cluster", server/runner_follow.cc):
// three etcd members, three agentboxd nodes and a real agentbox-runner that reconnects to
// another node.

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "cluster/cluster_fixture.h"

namespace agentbox::testing {
namespace {

class ClusterRunnerFollow : public ClusterFixture {
 protected:
  // Whether node `i` lists runner alice as connected.
  bool connected_to(int i) {
    const ApiReply r = api(node(i)).get("/v1/runners");
    for (const auto& x : r.body["runners"]) {
      if (x["user"] == "alice") return x["connected"] == true;
    }
    return false;
  }

  // Alice's runner (workspace `ws`) dialling node `i`, registered there.
  std::unique_ptr<RunnerProcess> runner_on(int i, const std::string& ws) {
    auto r = std::make_unique<RunnerProcess>("127.0.0.1:" + std::to_string(node(i).port), "alice",
                                             kRunnerToken, ws);
    EXPECT_TRUE(eventually([&] { return connected_to(i); }, 30)) << "runner on n" << i;
    return r;
  }

  // How many times node `i`'s cluster-wide list shows session `id`.
  int listed(int i, const std::string& id) {
    const ApiReply r = api(node(i)).get("/v1/sessions");
    int n = 0;
    for (const auto& s : r.body["sessions"]) n += s["id"] == id ? 1 : 0;
    return n;
  }
};

TEST_F(ClusterRunnerFollow, ARemoteSessionFollowsItsRunnerToAnotherNode) {
  TempDir ws("agentbox-cluster-follow-ws");
  auto runner = runner_on(3, ws.path());
  auto made = api(node(1)).post("/v1/sessions", {{"id", "rs"},
                                                 {"runner", "alice"},
                                                 {"env", {{"FOLLOW_ME", "yes"}}},
                                                 {"labels", {{"team", "blue"}}}});
  ASSERT_EQ(made.status, 201) << made;
  ASSERT_EQ(made.body["node"], "n3") << made;
  auto wrote = api(node(1)).sh("rs", "echo kept > f.txt");
  ASSERT_EQ(wrote.status, 200) << wrote;

  // The runner reconnects to n2 (same workspace): the session's owner becomes n2.
  runner.reset();
  ASSERT_TRUE(eventually([&] { return !connected_to(3); }, 10));
  runner = runner_on(2, ws.path());
  ApiReply got;
  ASSERT_TRUE(eventually(
      [&] {
        got = api(node(1)).get("/v1/sessions/rs");
        return got.status == 200 && got.body["node"] == "n2";
      },
      15))
      << got << "\nn3:\n"
      << node(3).daemon->log();
  EXPECT_EQ(got.body["backend"], "remote");
  EXPECT_EQ(got.body["labels"]["team"], "blue") << got;
  // Served by the runner through any node: its files and the session's env are there.
  for (int via : {1, 3}) {
    auto r = api(node(via)).sh("rs", "cat f.txt; echo $FOLLOW_ME");
    ASSERT_EQ(r.status, 200) << via << ": " << r;
    EXPECT_EQ(r.body["stdout"], "kept\nyes\n") << via << ": " << r;
  }
  for (int i : {1, 2, 3}) EXPECT_EQ(listed(i, "rs"), 1) << "n" << i;
  EXPECT_TRUE(eventually(
      [&] {
        return slurp(node(3).data->path() + "/audit.log").find("session.follow") !=
               std::string::npos;
      },
      5));

  // And back: a node that held the session before adopts it again.
  runner.reset();
  ASSERT_TRUE(eventually([&] { return !connected_to(2); }, 10));
  runner = runner_on(3, ws.path());
  ASSERT_TRUE(eventually(
      [&] {
        got = api(node(2)).get("/v1/sessions/rs");
        return got.status == 200 && got.body["node"] == "n3";
      },
      15))
      << got << "\nn2:\n"
      << node(2).daemon->log();
  auto back = api(node(2)).sh("rs", "cat f.txt");
  EXPECT_EQ(back.body["stdout"], "kept\n") << back;
  for (int i : {1, 2, 3}) EXPECT_EQ(listed(i, "rs"), 1) << "n" << i;
}

TEST_F(ClusterRunnerFollow, AnAdoptFromAClientIsRefused) {
  TempDir ws("agentbox-cluster-follow-ws");
  auto runner = runner_on(2, ws.path());
  const std::string spec = R"({"backend":"remote","runner":"alice"})";
  // A client with a token: the route is for nodes (403); with a forward header of its own: 401.
  auto plain =
      api(node(2)).call("POST", "/v1/cluster/sessions/x/adopt", spec, "application/json", {});
  EXPECT_EQ(plain.status, 403) << plain;
  const std::string now = std::to_string(::time(nullptr));
  auto forged = api(node(2)).call("POST", "/v1/cluster/sessions/x/adopt", spec, "application/json",
                                  {{"X-Agentbox-Forwarded", "caller=team;tenant=team;ts=" + now +
                                                                ";sig=" + std::string(64, 'a')}});
  EXPECT_EQ(forged.status, 401) << forged;
  auto cancel = api(node(2)).call("POST", "/v1/cluster/sessions/x/adopt?cancel=1", "",
                                  "application/json", {});
  EXPECT_EQ(cancel.status, 403) << cancel;
  // Nothing was made.
  EXPECT_EQ(api(node(2)).get("/v1/sessions/x").status, 404);
}

TEST_F(ClusterRunnerFollow, AnOwnerThatWasDownHandsItsRemoteSessionsOverWhenItReturns) {
  TempDir ws("agentbox-cluster-follow-ws");
  auto runner = runner_on(3, ws.path());
  auto made = api(node(1)).post("/v1/sessions", {{"id", "rd"}, {"runner", "alice"}});
  ASSERT_EQ(made.status, 201) << made;
  ASSERT_EQ(made.body["node"], "n3") << made;
  ASSERT_EQ(api(node(1)).sh("rd", "echo before > g.txt").status, 200);
  node(3).daemon->stop(SIGKILL);
  runner.reset();
  runner = runner_on(2, ws.path());
  // Its owner is down (once its lease is gone): 503 naming it, never made anew on the runner's
  // node meanwhile.
  ApiReply down;
  EXPECT_TRUE(eventually(
      [&] {
        down = api(node(1)).get("/v1/sessions/rd");
        return down.status == 503 &&
               down.message().find("is on node n3, which is down") != std::string::npos;
      },
      10))
      << down;
  EXPECT_EQ(api(node(2)).get("/v1/sessions/rd").status, 503);
  // Back, the owner hands it over to the runner's node.
  start(node(3));
  ApiReply got;
  ASSERT_TRUE(eventually(
      [&] {
        got = api(node(1)).get("/v1/sessions/rd");
        return got.status == 200 && got.body["node"] == "n2";
      },
      30))
      << got << "\nn3:\n"
      << node(3).daemon->log();
  auto r = api(node(3)).sh("rd", "cat g.txt");
  EXPECT_EQ(r.body["stdout"], "before\n") << r;
  for (int i : {1, 2, 3}) EXPECT_EQ(listed(i, "rd"), 1) << "n" << i;
}

}  // namespace
}  // namespace agentbox::testing
