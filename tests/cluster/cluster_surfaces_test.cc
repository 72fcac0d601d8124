// Every surface through a node that does not own the session (API.md "Cluster": "any node
// answers any route for any session"): the /v1 WebSockets (process attach, pty), seed 001 by
// agent_id, and the stock E2B and MCP SDKs through nginx round-robin in front of the three
// nodes, so that consecutive calls of one sandbox land on different nodes.

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "cluster/cluster_fixture.h"
#include "integration/langbot_client.h"
#include "integration/ws_test_util.h"

namespace agentbox::testing {
namespace {

namespace websocket = boost::beast::websocket;

class ClusterSurfaces : public ClusterFixture {
 protected:
  std::string host_port(int i) { return "127.0.0.1:" + std::to_string(node(i).port); }
  static std::string with_token(const std::string& target) {
    return target + (target.find('?') == std::string::npos ? "?" : "&") + "token=" + kToken;
  }
  // Cordons or uncordons node `name` and waits until node `seen_by` knows.
  void cordon(const std::string& name, bool on, int seen_by) {
    auto r =
        api(node(1), kAdminToken)
            .post("/v1/cluster/nodes/" + name + (on ? "/cordon" : "/uncordon"), json::object());
    ASSERT_EQ(r.status, 200) << r;
    ApiReply seen;
    ASSERT_TRUE(eventually(
        [&] {
          seen = api(node(seen_by)).get("/v1/cluster");
          for (const auto& n : seen.body["nodes"]) {
            if (n["name"] == name) return n["state"] == (on ? "cordoned" : "up");
          }
          return false;
        },
        5))
        << seen;
  }
  // The id and node of the (team's) session whose id ends with `suffix`, from the cluster's list.
  std::pair<std::string, std::string> find_session(const std::string& suffix) {
    const ApiReply list = api(node(1)).get("/v1/sessions");  // outlives the loop
    for (const auto& s : list.body["sessions"]) {
      const std::string id = s["id"];
      if (id.ends_with(suffix)) return {id, s["node"].get<std::string>()};
    }
    return {};
  }
};

std::string node_dir() {
  return AGENTBOX_NODE_DIR;
}

TEST_F(ClusterSurfaces, ProcessAttachAndPtyWebSocketsReachTheOwnerThroughAnotherNode) {
  create_on(1, "ws", "n2");
  // A line-mode process started through n3, attached through n1 (owner n2).
  auto started = api(node(3)).post("/v1/sessions/ws/processes",
                                   {{"command", "while read l; do echo \"$l\"; done; exit 4"},
                                    {"tag", "echo"},
                                    {"stdin", true}});
  ASSERT_EQ(started.status, 201) << started;
  Ws ws;
  ASSERT_FALSE(ws.open(host_port(1), with_token("/v1/sessions/ws/processes/echo/attach")));
  EXPECT_EQ(ws.status(), 101);
  const std::string call = R"({"jsonrpc":"2.0","id":1,"method":"ping"})";
  ws.write(call, false);
  auto reply = ws.read();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(*reply, call);
  // The owner's refusals come through as they are: a second attacher is 409.
  Ws second;
  EXPECT_EQ(second.open(host_port(3), with_token("/v1/sessions/ws/processes/echo/attach")),
            websocket::error::upgrade_declined);
  EXPECT_EQ(second.status(), 409);
  // The process ends: the close frame with its reason crosses the relay.
  ASSERT_EQ(api(node(1))
                .call("POST", "/v1/sessions/ws/processes/echo/stdin?close=true", "",
                      "application/octet-stream")
                .status,
            200);
  EXPECT_FALSE(ws.read().has_value());
  EXPECT_EQ(ws.reason().code, websocket::close_code::normal);
  EXPECT_EQ(reason_of(ws), "exit 4");

  // A terminal through n3: resize and typed bytes reach the owner's shell.
  Ws pty;
  ASSERT_FALSE(
      pty.open(host_port(3), with_token("/v1/sessions/ws/pty?cols=90&rows=30&command=sh")));
  pty.write("stty size; pwd; exit 7\n", true);
  std::string seen = pty.read_until("\x01never");  // to the end of the socket
  EXPECT_NE(seen.find("30 90"), std::string::npos) << seen;
  // The shell ran in the owner's workspace (host backend: under n2's data dir).
  EXPECT_NE(seen.find(node(2).data->path() + "/workspaces/ws"), std::string::npos) << seen;
  EXPECT_EQ(reason_of(pty), "exit 7");
  // Without a token the first node refuses the upgrade itself.
  Ws anon;
  EXPECT_EQ(anon.open(host_port(1), "/v1/sessions/ws/pty"), websocket::error::upgrade_declined);
  EXPECT_EQ(anon.status(), 401);
}

TEST_F(ClusterSurfaces, Seed001RoutesServeAnAgentFromAnyNode) {
  create_on(1, "agent-far", "n2");
  const std::string ws = node(2).data->path() + "/workspaces/agent-far";
  auto e = api(node(1)).post("/exec", {{"command", "pwd; echo hi"}, {"agent_id", "agent-far"}});
  ASSERT_EQ(e.status, 200) << e;
  EXPECT_EQ(e.body["stdout"], ws + "\nhi\n");
  // env.AGENT_ID names it too.
  auto env = api(node(3)).post(
      "/exec", {{"command", "echo $AGENT_ID"}, {"env", {{"AGENT_ID", "agent-far"}}}});
  ASSERT_EQ(env.status, 200) << env;
  EXPECT_EQ(env.body["stdout"], "agent-far\n");
  // write through n3, read through n1: the file is in n2's workspace only.
  auto w = api(node(3)).post("/workspace/write",
                             {{"agent_id", "agent-far"}, {"path", "n.txt"}, {"content", "x1"}});
  ASSERT_EQ(w.status, 200) << w;
  EXPECT_EQ(read_host_file(ws + "/n.txt"), "x1");
  EXPECT_FALSE(std::filesystem::exists(node(3).data->path() + "/workspaces/agent-far"));
  auto r = api(node(1)).post("/workspace/read", {{"agent_id", "agent-far"}, {"path", "n.txt"}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["content"], "x1");
  // /exec-stream through n3: NDJSON from the owner.
  auto s = api(node(3)).post("/exec-stream",
                             {{"command", "echo one; echo two"}, {"agent_id", "agent-far"}});
  ASSERT_EQ(s.status, 200) << s;
  EXPECT_NE(s.raw.find("one"), std::string::npos) << s;
  EXPECT_NE(s.raw.find("\"exit_code\":0"), std::string::npos) << s;
  // The owner's errors come back as they are.
  auto bad = api(node(1)).post("/workspace/read", {{"agent_id", "agent-far"}, {"path", "nope"}});
  EXPECT_EQ(bad.status, 404) << bad;
  // A new agent is made where its first request lands, and served from there afterwards.
  ASSERT_EQ(api(node(3)).post("/exec", {{"command", "true"}, {"agent_id", "agent-new"}}).status,
            200);
  EXPECT_EQ(api(node(1)).get("/v1/sessions/agent-new").body["node"], "n3");
  auto again = api(node(2)).post("/exec", {{"command", "pwd"}, {"agent_id", "agent-new"}});
  EXPECT_EQ(again.body["stdout"], node(3).data->path() + "/workspaces/agent-new\n") << again;
  // An agent on a dead node is 503 naming it, through seed 001 too.
  node(2).daemon->stop(SIGKILL);
  ApiReply down;
  ASSERT_TRUE(eventually(
      [&] {
        down = api(node(1)).post("/exec", {{"command", "true"}, {"agent_id", "agent-far"}});
        return down.status == 503;
      },
      kLeaseSec + 2))
      << down;
  EXPECT_NE(down.message().find("node n2"), std::string::npos) << down;
}

TEST_F(ClusterSurfaces, TheStockE2bSdkWorksThroughRoundRobinOverThreeNodes) {
  ASSERT_TRUE(std::filesystem::exists(node_dir() + "/node_modules/e2b/package.json"))
      << "the e2b SDK is not installed: run scripts/bootstrap";
  RoundRobin lb(backends());
  int status = -1;
  std::string out = run_shell(
      "cd " + node_dir() + " && node e2b_client.mjs " + lb.url() + "/e2b " + kToken + " 2>&1",
      &status);
  ASSERT_EQ(status, 0) << out << "\n" << lb.log();
  json r = json::parse(out, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << out;
  SCOPED_TRACE(out);
  // The whole script's story, each call through whichever node nginx picked.
  const std::string home = r["home"];
  EXPECT_EQ(r["run"]["stdout"], "hi\nyes\n" + home + "\n");
  EXPECT_EQ(r["nonzero"]["exitCode"], 3);
  std::string streamed;
  for (const auto& c : r["stream"]) {
    if (c[0] == "out") streamed += c[1].get<std::string>();
  }
  EXPECT_EQ(streamed, "line1\nline2\nline3\n");
  EXPECT_EQ(r["stdin"], "ping\npong\nEND\n");
  EXPECT_EQ(r["kill"], true);
  EXPECT_EQ(r["reconnect"]["exitCode"], 4);
  EXPECT_NE(r["pty"].get<std::string>().find("PTY42"), std::string::npos);
  EXPECT_EQ(r["connect_run"], "again\n");
  EXPECT_EQ(r["info"]["sandboxId"], r["sandbox_id"]);
  // The list is the cluster's, whichever node answered it.
  EXPECT_EQ(r["listed"], json::array({r["sandbox_id"]}));
  EXPECT_EQ(r["resumed_run"], "kept\n");
  EXPECT_EQ(r["killed"], true);
  EXPECT_EQ(r["connect_gone"]["threw"]["name"], "SandboxNotFoundError");
  // The sandbox lived on one node only.
  int homes = 0;
  for (auto& n : nodes_) homes += home.rfind(n.data->path(), 0) == 0 ? 1 : 0;
  EXPECT_EQ(homes, 1) << home;
}

TEST_F(ClusterSurfaces, TheStockMcpClientWorksThroughRoundRobinOverThreeNodes) {
  ASSERT_TRUE(
      std::filesystem::exists(node_dir() + "/node_modules/@modelcontextprotocol/sdk/package.json"))
      << "the MCP SDK is not installed: run scripts/bootstrap";
  RoundRobin lb(backends());
  int status = -1;
  std::string out = run_shell("cd " + node_dir() + " && node mcp_client.mjs " + lb.url() +
                                  "/v1/sessions/mcp1/mcp " + kToken + " 2>&1",
                              &status);
  ASSERT_EQ(status, 0) << out << "\n" << lb.log();
  json r = json::parse(out, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << out;
  SCOPED_TRACE(out);
  EXPECT_EQ(r["session_id"].get<std::string>().size(), 32u);
  EXPECT_EQ(r["exec"]["stdout"], "hi\n");
  EXPECT_EQ(r["exec"]["exit_code"], 3);
  EXPECT_EQ(r["exec_stdin"]["stdout"], "SHOUT");
  EXPECT_EQ(r["read"]["content"], "hello world\nbye world\n");
  EXPECT_EQ(r["edit"]["replacements"], 1);
  EXPECT_EQ(r["read_binary"]["content"], "AAEC/v8=");
  EXPECT_EQ(r["process_output"]["stdout"], "started\n");
  EXPECT_EQ(r["kill"]["state"], "killed");
  EXPECT_EQ(r["terminated"], true);
  // One session, on one node, holding what the tools wrote.
  auto s = api(node(1)).get("/v1/sessions/mcp1");
  ASSERT_EQ(s.status, 200) << s;
  const std::string owner = s.body["node"];
  int with_workspace = 0;
  for (auto& n : nodes_) {
    with_workspace += std::filesystem::exists(n.data->path() + "/workspaces/mcp1") ? 1 : 0;
  }
  EXPECT_EQ(with_workspace, 1);
  EXPECT_EQ(api(node(2)).get(files_target("mcp1", "bin/blob")).raw,
            std::string("\0\1\2\xfe\xff", 5));
}

TEST_F(ClusterSurfaces, ALangBotConnectionServesItsSessionsOnTwoNodes) {
  // Cordons make the placements certain: "a" lands on n2 and "b" on n3, while LangBot's one
  // connection is to n1.
  cordon("n1", true, 1);
  cordon("n3", true, 1);
  lb::LangBot bot;
  ASSERT_EQ(bot.connect(*node(1).daemon), 101);
  ASSERT_TRUE(lb::ok(bot.call("__ping", lb::ojson::object())));
  const lb::ojson ctx = lb::context("wsp");
  auto a = bot.call("box_exec", lb::box_spec("a", "echo A > a.txt; echo made-a"), ctx);
  ASSERT_TRUE(lb::ok(a)) << a;
  EXPECT_EQ(a["data"]["stdout"], "made-a");
  EXPECT_EQ(a["data"]["session_id"], "a");  // LangBot's logical id, as on one node
  cordon("n3", false, 1);
  cordon("n2", true, 1);
  auto b = bot.call("box_create_session", lb::box_spec("b"), ctx);
  ASSERT_TRUE(lb::ok(b)) << b;
  auto [pa, na] = find_session("-a");
  auto [pb, nb] = find_session("-b");
  EXPECT_EQ(na, "n2");
  EXPECT_EQ(nb, "n3");
  EXPECT_EQ(read_host_file(node(2).data->path() + "/workspaces/" + pa + "/a.txt"), "A\n");
  cordon("n1", false, 1);
  cordon("n2", false, 1);
  // Actions on both, interleaved on the one connection (each answered under its own seq_id).
  auto s1 = bot.send("box_exec", lb::box_spec("b", "echo B > b.txt; cat b.txt"), ctx);
  auto s2 = bot.send("box_exec", lb::box_spec("a", "cat a.txt"), ctx);
  auto r2 = bot.wait(s2);
  auto r1 = bot.wait(s1);
  ASSERT_TRUE(lb::ok(r1)) << r1;
  ASSERT_TRUE(lb::ok(r2)) << r2;
  EXPECT_EQ(r1["data"]["stdout"], "B");
  EXPECT_EQ(r2["data"]["stdout"], "A");
  EXPECT_TRUE(std::filesystem::exists(node(3).data->path() + "/workspaces/" + pb + "/b.txt"));
  // The list spans the nodes.
  auto list = bot.call("box_get_sessions", lb::ojson::object(), ctx);
  ASSERT_TRUE(lb::ok(list)) << list;
  std::set<std::string> ids;
  for (const auto& s : list["data"]["sessions"]) ids.insert(s["session_id"]);
  EXPECT_EQ(ids, (std::set<std::string>{"a", "b"}));
  auto status = bot.call("box_status", lb::ojson::object(), ctx);
  ASSERT_TRUE(lb::ok(status)) << status;
  EXPECT_EQ(status["data"]["active_sessions"], 2);
  // The owner's errors keep their class.
  auto missing =
      bot.call("box_get_managed_process", {{"session_id", "a"}, {"process_id", "x"}}, ctx);
  EXPECT_EQ(missing["code"], 1);
  EXPECT_TRUE(lb::message(missing).starts_with("BoxManagedProcessNotFoundError")) << missing;
  // A managed process on n2, and its relay through n1.
  lb::ojson start = {{"session_id", "a"}, {"spec", {{"process_id", "srv"}, {"command", "cat"}}}};
  auto p = bot.call("box_start_managed_process", start, ctx);
  ASSERT_TRUE(lb::ok(p)) << p;
  EXPECT_EQ(p["data"]["status"], "running");
  lb::LbSocket relay;
  lb::LbSocket::Headers h;
  h.workspace = "wsp";
  h.generation = "1";
  ASSERT_EQ(relay.open(host_port(1), "/v1/sessions/" + pa + "/managed-process/srv/ws", h), 101)
      << relay.refusal_body();
  relay.write("{\"jsonrpc\": \"2.0\", \"id\": 7}");
  auto echoed = relay.read();
  ASSERT_TRUE(echoed.has_value());
  EXPECT_EQ(*echoed, "{\"jsonrpc\": \"2.0\", \"id\": 7}");
  auto got = bot.call("box_get_managed_process", {{"session_id", "a"}, {"process_id", "srv"}}, ctx);
  ASSERT_TRUE(lb::ok(got)) << got;
  EXPECT_EQ(got["data"]["attached"], true);
  // Deleting through the connection deletes on the owner.
  ASSERT_TRUE(lb::ok(bot.call("box_delete_session", {{"session_id", "b"}}, ctx)));
  EXPECT_TRUE(eventually([&] { return api(node(1)).get("/v1/sessions/" + pb).status == 404; }));
  EXPECT_FALSE(std::filesystem::exists(node(3).data->path() + "/workspaces/" + pb));
  // A session on a dead node answers with the node's name.
  node(2).daemon->stop(SIGKILL);
  lb::ojson dead;
  ASSERT_TRUE(eventually(
      [&] {
        dead = bot.call("box_exec", lb::box_spec("a", "true"), ctx);
        return lb::message(dead).find("node n2") != std::string::npos;
      },
      kLeaseSec + 2))
      << dead;
  EXPECT_EQ(dead["code"], 1);
}

TEST_F(ClusterSurfaces, TheLangBotNodeRouteIsForNodesOnly) {
  auto r = api(node(1)).post("/v1/cluster/langbot", {{"action", "__ping"}});
  EXPECT_EQ(r.status, 403) << r;
}

}  // namespace
}  // namespace agentbox::testing
