// LangBot's Box runtime (shared/PROTOCOLS.md part 2) against the real daemon over loopback,
// driven by a LangBot client written here from that page: the action RPC on /rpc/ws (envelope,
// Python json.dumps framing, fragmented messages over 64 KiB, the error prefixes the SDK client
// maps back, the auth headers and first-instance binding), every Box action, the tenancy of
// physical ids and the generation fence, and the managed-process relay (one attacher, one
// stdout line per frame whatever the process's chunks, 401 and 400 before the upgrade).

#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "integration/api_test_util.h"
#include "integration/langbot_client.h"
#include "integration/ws_test_util.h"

namespace agentbox::testing {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using ojson = nlohmann::ordered_json;

using namespace lb;

std::string sha256_hex(const std::string& data, const std::string& dir) {
  std::string path = dir + "/sha-input";
  {
    std::ofstream f(path, std::ios::binary);
    f << data;
  }
  std::string out;
  FILE* p = ::popen(("sha256sum " + path).c_str(), "r");
  char buf[128];
  while (p && std::fgets(buf, sizeof buf, p)) out += buf;
  if (p) ::pclose(p);
  std::remove(path.c_str());
  return out.substr(0, 64);
}

class LangBotApi : public ::testing::Test {
 protected:
  explicit LangBotApi(std::vector<std::string> more = {})
      : daemon_(args(std::move(more))), api_(daemon_) {}

  static std::vector<std::string> args(std::vector<std::string> more = {}) {
    std::vector<std::string> a = {"--langbot-control-token", kToken};
    if (test_backend() == "ns") {
      a.push_back("--backend");
      a.push_back("ns");
    }
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }

  // The physical id LangBot's client computes (tenancy.namespace_session_id).
  std::string physical(const std::string& workspace, std::int64_t gen, const std::string& id,
                       const std::string& instance = kInstance) {
    std::string key = instance;
    key += '\0';
    key += workspace;
    return "ws-" + sha256_hex(key, daemon_.temp_dir()).substr(0, 24) + "-g" + std::to_string(gen) +
           "-" + id;
  }

  void connect(LangBot* lb) {
    ASSERT_EQ(lb->connect(daemon_), 101);
    ASSERT_TRUE(ok(lb->call("__ping", ojson::object())));
  }

  // The relay socket of a managed process.
  int relay(LbSocket* s, const std::string& workspace, std::int64_t gen,
            const std::string& physical_id, const std::string& process = "default",
            bool legacy = false) {
    LbSocket::Headers h;
    h.workspace = workspace;
    h.generation = std::to_string(gen);
    h.offer_mcp = true;
    std::string target = "/v1/sessions/" + physical_id + "/managed-process/" +
                         (legacy ? std::string() : process + "/") + "ws";
    return s->open(daemon_.host_port(), target, h);
  }

  Daemon daemon_;
  Api api_;
};

TEST_F(LangBotApi, ConnectionSequencePingInitHealthAndBackendInfo) {
  LangBot lb;
  ASSERT_EQ(lb.connect(daemon_), 101);
  auto seq = lb.send("__ping", ojson::object(), std::nullopt);
  auto pong = lb.wait(seq);
  // Byte for byte what the SDK's server sends for a non-streamed success.
  EXPECT_EQ(lb.last_raw(), "{\"seq_id\": " + std::to_string(seq) +
                               ", \"code\": 0, \"message\": \"success\", \"data\": {}, "
                               "\"chunk_status\": \"continue\"}");
  ojson init_data = {{"backend", "docker"}, {"limits", {{"max_sessions", 4}}}};
  auto init = lb.call("box_init", init_data);
  ASSERT_TRUE(ok(init)) << init;
  EXPECT_EQ(init["data"], ojson({{"initialized", true}}));
  for (const char* a : {"box_health", "box_get_backend_info"}) {
    auto h = lb.call(a, ojson::object());
    ASSERT_TRUE(ok(h)) << a << " " << h;
    EXPECT_EQ(h["data"]["name"], "agentbox-" + test_backend());
    EXPECT_EQ(h["data"]["available"], true);
  }
  // Host-control actions take a context only of the bound instance.
  auto foreign = lb.call("box_health", ojson::object(), context("w", 1, "other-instance"));
  EXPECT_EQ(foreign["code"], 1);
  EXPECT_TRUE(message(foreign).starts_with("PermissionError: ")) << foreign;
  EXPECT_TRUE(ok(lb.call("box_health", ojson::object(), context("w"))));
}

TEST_F(LangBotApi, SessionsCreateGetListStatusDeleteWithLogicalIds) {
  LangBot lb;
  connect(&lb);
  auto made = lb.call("box_create_session", box_spec("person_42"), context("w1"));
  ASSERT_TRUE(ok(made)) << made;
  const ojson& info = made["data"];
  EXPECT_EQ(info["session_id"], "person_42");
  const std::string phys = physical("w1", 1, "person_42");
  EXPECT_EQ(info["backend_session_id"], phys);
  EXPECT_EQ(info["image"], "rockchin/langbot-sandbox:latest");
  EXPECT_EQ(info["network"], "off");
  EXPECT_EQ(info["memory_mb"], 512);
  EXPECT_EQ(info["cpus"], 1.0);
  EXPECT_EQ(info["read_only_rootfs"], true);
  EXPECT_TRUE(is_rfc3339_utc(info.value("created_at", ""))) << info;
  // The agentbox session behind it is the physical id (the default tenant: no tokens here).
  EXPECT_EQ(api_.get("/v1/sessions/" + phys).status, 200);

  // Same spec again: the same session. A changed field: a conflict naming the old value.
  EXPECT_TRUE(ok(lb.call("box_create_session", box_spec("person_42"), context("w1"))));
  auto spec = box_spec("person_42");
  spec["memory_mb"] = 1024;
  auto conflict = lb.call("box_create_session", spec, context("w1"));
  EXPECT_EQ(message(conflict),
            "BoxSessionConflictError: Box session " + phys + " already exists with memory_mb=512")
      << conflict;

  // Another workspace of the same instance: its own namespace.
  ASSERT_TRUE(ok(lb.call("box_create_session", box_spec("person_42"), context("w2"))));
  auto list = lb.call("box_get_sessions", ojson::object(), context("w1"));
  ASSERT_TRUE(ok(list)) << list;
  ASSERT_EQ(list["data"]["sessions"].size(), 1u) << list;
  EXPECT_EQ(list["data"]["sessions"][0]["session_id"], "person_42");
  auto status = lb.call("box_status", ojson::object(), context("w1"));
  ASSERT_TRUE(ok(status)) << status;
  EXPECT_EQ(status["data"]["active_sessions"], 1);
  EXPECT_EQ(status["data"]["managed_processes"], 0);
  EXPECT_TRUE(status["data"]["limits"].contains("max_sessions"));
  EXPECT_EQ(status["data"]["backend"]["available"], true);

  auto got = lb.call("box_get_session", {{"session_id", "person_42"}}, context("w1"));
  ASSERT_TRUE(ok(got)) << got;
  EXPECT_EQ(got["data"]["session_id"], "person_42");
  EXPECT_FALSE(got["data"].contains("managed_processes"));

  auto del = lb.call("box_delete_session", {{"session_id", "person_42"}}, context("w1"));
  ASSERT_TRUE(ok(del)) << del;
  EXPECT_EQ(del["data"], ojson({{"deleted", "person_42"}}));
  auto gone = lb.call("box_get_session", {{"session_id", "person_42"}}, context("w1"));
  EXPECT_EQ(message(gone), "BoxSessionNotFoundError: session " + phys + " not found");
  EXPECT_EQ(api_.get("/v1/sessions/" + phys).status, 404);
  // The other workspace's session is untouched.
  EXPECT_TRUE(ok(lb.call("box_get_session", {{"session_id", "person_42"}}, context("w2"))));
  // Ids are namespaced as LangBot does: unsafe runs become "-", ends trimmed.
  auto odd = lb.call("box_create_session", box_spec("  group 7/x  "), context("w1"));
  ASSERT_TRUE(ok(odd)) << odd;
  EXPECT_EQ(odd["data"]["backend_session_id"], physical("w1", 1, "group-7-x"));
}

TEST_F(LangBotApi, ExecResultsCarryLangBotFieldsAndTimeoutDeletesTheSession) {
  LangBot lb;
  connect(&lb);
  auto spec = box_spec("chat_1", "echo hello; echo oops >&2; pwd; echo \"$GREETING\"; exit 3");
  spec["env"] = {{"GREETING", "hi"}, {"N", 5}};
  auto r = lb.call("box_exec", spec, context("w"));
  ASSERT_TRUE(ok(r)) << r;
  const ojson& d = r["data"];
  EXPECT_EQ(d["session_id"], "chat_1");
  EXPECT_EQ(d["status"], "completed");
  EXPECT_EQ(d["ok"], false);
  EXPECT_EQ(d["exit_code"], 3);
  EXPECT_EQ(d["stdout"].get<std::string>().substr(0, 6), "hello\n");
  EXPECT_TRUE(d["stdout"].get<std::string>().ends_with("hi")) << d;  // stripped, as the SDK
  EXPECT_EQ(d["stderr"], "oops");
  EXPECT_EQ(d["stdout_truncated"], false);
  EXPECT_EQ(d["stderr_truncated"], false);
  EXPECT_TRUE(d["duration_ms"].is_number_integer());

  // State persists in the session between execs; env values were coerced to str.
  ASSERT_TRUE(ok(lb.call("box_exec", box_spec("chat_1", "echo kept > f"), context("w"))));
  auto again = lb.call("box_exec", box_spec("chat_1", "cat f; echo $N"), context("w"));
  EXPECT_EQ(again["data"]["stdout"], "kept") << again;
  auto env5 = box_spec("chat_1", "echo $N");
  env5["env"] = {{"N", 5}};
  EXPECT_EQ(lb.call("box_exec", env5, context("w"))["data"]["stdout"], "5");
  EXPECT_EQ(lb.call("box_exec", box_spec("chat_1", "true"), context("w"))["data"]["ok"], true);

  // A timed-out exec: status timed_out, exit_code null, and its session is gone.
  auto slow = box_spec("chat_1", "sleep 30");
  slow["timeout_sec"] = 1;
  auto t = lb.call("box_exec", slow, context("w"));
  ASSERT_TRUE(ok(t)) << t;
  EXPECT_EQ(t["data"]["status"], "timed_out");
  EXPECT_TRUE(t["data"]["exit_code"].is_null());
  auto gone = lb.call("box_get_session", {{"session_id", "chat_1"}}, context("w"));
  EXPECT_TRUE(message(gone).starts_with("BoxSessionNotFoundError: ")) << gone;
  // The next exec starts a fresh one.
  auto fresh =
      lb.call("box_exec", box_spec("chat_1", "cat f 2>/dev/null || echo none"), context("w"));
  EXPECT_EQ(fresh["data"]["stdout"], "none") << fresh;
}

TEST_F(LangBotApi, ActionsRunConcurrentlyAndLargeFragmentedMessagesArrive) {
  LangBot lb;
  connect(&lb);
  auto slow = lb.send("box_exec", box_spec("c1", "sleep 2; echo slow"), context("w"));
  // A 200 KiB command goes as a fragmented message; its reply comes before the slow one's.
  std::string big(100 * 1024, 'x');  // one shell argument: under Linux's 128 KiB
  auto fast = lb.send("box_exec", box_spec("c2", "printf %s '" + big + "' | wc -c"), context("w"));
  auto f = lb.wait(fast);
  ASSERT_TRUE(ok(f)) << f;
  EXPECT_EQ(f["data"]["stdout"], std::to_string(big.size()));
  auto s = lb.wait(slow);
  EXPECT_EQ(s["data"]["stdout"], "slow") << s;
}

TEST_F(LangBotApi, BadInputIsAnErrorReplyInLangBotsConventionAndTheConnectionStays) {
  LangBot lb;
  connect(&lb);
  auto expect_prefix = [&](const std::string& action, const ojson& data, const std::string& prefix,
                           std::optional<ojson> ctx) {
    auto r = lb.call(action, data, ctx);
    EXPECT_EQ(r["code"], 1) << action << " " << r;
    EXPECT_TRUE(message(r).starts_with(prefix)) << action << " " << r;
    EXPECT_EQ(r["data"], ojson::object());
    EXPECT_EQ(r["chunk_status"], "continue");
  };
  auto ctx = context("w");
  auto with = [](ojson s, const char* k, ojson v) {
    s[k] = std::move(v);
    return s;
  };
  auto base = box_spec("s", "true");
  expect_prefix("box_exec", box_spec("s", "   "), "BoxValidationError: ", ctx);
  expect_prefix("box_exec", with(base, "timeout_sec", 0), "BoxValidationError: ", ctx);
  expect_prefix("box_exec", with(base, "timeout_sec", "soon"), "BoxValidationError: ", ctx);
  expect_prefix("box_exec", with(base, "network", "maybe"), "BoxValidationError: ", ctx);
  expect_prefix("box_exec", with(base, "workdir", "relative"), "BoxValidationError: ", ctx);
  expect_prefix("box_exec", with(base, "memory_mb", 16), "BoxValidationError: ", ctx);
  expect_prefix("box_exec", with(base, "cpus", 0), "BoxValidationError: ", ctx);
  expect_prefix("box_exec", with(base, "env", {{"A", {1, 2}}}), "BoxValidationError: ", ctx);
  expect_prefix("box_exec", with(base, "session_id", "!!!"), "BoxValidationError: ", ctx);
  expect_prefix("box_exec", with(base, "session_id", std::string(200, 'a')),
                "BoxValidationError: ", ctx);
  expect_prefix("box_exec", with(base, "host_path", "rel/dir"), "BoxValidationError: ", ctx);
  expect_prefix("box_exec", with(base, "extra_mounts", {{{"host_path", "/srv"}}}),
                "BoxValidationError: ", ctx);
  expect_prefix("box_create_session", with(base, "skill_name", "bad name!"),
                "BoxValidationError: ", ctx);
  // A host path outside the daemon's allowed mount roots.
  auto hosted =
      with(with(with(base, "host_path", "/etc"), "mount_path", "/data"), "workdir", "/data");
  expect_prefix("box_exec", hosted, "BoxValidationError: ", ctx);
  expect_prefix("box_exec", with(hosted, "workdir", "/workspace"), "BoxValidationError: ", ctx);
  // ... and over /workspace itself (the workspace is the host dir: same rule).
  expect_prefix("box_exec", with(base, "host_path", "/etc"), "BoxValidationError: ", ctx);
  // Valid for LangBot, not done by agentbox: a BoxError naming it (an image:
  // api_langbot_images_test).
  expect_prefix("box_exec", with(base, "skill_name", "web-search"), "BoxError: skill_name ", ctx);
  expect_prefix("box_exec", with(base, "read_only_rootfs", false), "BoxError: read_only_rootfs",
                ctx);
  ojson bad_proc = {{"session_id", "s"}, {"spec", {{"command", "cat"}, {"memory_mb", 64}}}};
  expect_prefix("box_start_managed_process", bad_proc, "BoxError: spec.memory_mb", ctx);
  // The SDK's own messages for envelope faults.
  auto unknown = lb.call("box_frobnicate", ojson::object(), ctx);
  EXPECT_EQ(message(unknown), "ValueError: Action box_frobnicate not found");
  EXPECT_EQ(message(lb.call("box_get_session", ojson::object(), ctx)), "KeyError: 'session_id'");
  EXPECT_EQ(message(lb.call("box_exec", base)),
            "PermissionError: Box tenant action requires a trusted Workspace context");
  expect_prefix("box_exec", base, "PermissionError: ", context("w", 0));
  expect_prefix("box_exec", base, "PermissionError: ", context("w", 1, "not-the-bound-one"));
  ojson extra = context("w");
  extra["tenant"] = "x";
  expect_prefix("box_exec", base, "PermissionError: ", extra);
  // Unknown processes and sessions.
  expect_prefix("box_get_managed_process", {{"session_id", "nope"}, {"process_id", "default"}},
                "BoxSessionNotFoundError: ", ctx);
  expect_prefix("box_delete_session", {{"session_id", "nope"}}, "BoxSessionNotFoundError: ", ctx);
  // Skill store, admission, file chunks: a clear BoxError.
  for (const char* a : {"box_list_skills", "box_get_skill", "box_create_skill",
                        "box_install_skill_zip", "box_read_skill_file"}) {
    expect_prefix(a, ojson::object(), std::string("BoxError: ") + a + " is not built", ctx);
  }
  expect_prefix("box_upsert_sandbox_admission_grant", ojson::object(), "BoxError: ", std::nullopt);
  expect_prefix("__file_chunk", ojson::object(), "BoxError: __file_chunk", std::nullopt);
  // A frame that is not JSON: an error reply, and the connection still answers.
  lb.socket().write("{not json");
  auto m = lb.socket().read();
  ASSERT_TRUE(m.has_value());
  EXPECT_NE(m->find("BoxValidationError: "), std::string::npos) << *m;
  EXPECT_TRUE(ok(lb.call("__ping", ojson::object())));
  // An overlong error text is cut at 4096 characters with LangBot's marker.
  auto cut = lb.call("box_exec", with(base, "session_id", std::string(5000, 'a')), ctx);
  EXPECT_TRUE(message(cut).starts_with("BoxValidationError: ")) << cut;
  EXPECT_TRUE(message(cut).ends_with("... [protocol error truncated]")) << cut;
  EXPECT_EQ(message(cut).size(), 4096 + std::string("... [protocol error truncated]").size());
  // The daemon never answered with a 5xx or dropped anything: still connected.
  EXPECT_TRUE(ok(lb.call("__ping", ojson::object())));
}

TEST_F(LangBotApi, GenerationFenceRefusesStaleAndDeletesOlderSessions) {
  LangBot lb;
  connect(&lb);
  ASSERT_TRUE(ok(lb.call("box_create_session", box_spec("a"), context("w", 1))));
  const std::string g1 = physical("w", 1, "a");
  EXPECT_EQ(api_.get("/v1/sessions/" + g1).status, 200);
  // A gen-1 command in flight when gen 2 arrives is stopped.
  auto running = lb.send("box_exec", box_spec("a", "sleep 60"), context("w", 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto g2 = lb.call("box_create_session", box_spec("a"), context("w", 2));
  ASSERT_TRUE(ok(g2)) << g2;
  EXPECT_EQ(g2["data"]["backend_session_id"], physical("w", 2, "a"));
  auto stopped = lb.wait(running, std::chrono::seconds(20));
  EXPECT_EQ(stopped["code"], 1) << stopped;
  EXPECT_TRUE(message(stopped).starts_with("BoxError: ")) << stopped;
  EXPECT_TRUE(eventually([&] { return api_.get("/v1/sessions/" + g1).status == 404; }));
  auto stale = lb.call("box_get_sessions", ojson::object(), context("w", 1));
  EXPECT_EQ(message(stale), "PermissionError: Stale Box placement generation");
  // Another workspace has its own fence.
  EXPECT_TRUE(ok(lb.call("box_get_sessions", ojson::object(), context("w-other", 1))));
}

TEST_F(LangBotApi, RelayCarriesOneJsonRpcLinePerFrameWhateverTheChunks) {
  LangBot lb;
  connect(&lb);
  ASSERT_TRUE(ok(lb.call("box_create_session", box_spec("mcp-shared"), context("w"))));
  ojson start = {{"session_id", "mcp-shared"},
                 {"spec",
                  {{"process_id", "default"},
                   {"command", "cat"},
                   {"args", ojson::array()},
                   {"env", {{"ZED", "1"}, {"ALPHA", "2"}}},
                   {"cwd", "/workspace"},
                   {"memory_mb", 0}}}};
  auto p = lb.call("box_start_managed_process", start, context("w"));
  ASSERT_TRUE(ok(p)) << p;
  EXPECT_EQ(p["data"]["process_id"], "default");
  EXPECT_EQ(p["data"]["session_id"], "mcp-shared");
  EXPECT_EQ(p["data"]["status"], "running");
  EXPECT_EQ(p["data"]["command"], "cat");
  EXPECT_EQ(p["data"]["env_keys"], ojson({"ALPHA", "ZED"}));
  EXPECT_EQ(p["data"]["attached"], false);
  EXPECT_TRUE(p["data"]["exit_code"].is_null());
  // A second start of a running id: a conflict.
  auto twice = lb.call("box_start_managed_process", start, context("w"));
  EXPECT_TRUE(message(twice).starts_with("BoxManagedProcessConflictError: ")) << twice;

  const std::string phys = physical("w", 1, "mcp-shared");
  LbSocket relay_ws;
  ASSERT_EQ(relay(&relay_ws, "w", 1, phys), 101) << relay_ws.refusal_body();
  EXPECT_EQ(relay_ws.selected_protocol(), "mcp");
  auto attached = lb.call("box_get_managed_process",
                          {{"session_id", "mcp-shared"}, {"process_id", "default"}}, context("w"));
  EXPECT_EQ(attached["data"]["attached"], true) << attached;
  auto got = lb.call("box_get_session", {{"session_id", "mcp-shared"}}, context("w"));
  EXPECT_EQ(got["data"]["managed_process"]["process_id"], "default") << got;
  EXPECT_TRUE(got["data"]["managed_processes"].contains("default"));

  // One attacher: a second is refused before the upgrade.
  LbSocket second;
  EXPECT_EQ(relay(&second, "w", 1, phys), 400);
  EXPECT_EQ(json::parse(second.refusal_body(), nullptr, false)["error"]["code"],
            "BoxManagedProcessConflictError");

  // A JSON-RPC message far over the SDK's 64 KiB read chunks: exactly one frame back.
  std::string big = "{\"jsonrpc\": \"2.0\", \"id\": 1, \"result\": {\"text\": \"" +
                    std::string(300 * 1024, 'y') + "\"}}";
  relay_ws.write(big);
  auto echoed = relay_ws.read();
  ASSERT_TRUE(echoed.has_value());
  EXPECT_EQ(echoed->size(), big.size());
  EXPECT_EQ(*echoed, big);
  // Several small messages: one frame each.
  for (int i = 0; i < 50; ++i)
    relay_ws.write("{\"jsonrpc\": \"2.0\", \"id\": " + std::to_string(i) + "}");
  for (int i = 0; i < 50; ++i) {
    auto m = relay_ws.read();
    ASSERT_TRUE(m.has_value()) << i;
    EXPECT_EQ(*m, "{\"jsonrpc\": \"2.0\", \"id\": " + std::to_string(i) + "}");
  }
  // Stopping the process ends the relay.
  auto stop = lb.call("box_stop_managed_process",
                      {{"session_id", "mcp-shared"}, {"process_id", "default"}}, context("w"));
  ASSERT_TRUE(ok(stop)) << stop;
  EXPECT_EQ(stop["data"], ojson({{"stopped", "default"}}));
  EXPECT_FALSE(relay_ws.read(std::chrono::seconds(10)).has_value());
  EXPECT_FALSE(relay_ws.timed_out());
  // As LangBot's runtime: a stopped process is gone (not "exited"), to a get, the session's
  // list and a relay alike; an unknown id is not found either.
  auto after = lb.call("box_get_managed_process",
                       {{"session_id", "mcp-shared"}, {"process_id", "default"}}, context("w"));
  EXPECT_TRUE(message(after).starts_with("BoxManagedProcessNotFoundError: ")) << after;
  auto listed = lb.call("box_get_session", {{"session_id", "mcp-shared"}}, context("w"));
  ASSERT_TRUE(ok(listed)) << listed;
  EXPECT_FALSE(listed["data"].contains("managed_processes")) << listed;
  auto again = lb.call("box_stop_managed_process",
                       {{"session_id", "mcp-shared"}, {"process_id", "default"}}, context("w"));
  EXPECT_TRUE(message(again).starts_with("BoxManagedProcessNotFoundError: ")) << again;
  LbSocket late;
  EXPECT_EQ(relay(&late, "w", 1, phys), 400);
  EXPECT_EQ(json::parse(late.refusal_body(), nullptr, false)["error"]["code"],
            "BoxManagedProcessNotFoundError");
  // Started again, it is there again.
  auto restarted = lb.call("box_start_managed_process", start, context("w"));
  ASSERT_TRUE(ok(restarted)) << restarted;
  auto back = lb.call("box_get_managed_process",
                      {{"session_id", "mcp-shared"}, {"process_id", "default"}}, context("w"));
  ASSERT_TRUE(ok(back)) << back;
  EXPECT_EQ(back["data"]["status"], "running");
  LbSocket unknown;
  EXPECT_EQ(relay(&unknown, "w", 1, phys, "nope"), 400);
  EXPECT_EQ(json::parse(unknown.refusal_body(), nullptr, false)["error"]["code"],
            "BoxManagedProcessNotFoundError");
}

TEST_F(LangBotApi, RelaySplitsManyLinesOfOneChunkAndTheLegacyRouteIsDefault) {
  LangBot lb;
  connect(&lb);
  ASSERT_TRUE(ok(lb.call("box_create_session", box_spec("m"), context("w"))));
  // On each input line the server prints 200 lines with one write.
  std::string lines;
  for (int i = 0; i < 200; ++i) lines += " " + std::to_string(i);
  ojson start = {{"session_id", "m"},
                 {"spec",
                  {{"command", "sh"},
                   {"args", {"-c", "while read x; do printf '{\"id\": %s}\\n'" + lines + "; done"}},
                   {"memory_mb", 0}}}};
  auto p = lb.call("box_start_managed_process", start, context("w"));
  ASSERT_TRUE(ok(p)) << p;
  LbSocket ws;
  ASSERT_EQ(relay(&ws, "w", 1, physical("w", 1, "m"), "default", /*legacy=*/true), 101)
      << ws.refusal_body();
  ws.write("go");
  for (int i = 0; i < 200; ++i) {
    auto m = ws.read();
    ASSERT_TRUE(m.has_value()) << i;
    ASSERT_EQ(*m, "{\"id\": " + std::to_string(i) + "}");
  }
}

TEST_F(LangBotApi, RelayRefusesWhatIsNotTheCurrentPlacement) {
  LangBot lb;
  connect(&lb);
  ASSERT_TRUE(ok(lb.call("box_create_session", box_spec("r"), context("w"))));
  ojson start = {{"session_id", "r"}, {"spec", {{"process_id", "srv"}, {"command", "cat"}}}};
  ASSERT_TRUE(ok(lb.call("box_start_managed_process", start, context("w"))));
  const std::string phys = physical("w", 1, "r");
  auto refused = [&](LbSocket::Headers h, const std::string& target) {
    LbSocket s;
    int st = s.open(daemon_.host_port(), target, h);
    EXPECT_EQ(st, 401) << target;
    EXPECT_EQ(s.refusal_body(), "Unauthorized");
  };
  const std::string target = "/v1/sessions/" + phys + "/managed-process/srv/ws";
  LbSocket::Headers good;
  good.workspace = "w";
  good.generation = "1";
  auto h = good;
  h.generation = "2";  // not seen yet
  refused(h, target);
  h = good;
  h.generation = "01";  // not canonical
  refused(h, target);
  h = good;
  h.workspace.clear();
  refused(h, target);
  h = good;
  h.workspace = "other";  // the session is not in that placement
  refused(h, target);
  h = good;
  h.token = "wrong-token-wrong-token-wrong-token!!";
  refused(h, target);
  h = good;
  h.instance = "inst-2";
  refused(h, target);
  refused(good, "/v1/sessions/some-other-session/managed-process/srv/ws");
  // A placement moved on: its relay is closed and the old generation refused.
  LbSocket live;
  ASSERT_EQ(relay(&live, "w", 1, phys, "srv"), 101);
  ASSERT_TRUE(ok(lb.call("box_get_sessions", ojson::object(), context("w", 2))));
  EXPECT_FALSE(live.read(std::chrono::seconds(10)).has_value());
  EXPECT_FALSE(live.timed_out());
  refused(good, target);
}

TEST_F(LangBotApi, AuthHeadersAndFirstInstanceBinding) {
  auto status_of = [&](LbSocket::Headers h, std::string* body = nullptr) {
    LbSocket s;
    int st = s.open(daemon_.host_port(), "/rpc/ws", h);
    if (body) *body = s.refusal_body();
    return st;
  };
  LbSocket::Headers h;
  h.instance.clear();
  std::string body;
  EXPECT_EQ(status_of(h, &body), 401);
  EXPECT_EQ(body, "Unauthorized");
  h.instance = "-starts-with-dash";
  EXPECT_EQ(status_of(h), 401);
  h.instance = std::string(129, 'a');
  EXPECT_EQ(status_of(h), 401);
  h = {};
  h.token.clear();
  EXPECT_EQ(status_of(h), 401);
  h.token = std::string(kToken) + "x";
  EXPECT_EQ(status_of(h), 401);
  // A browser page may not open it (CSWSH).
  h = {};
  h.origin = "https://evil.example";
  EXPECT_EQ(status_of(h), 403);
  // The first good connection binds its instance; another instance is then 401.
  LangBot first;
  ASSERT_EQ(first.connect(daemon_), 101);
  h = {};
  h.instance = "inst-2";
  EXPECT_EQ(status_of(h, &body), 401);
  EXPECT_EQ(body, "Unauthorized");
  // The bound one may reconnect.
  LangBot again;
  ASSERT_EQ(again.connect(daemon_), 101);
  EXPECT_TRUE(ok(again.call("__ping", ojson::object())));
}

TEST_F(LangBotApi, ShutdownSuspendsLangBotsSessionsAndTheNextUseResumesThem) {
  LangBot lb;
  connect(&lb);
  ASSERT_TRUE(ok(lb.call("box_exec", box_spec("s1", "echo x > f"), context("w"))));
  auto down = lb.call("box_shutdown", ojson::object());
  ASSERT_TRUE(ok(down)) << down;
  EXPECT_EQ(down["data"], ojson::object());
  const std::string phys = physical("w", 1, "s1");
  EXPECT_EQ(api_.get("/v1/sessions/" + phys).body.value("state", ""), "suspended");
  auto again = lb.call("box_exec", box_spec("s1", "cat f"), context("w"));
  EXPECT_EQ(again["data"]["stdout"], "x") << again;
  auto unknown = lb.call("box_get_managed_process", {{"session_id", "s1"}, {"process_id", "nope"}},
                         context("w"));
  EXPECT_EQ(message(unknown),
            "BoxManagedProcessNotFoundError: managed process nope not found in session " + phys);
}

// Every LangBot action that changes something is audited as the same operation through /v1
// would be, with "via": "langbot" (the operation bus, never a line written by the surface).
TEST_F(LangBotApi, ActionsAreAuditedAsOperationsViaLangBot) {
  LangBot lb;
  connect(&lb);
  ASSERT_TRUE(ok(lb.call("box_exec", box_spec("aud", "echo hi"), context("w"))));
  ojson start = {{"session_id", "aud"},
                 {"spec", {{"process_id", "srv"}, {"command", "cat"}, {"cwd", "/workspace"}}}};
  auto p = lb.call("box_start_managed_process", start, context("w"));
  ASSERT_TRUE(ok(p)) << p;
  const std::string phys = physical("w", 1, "aud");
  {
    LbSocket relay_ws;
    ASSERT_EQ(relay(&relay_ws, "w", 1, phys, "srv"), 101) << relay_ws.refusal_body();
  }
  auto stopped = lb.call("box_stop_managed_process", {{"session_id", "aud"}, {"process_id", "srv"}},
                         context("w"));
  ASSERT_TRUE(ok(stopped)) << stopped;
  std::map<std::string, ojson> seen;  // op -> its (last) line
  std::istringstream in(read_host_file(daemon_.data_dir() + "/audit.log"));
  for (std::string line; std::getline(in, line);) {
    ojson j = ojson::parse(line, nullptr, false);
    if (j.is_object() && j.value("session", "") == phys) seen[j.value("event", "")] = j;
  }
  for (const char* op : {"exec", "process.start", "process.attach", "process.kill"}) {
    ASSERT_TRUE(seen.contains(op)) << op << " is not in the audit log";
    EXPECT_EQ(seen[op].value("via", ""), "langbot") << seen[op];
    EXPECT_EQ(seen[op].value("tenant", ""), "default") << seen[op];
  }
  EXPECT_EQ(seen["exec"].value("command", ""), "echo hi");
  EXPECT_EQ(seen["process.start"].value("tag", ""), "srv");
  EXPECT_EQ(seen["process.kill"]["pid"], seen["process.start"]["pid"]);
  // The session's creation is the manager's own lifecycle event: no "via".
  ASSERT_TRUE(seen.contains("session.create"));
  EXPECT_FALSE(seen["session.create"].contains("via"));
}

// SECURITY.md T10: LangBot's sessions are its tenant's; another tenant can neither see, attach
// to nor read them.
// LangBot's standard client with its workspace on a host dir (PROTOCOLS.md part 2 as LangBot
// sends it: a BoxSpec with host_path, nulls and extra_mounts): create, exec (in a workdir that
// does not exist yet), a managed process relayed, delete; the files are the host dir's.
struct LangBotHostRoot {
  TempDir root{"agentbox-lb-host"};
};
class LangBotHostPath : public LangBotHostRoot, public LangBotApi {
 protected:
  LangBotHostPath() : LangBotApi({"--allow-mount-root", root.path()}) {}
};

TEST_F(LangBotHostPath, CreateExecRelayAndDeleteWithTheWorkspaceOnAHostDir) {
  const bool ns = test_backend() == "ns";
  const std::string dir = root.path() + "/proj";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/old.txt") << "old\n";
  if (ns) {
    ASSERT_EQ(::chown(dir.c_str(), 4242, 4343), 0);
    ASSERT_EQ(::chown((dir + "/old.txt").c_str(), 4242, 4343), 0);
  }
  const uid_t owner = ns ? 4242 : ::geteuid();
  const std::string ws = ns ? "/workspace" : std::filesystem::canonical(dir).string();
  LangBot lb;
  connect(&lb);
  ojson spec = box_spec("hp");
  spec["host_path"] = dir;
  spec["host_path_mode"] = "rw";
  auto made = lb.call("box_create_session", spec, context("w"));
  ASSERT_TRUE(ok(made)) << made;
  EXPECT_EQ(made["data"]["host_path"], dir) << made;
  EXPECT_EQ(made["data"]["host_path_mode"], "rw");
  EXPECT_EQ(made["data"]["mount_path"], "/workspace");

  // A workdir that does not exist yet is made (as the session user) before the command runs.
  ojson exec = spec;
  exec["cmd"] = "pwd && cat ../../old.txt && echo made > made.txt";
  exec["workdir"] = "/workspace/sub/new";
  auto ran = lb.call("box_exec", exec, context("w"));
  ASSERT_TRUE(ok(ran)) << ran;
  EXPECT_EQ(ran["data"]["exit_code"], 0) << ran;
  EXPECT_EQ(ran["data"]["stdout"], ws + "/sub/new\nold") << ran;
  EXPECT_EQ(read_host_file(dir + "/sub/new/made.txt"), "made\n");
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/sub/new/made.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, owner);
  ASSERT_EQ(::stat((dir + "/sub").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, owner);

  // A managed process in the host dir, relayed.
  ojson start = {{"session_id", "hp"},
                 {"spec",
                  {{"process_id", "default"},
                   {"command", "sh"},
                   {"args", {"-c", "read -r l; cat old.txt; echo \"$l\"; exec cat"}},
                   {"env", ojson::object()},
                   {"cwd", "/workspace"},
                   {"memory_mb", 0}}}};
  auto p = lb.call("box_start_managed_process", start, context("w"));
  ASSERT_TRUE(ok(p)) << p;
  LbSocket relay_ws;
  ASSERT_EQ(relay(&relay_ws, "w", 1, physical("w", 1, "hp")), 101) << relay_ws.refusal_body();
  relay_ws.write("{\"jsonrpc\": \"2.0\", \"id\": 7}");
  auto first = relay_ws.read();  // read in the host dir, after the line came
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, "old");
  auto echoed = relay_ws.read();
  ASSERT_TRUE(echoed.has_value());
  EXPECT_EQ(*echoed, "{\"jsonrpc\": \"2.0\", \"id\": 7}");
  auto stop = lb.call("box_stop_managed_process", {{"session_id", "hp"}, {"process_id", "default"}},
                      context("w"));
  ASSERT_TRUE(ok(stop)) << stop;
  auto gone = lb.call("box_get_managed_process", {{"session_id", "hp"}, {"process_id", "default"}},
                      context("w"));
  EXPECT_TRUE(message(gone).starts_with("BoxManagedProcessNotFoundError: ")) << gone;

  auto del = lb.call("box_delete_session", {{"session_id", "hp"}}, context("w"));
  ASSERT_TRUE(ok(del)) << del;
  // The host dir and its files stay.
  EXPECT_EQ(read_host_file(dir + "/old.txt"), "old\n");
  EXPECT_EQ(read_host_file(dir + "/sub/new/made.txt"), "made\n");
}

TEST(LangBotTenancy, SessionsBelongToTheLangBotTenantOnly) {
  TempDir dir("agentbox-lb-cfg");
  const std::string cfg = dir.path() + "/config.yaml";
  std::ofstream(cfg) << "tenants:\n"
                        "  - {name: lb, tokens: [tok-lb-0123456789]}\n"
                        "  - {name: other, tokens: [tok-other-0123456789]}\n"
                        "langbot:\n"
                        "  control_token: "
                     << kToken
                     << "\n"
                        "  tenant: lb\n";
  std::vector<std::string> a = {"--config", cfg};
  if (test_backend() == "ns") a.insert(a.end(), {"--backend", "ns"});
  Daemon d(a);
  LangBot lb;
  ASSERT_EQ(lb.connect(d), 101);
  ASSERT_TRUE(ok(lb.call("box_create_session", box_spec("t"), context("w"))));
  ojson start = {{"session_id", "t"}, {"spec", {{"process_id", "srv"}, {"command", "cat"}}}};
  ASSERT_TRUE(ok(lb.call("box_start_managed_process", start, context("w"))));
  auto created = lb.call("box_get_session", {{"session_id", "t"}}, context("w"));
  const std::string phys = created["data"].value("backend_session_id", "");
  ASSERT_FALSE(phys.empty()) << created;
  Api owner(d, "tok-lb-0123456789");
  EXPECT_EQ(owner.get("/v1/sessions/" + phys).status, 200);
  Api other(d, "tok-other-0123456789");
  EXPECT_EQ(other.get("/v1/sessions/" + phys).status, 404);
  EXPECT_EQ(other.get("/v1/sessions").body["sessions"].size(), 0u);
  EXPECT_EQ(other.get("/v1/sessions/" + phys + "/processes").status, 404);
  EXPECT_EQ(other.get("/v1/sessions/" + phys + "/processes/srv/output").status, 404);
  EXPECT_EQ(
      other.post("/v1/sessions/" + phys + "/processes/srv/signal", {{"signal", "TERM"}}).status,
      404);
}

// The generation fence outlives a daemon restart: it is rebuilt from the sessions LangBot's
// namespace still has, so a stale placement stays refused and the current one keeps its session.
TEST(LangBotRestart, TheGenerationFenceSurvivesADaemonRestart) {
  TempDir dir("agentbox-lb-restart");
  const std::string data = dir.path() + "/data";
  std::vector<std::string> a = {"--langbot-control-token", kToken, "--data-dir", data};
  if (test_backend() == "ns") a.insert(a.end(), {"--backend", "ns"});
  std::string phys;
  {
    Daemon d(a);
    LangBot lb;
    ASSERT_EQ(lb.connect(d), 101);
    ASSERT_TRUE(ok(lb.call("box_create_session", box_spec("r"), context("w", 3))));
    auto got = lb.call("box_get_session", {{"session_id", "r"}}, context("w", 3));
    phys = got["data"].value("backend_session_id", "");
    ASSERT_NE(phys.find("-g3-r"), std::string::npos) << got;
    EXPECT_EQ(d.stop(SIGTERM), 0);
  }
  Daemon d(a);
  LangBot lb;
  ASSERT_EQ(lb.connect(d), 101);
  auto stale = lb.call("box_get_sessions", ojson::object(), context("w", 2));
  EXPECT_EQ(message(stale), "PermissionError: Stale Box placement generation") << stale;
  EXPECT_EQ(Api(d).get("/v1/sessions/" + phys).status, 200) << "the stale call deleted nothing";
  auto current = lb.call("box_exec", box_spec("r", "echo still"), context("w", 3));
  ASSERT_TRUE(ok(current)) << current;
  EXPECT_EQ(current["data"].value("stdout", ""), "still") << current;
}

TEST(LangBotConfig, TrustedInstanceAndTokensWithoutAControlToken) {
  std::vector<std::string> ns;
  if (test_backend() == "ns") ns = {"--backend", "ns"};
  {
    auto a = ns;
    a.insert(a.end(), {"--langbot-control-token", kToken, "--langbot-trusted-instance", "inst-9"});
    Daemon d(a);
    LbSocket s;
    EXPECT_EQ(s.open(d.host_port(), "/rpc/ws", LbSocket::Headers{}), 401);
    LangBot lb;
    LbSocket::Headers h;
    h.instance = "inst-9";
    ASSERT_EQ(lb.connect(d, h), 101);
    EXPECT_TRUE(ok(lb.call("__ping", ojson::object())));
  }
  {
    // A daemon with tokens and no langbot.control_token: /rpc/ws is closed (the bearer token is
    // not LangBot's, and these routes must not bypass it).
    auto a = ns;
    a.insert(a.end(), {"--token", "t0k"});
    Daemon d(a);
    LbSocket s;
    LbSocket::Headers h;
    h.token.clear();
    EXPECT_EQ(s.open(d.host_port(), "/rpc/ws", h), 401);
  }
  {
    std::string out;
    int rc =
        Daemon::run_to_exit({"--langbot-control-token", "short", "--listen", "127.0.0.1:0"}, &out);
    EXPECT_NE(rc, 0);
    EXPECT_NE(out.find("langbot.control_token"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace agentbox::testing
