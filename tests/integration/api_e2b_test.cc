// The E2B dialect (/e2b: control plane and envd's process.Process), driven by the stock `e2b`
// SDK (tests/node/e2b_client.mjs) as an agent drives E2B, and by hand for what the SDK never
// sends: other tenants' keys and other sandboxes' tokens (SECURITY.md T10), malformed Connect
// requests (answered in Connect error codes, never a 5xx), keepalives on a quiet stream and
// Connect-Timeout-Ms killing a process whose stream is gone.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

using Headers = client::Client::Headers;

std::string node_dir() { return AGENTBOX_NODE_DIR; }

std::string run(const std::string& cmd, int* status) { return run_shell(cmd, status); }

// One Connect envelope.
std::string envelope(const std::string& json_text, unsigned char flags = 0) {
  std::string out;
  auto n = static_cast<std::uint32_t>(json_text.size());
  out.push_back(static_cast<char>(flags));
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<char>((n >> shift) & 0xff));
  return out + json_text;
}

struct Frame {
  unsigned flags = 0;
  json msg;
};

// The envelopes of a stream reply's body; an incomplete tail is reported as flags 0xff.
std::vector<Frame> frames(const std::string& body) {
  std::vector<Frame> out;
  std::size_t i = 0;
  while (i < body.size()) {
    if (body.size() - i < 5) {
      out.push_back({0xff, json()});
      break;
    }
    std::uint32_t n = 0;
    for (int k = 1; k <= 4; ++k) n = (n << 8) | static_cast<unsigned char>(body[i + k]);
    if (body.size() - i - 5 < n) {
      out.push_back({0xff, json()});
      break;
    }
    out.push_back({static_cast<unsigned char>(body[i]),
                   json::parse(body.substr(i + 5, n), nullptr, false)});
    i += 5 + n;
  }
  return out;
}

class E2bRaw {
 public:
  explicit E2bRaw(const Daemon& d) : api_(d, "") {}

  ApiReply control(const std::string& method, const std::string& path, const std::string& key,
                   const std::string& body = "") {
    Headers h;
    if (!key.empty()) h.emplace_back("X-API-KEY", key);
    return send(method, "/e2b" + path, body, "application/json", h);
  }
  // A unary envd call.
  ApiReply unary(const std::string& sandbox, const std::string& token, const std::string& rpc,
                 const std::string& body, Headers extra = {}) {
    extra.emplace_back("E2b-Sandbox-Id", sandbox);
    if (!token.empty()) extra.emplace_back("X-Access-Token", token);
    extra.emplace_back("Connect-Protocol-Version", "1");
    return send("POST", "/e2b/" + rpc, body, "application/json", extra);
  }
  // A server-streaming envd call whose stream ends by itself.
  ApiReply stream(const std::string& sandbox, const std::string& token, const std::string& rpc,
                  const std::string& raw_body, Headers extra = {}) {
    extra.emplace_back("E2b-Sandbox-Id", sandbox);
    if (!token.empty()) extra.emplace_back("X-Access-Token", token);
    extra.emplace_back("Connect-Protocol-Version", "1");
    return send("POST", "/e2b/" + rpc, raw_body, "application/connect+json", extra);
  }

 private:
  ApiReply send(const std::string& method, const std::string& target, const std::string& body,
                const std::string& ct, const Headers& h) {
    return api_.call(method, target, body, ct, h);
  }
  Api api_;
};

struct Created {
  std::string id;
  std::string token;
};

Created create_sandbox(E2bRaw* e, const std::string& key) {
  auto r = e->control("POST", "/v2/sandboxes", key, R"({"templateID":"base","timeout":300})");
  EXPECT_EQ(r.status, 201) << r;
  Created c;
  if (r.status == 201) {
    c.id = r.body.value("sandboxID", "");
    c.token = r.body.value("envdAccessToken", "");
  }
  return c;
}

// A shell command printing "alive" while the process in `pid_file` runs, else "dead" (a zombie,
// killed but not reaped yet, is dead).
std::string alive_cmd(const std::string& pid_file) {
  return "s=$(awk '{print $3}' /proc/$(cat " + pid_file +
         ")/stat 2>/dev/null); [ -n \"$s\" ] && [ \"$s\" != Z ] && echo alive || echo dead";
}

std::string start_body(const std::string& cmd) {
  json m = {{"process", {{"cmd", "/bin/sh"}, {"args", {"-c", cmd}}}}, {"stdin", false}};
  return envelope(m.dump());
}

TEST(E2bApi, TheStockSdkDrivesCommandsPtyAndTheControlPlane) {
  ASSERT_TRUE(std::filesystem::exists(node_dir() + "/node_modules/e2b/package.json"))
      << "the e2b SDK is not installed: run scripts/bootstrap";
  Daemon d({"--token", "e2b_0123abcd"});
  int status = -1;
  std::string out = run("cd " + node_dir() + " && node e2b_client.mjs " + d.url() +
                            "/e2b e2b_0123abcd 2>&1",
                        &status);
  ASSERT_EQ(status, 0) << out << "\n" << d.log();
  json r = json::parse(out, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << out;
  SCOPED_TRACE(out);

  EXPECT_TRUE(r["sandbox_id"].get<std::string>().starts_with("e2b-"));
  EXPECT_EQ(r["running"], true);
  const std::string home = r["home"];
  if (test_backend() == "ns") {
    EXPECT_EQ(home, "/workspace");
  }
  EXPECT_EQ(r["run"]["stdout"], "hi\nyes\n" + home + "\n");
  EXPECT_EQ(r["run"]["stderr"], "oops\n");
  EXPECT_EQ(r["run"]["exitCode"], 0);
  // A non-zero exit is CommandExitError with the code and the output so far.
  EXPECT_EQ(r["nonzero"]["threw"]["name"], "CommandExitError");
  EXPECT_EQ(r["nonzero"]["exitCode"], 3);
  EXPECT_EQ(r["nonzero"]["stdout"], "bad\n");
  EXPECT_EQ(r["nonzero"]["error"], "exit status 3");
  EXPECT_EQ(r["envs"], "1-two\n");
  EXPECT_EQ(r["cwd_relative"], home + "/sub/dir\n");
  EXPECT_EQ(r["cwd_absolute"], home + "/sub\n");
  EXPECT_EQ(r["cwd_missing"]["threw"]["name"], "InvalidArgumentError");
  EXPECT_NE(r["cwd_missing"]["threw"]["message"].get<std::string>().find("does not exist"),
            std::string::npos);
  // Streaming callbacks got every line, stdout apart from stderr.
  std::string streamed_out, streamed_err;
  for (const auto& c : r["stream"]) {
    (c[0] == "out" ? streamed_out : streamed_err) += c[1].get<std::string>();
  }
  EXPECT_EQ(streamed_out, "line1\nline2\nline3\n");
  EXPECT_EQ(streamed_err, "done\n");
  EXPECT_EQ(r["stdin"], "ping\npong\nEND\n");
  EXPECT_EQ(r["no_stdin"], "EOF\n");
  // timeoutMs: the SDK gives up, and the command is dead too.
  EXPECT_EQ(r["timeout"]["threw"]["name"], "TimeoutError");
  EXPECT_LT(r["timeout_ms"].get<int>(), 15000);
  EXPECT_EQ(r["timeout_alive"], "dead\n");
  // Background + list + kill: the listing shows the command; kill takes the child too.
  bool listed = false;
  for (const auto& p : r["list"]) listed = listed || p["pid"] == r["bg_pid"];
  EXPECT_TRUE(listed) << r["list"];
  EXPECT_EQ(r["kill"], true);
  EXPECT_EQ(r["bg_wait"]["threw"]["name"], "CommandExitError");
  EXPECT_EQ(r["bg_wait"]["exitCode"], -1);
  EXPECT_EQ(r["bg_wait"]["error"], "signal: killed");
  EXPECT_EQ(r["kill_again"], false);
  EXPECT_EQ(r["child_alive"], "dead\n");
  // A dropped stream left the command running; connect saw it to its end.
  EXPECT_EQ(r["reconnect"]["exitCode"], 4);
  EXPECT_NE(r["reconnect_seen"].get<std::string>().find("tick20\n"), std::string::npos);
  // The terminal: the resize reached it, the typed command ran.
  EXPECT_NE(r["pty"].get<std::string>().find("30 100"), std::string::npos);
  EXPECT_NE(r["pty"].get<std::string>().find("PTY42"), std::string::npos);
  EXPECT_EQ(r["pty_wait"], 0);
  // Control plane.
  EXPECT_EQ(r["connect_run"], "again\n");
  EXPECT_EQ(r["info"]["sandboxId"], r["sandbox_id"]);
  EXPECT_EQ(r["info"]["templateId"], "base");
  EXPECT_EQ(r["info"]["state"], "running");
  EXPECT_EQ(r["info"]["metadata"]["purpose"], "e2b-test");
  EXPECT_EQ(r["listed"], json::array({r["sandbox_id"]}));
  EXPECT_EQ(r["paused"], true);
  EXPECT_EQ(r["running_paused"], false);
  EXPECT_EQ(r["paused_again"], false);
  EXPECT_EQ(r["resumed_run"], "kept\n");  // the workspace outlives a pause
  EXPECT_EQ(r["killed"], true);
  EXPECT_EQ(r["running_killed"], false);
  EXPECT_EQ(r["killed_again"], false);
  EXPECT_EQ(r["connect_gone"]["threw"]["name"], "SandboxNotFoundError");
  EXPECT_EQ(r["run_gone"]["threw"]["name"], "SandboxNotFoundError");
  EXPECT_NE(r["bad_template"]["threw"]["message"].get<std::string>().find("no-such-template"),
            std::string::npos);
  // The session is gone as the native API sees it.
  Api api(d, "e2b_0123abcd");
  EXPECT_EQ(api.get("/v1/sessions/" + r["sandbox_id"].get<std::string>()).status, 404);
}

// SECURITY.md T10: /e2b needs auth; another tenant's sandbox does not exist for a tenant;
// another sandbox's access token opens nothing.
TEST(E2bApi, KeysTenantsAndAccessTokens) {
  TempDir cfg("agentbox-e2b");
  ASSERT_TRUE(spit(cfg.path() + "/config.yaml",
                   "tenants:\n  - {name: alice, tokens: [alice-key]}\n"
                   "  - {name: bob, tokens: [bob-key]}\n"));
  Daemon d({"--config", cfg.path() + "/config.yaml"});
  E2bRaw e(d);

  for (const std::string& key : {std::string(), std::string("wrong-key")}) {
    auto r = e.control("POST", "/v2/sandboxes", key, "{}");
    EXPECT_EQ(r.status, 401) << r;
    EXPECT_EQ(r.body["code"], 401) << r;
    EXPECT_EQ(e.control("GET", "/v2/sandboxes", key).status, 401);
  }
  Created a = create_sandbox(&e, "alice-key");
  Created b = create_sandbox(&e, "bob-key");
  ASSERT_FALSE(a.id.empty());
  ASSERT_FALSE(b.id.empty());
  EXPECT_NE(a.token, b.token);

  // Bob does not see, connect to, pause or kill Alice's sandbox: it is not found for him.
  for (auto [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/sandboxes/" + a.id},
           {"DELETE", "/sandboxes/" + a.id},
           {"POST", "/sandboxes/" + a.id + "/connect"},
           {"POST", "/v2/sandboxes/" + a.id + "/connect"},
           {"POST", "/sandboxes/" + a.id + "/pause"},
           {"POST", "/sandboxes/" + a.id + "/timeout"}}) {
    auto r = e.control(method, path, "bob-key", R"({"timeout":10})");
    EXPECT_EQ(r.status, 404) << method << " " << path << ": " << r;
    EXPECT_EQ(r.body["code"], 404) << r;
  }
  auto listed = e.control("GET", "/v2/sandboxes", "bob-key");
  ASSERT_EQ(listed.status, 200) << listed;
  ASSERT_EQ(listed.body.size(), 1u) << listed;
  EXPECT_EQ(listed.body[0]["sandboxID"], b.id);

  // envd: Alice's process, then Bob's token (or none) on Alice's sandbox.
  auto started = e.stream(a.id, a.token, "process.Process/Start", start_body("echo mine"));
  ASSERT_EQ(started.status, 200) << started;
  auto f = frames(started.raw);
  ASSERT_GE(f.size(), 3u) << started;
  EXPECT_TRUE(f[0].msg["event"].contains("start")) << started;
  EXPECT_EQ(f.back().flags, 2u);
  for (const std::string& token : {b.token, std::string(), std::string("ea_0000")}) {
    auto r = e.unary(a.id, token, "process.Process/List", "{}");
    EXPECT_EQ(r.status, 401) << r;
    EXPECT_EQ(r.body["code"], "unauthenticated") << r;
    // A stream carries its error in the end-of-stream envelope of a 200 (Connect).
    auto s = e.stream(a.id, token, "process.Process/Start", start_body("echo theirs"));
    EXPECT_EQ(s.status, 200) << s;
    auto sf = frames(s.raw);
    ASSERT_EQ(sf.size(), 1u) << s;
    EXPECT_EQ(sf[0].msg["error"]["code"], "unauthenticated") << s;
    auto sig = e.unary(a.id, token, "process.Process/SendSignal",
                       R"({"process":{"pid":1},"signal":"SIGNAL_SIGKILL"})");
    EXPECT_EQ(sig.status, 401) << sig;
  }
  EXPECT_EQ(e.unary(a.id, a.token, "process.Process/List", "{}").status, 200);
  // /health is the sandbox's too.
  EXPECT_EQ(e.unary(a.id, b.token, "health", "").status, 401);
  // An unknown sandbox is what E2B's edge answers: 502, which the SDK reads as "not running".
  auto unknown = e.unary("e2b-nonexistent", a.token, "process.Process/List", "{}");
  EXPECT_EQ(unknown.status, 502) << unknown;
  EXPECT_EQ(unknown.body["sandboxId"], "e2b-nonexistent");
  // A user that is not the sandbox's one is refused.
  auto user = e.unary(a.id, a.token, "process.Process/List", "{}",
                      {{"Authorization", "Basic bWFsbG9yeTo="}});  // "mallory:"
  EXPECT_EQ(user.status, 401) << user;
  // A killed sandbox's token opens nothing.
  EXPECT_EQ(e.control("DELETE", "/sandboxes/" + a.id, "alice-key").status, 204);
  EXPECT_EQ(e.unary(a.id, a.token, "process.Process/List", "{}").status, 502);
}

// Bad input: Connect error codes (unary: status + JSON; streams: 200 + end-of-stream error),
// E2B's {"code","message"} on the control plane; never a 5xx, never a dropped connection.
TEST(E2bApi, BadInputIsAnsweredInTheDialectsOwnErrors) {
  Daemon d({"--token", "k"});
  E2bRaw e(d);
  Created s = create_sandbox(&e, "k");
  ASSERT_FALSE(s.id.empty());

  struct Unary {
    std::string rpc, body, code;
    int status;
  };
  for (const Unary& c : std::vector<Unary>{
           {"process.Process/List", "{not json", "invalid_argument", 400},
           {"process.Process/List", "[1]", "invalid_argument", 400},
           {"process.Process/SendSignal", R"({"process":{"pid":1},"signal":"SIGNAL_SIGHUP"})",
            "invalid_argument", 400},
           {"process.Process/SendSignal", R"({"signal":"SIGNAL_SIGKILL"})", "invalid_argument", 400},
           {"process.Process/SendSignal", R"({"process":{"pid":999999},"signal":"SIGNAL_SIGKILL"})",
            "not_found", 404},
           {"process.Process/SendInput", R"({"process":{"pid":"x1"},"input":{"stdin":"aGk="}})",
            "invalid_argument", 400},
           {"process.Process/SendInput", R"({"process":{"pid":999999},"input":{"stdin":"!!"}})",
            "invalid_argument", 400},
           {"process.Process/Update", R"({"process":{"pid":999999},"pty":{"size":{"cols":0,"rows":1}}})",
            "invalid_argument", 400},
           {"process.Process/Nope", "{}", "unimplemented", 404},
           {"process.Process/Start", "{}", "invalid_argument", 400},  // a stream called as unary
       }) {
    auto r = e.unary(s.id, s.token, c.rpc, c.body);
    EXPECT_EQ(r.status, c.status) << c.rpc << " " << c.body << ": " << r;
    EXPECT_EQ(r.body["code"], c.code) << c.rpc << " " << c.body << ": " << r;
    EXPECT_FALSE(r.body.value("message", "").empty()) << r;
  }
  // A path that is no envd route: REST's convention, 404 {"code":404}.
  auto nowhere = e.unary(s.id, s.token, "nowhere", "{}");
  EXPECT_EQ(nowhere.status, 404) << nowhere;
  EXPECT_EQ(nowhere.body["code"], 404) << nowhere;
  // Another codec: 415, named.
  Api raw(d, "");
  auto bin = raw.call("POST", "/e2b/process.Process/List", "\x0a", "application/proto",
                      {{"E2b-Sandbox-Id", s.id}, {"X-Access-Token", s.token}});
  EXPECT_EQ(bin.status, 415) << bin;
  EXPECT_NE(bin.raw.find("application/proto"), std::string::npos) << bin;

  // Streams: always 200 with the error in the end-of-stream envelope.
  struct Streamed {
    std::string body;
    Headers headers;
    std::string code;
  };
  json no_cmd = {{"process", {{"args", {"x"}}}}};
  for (const Streamed& c : std::vector<Streamed>{
           {"{}", {}, "invalid_argument"},                                   // no envelope
           {envelope("{}") + "x", {}, "invalid_argument"},                   // trailing bytes
           {envelope(R"({"process":{}})", 1), {}, "unimplemented"},          // compressed
           {envelope("{nope"), {}, "invalid_argument"},                      // not JSON
           {envelope(no_cmd.dump()), {}, "invalid_argument"},                // no cmd
           {start_body("true"), {{"Connect-Timeout-Ms", "soon"}}, "invalid_argument"},
           {start_body("true"), {{"Keepalive-Ping-Interval", "-1"}}, "invalid_argument"},
           {envelope(R"({"process":{"pid":999999}})"), {}, "not_found"},     // Connect below
       }) {
    const std::string rpc = c.code == "not_found" ? "process.Process/Connect" : "process.Process/Start";
    auto r = e.stream(s.id, s.token, rpc, c.body, c.headers);
    EXPECT_EQ(r.status, 200) << r;
    auto f = frames(r.raw);
    ASSERT_EQ(f.size(), 1u) << r;
    EXPECT_EQ(f[0].flags, 2u);
    EXPECT_EQ(f[0].msg["error"]["code"], c.code) << r;
  }

  // The control plane.
  struct Control {
    std::string method, path, body;
    int status;
  };
  for (const Control& c : std::vector<Control>{
           {"POST", "/v2/sandboxes", "{oops", 400},
           {"POST", "/v2/sandboxes", R"({"templateID":"python-3.11"})", 400},
           {"POST", "/v2/sandboxes", R"({"timeout":"long"})", 400},
           {"POST", "/v2/sandboxes", R"({"metadata":{"a":1}})", 400},
           {"POST", "/v2/sandboxes", R"({"network":{"allowOut":["1.1.1.1"]}})", 501},
           {"POST", "/sandboxes/" + s.id + "/timeout", R"({"timeout":-1})", 400},
           {"POST", "/sandboxes/" + s.id + "/timeout", "{}", 400},
           {"GET", "/v2/sandboxes?state=sleeping", "", 400},
           {"GET", "/sandboxes/" + s.id + "/metrics", "", 501},
           {"GET", "/not-e2b", "", 404},
           {"GET", "/sandboxes/..", "", 404},
       }) {
    auto r = e.control(c.method, c.path, "k", c.body);
    EXPECT_EQ(r.status, c.status) << c.method << " " << c.path << " " << c.body << ": " << r;
    EXPECT_EQ(r.body["code"], c.status) << r;
  }
  auto named = e.control("POST", "/v2/sandboxes", "k", R"({"network":{}})");
  EXPECT_NE(named.body.value("message", "").find("'network'"), std::string::npos) << named;
}

// A quiet stream carries keepalive events; Connect-Timeout-Ms kills the process even when its
// stream has gone; a dropped stream alone kills nothing.
TEST(E2bApi, KeepalivesTimeoutsAndDroppedStreams) {
  Daemon d({"--token", "k"});
  E2bRaw e(d);
  Created s = create_sandbox(&e, "k");
  ASSERT_FALSE(s.id.empty());

  auto quiet = e.stream(s.id, s.token, "process.Process/Start", start_body("sleep 2.5; echo up"),
                        {{"Keepalive-Ping-Interval", "1"}});
  ASSERT_EQ(quiet.status, 200) << quiet;
  int keepalives = 0;
  std::string stdout_b64;
  for (const auto& f : frames(quiet.raw)) {
    if (f.flags == 0 && f.msg["event"].contains("keepalive")) ++keepalives;
    if (f.flags == 0 && f.msg["event"].contains("data")) stdout_b64 += f.msg["event"]["data"]["stdout"];
  }
  EXPECT_GE(keepalives, 2) << quiet;
  EXPECT_EQ(stdout_b64, "dXAK");  // "up\n"

  // Connect-Timeout-Ms while the stream watches: deadline_exceeded, process dead.
  auto timed = e.stream(s.id, s.token, "process.Process/Start", start_body("sleep 30"),
                        {{"Connect-Timeout-Ms", "700"}});
  auto f = frames(timed.raw);
  ASSERT_GE(f.size(), 2u) << timed;
  EXPECT_EQ(f.back().flags, 2u);
  EXPECT_EQ(f.back().msg["error"]["code"], "deadline_exceeded") << timed;
  int pid = f[0].msg["event"]["start"]["pid"];
  auto list = e.unary(s.id, s.token, "process.Process/List", "{}");
  for (const auto& p : list.body["processes"]) EXPECT_NE(p["pid"], pid) << list;

  // The client leaves at once (curl gives up after 0.5 s) with a 1.5 s lifetime: the process
  // keeps running after the client left, and dies at its deadline.
  std::string env_file = d.temp_dir() + "/start.bin";
  ASSERT_TRUE(spit(env_file, start_body("echo $$ > lifetime.pid; exec sleep 30")));
  std::string curl = "curl -s -o /dev/null --max-time 0.5 -X POST -H 'Content-Type: "
                     "application/connect+json' -H 'E2b-Sandbox-Id: " + s.id +
                     "' -H 'X-Access-Token: " + s.token +
                     "' -H 'Connect-Timeout-Ms: 1500' --data-binary @" + env_file + " " + d.url() +
                     "/e2b/process.Process/Start";
  int st = 0;
  run(curl, &st);
  Api api(d, "k");
  auto alive = [&] {
    auto r = api.sh(s.id, alive_cmd("lifetime.pid"));
    return r.body.value("stdout", "");
  };
  EXPECT_EQ(alive(), "alive\n");
  EXPECT_TRUE(eventually([&] { return alive() == "dead\n"; }, 10));

  // Without a timeout, a dropped stream kills nothing.
  ASSERT_TRUE(spit(env_file, start_body("echo $$ > kept.pid; exec sleep 30")));
  std::string curl2 = "curl -s -o /dev/null --max-time 0.5 -X POST -H 'Content-Type: "
                      "application/connect+json' -H 'E2b-Sandbox-Id: " + s.id +
                      "' -H 'X-Access-Token: " + s.token + "' --data-binary @" + env_file + " " +
                      d.url() + "/e2b/process.Process/Start";
  run(curl2, &st);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto kept = api.sh(s.id, alive_cmd("kept.pid"));
  EXPECT_EQ(kept.body.value("stdout", ""), "alive\n") << kept;
  // Kill by SendSignal: the whole group.
  auto procs = e.unary(s.id, s.token, "process.Process/List", "{}");
  for (const auto& p : procs.body["processes"]) {
    auto r = e.unary(s.id, s.token, "process.Process/SendSignal",
                     json{{"process", {{"pid", p["pid"]}}}, {"signal", "SIGNAL_SIGKILL"}}.dump());
    EXPECT_EQ(r.status, 200) << r;
  }
  EXPECT_TRUE(eventually([&] {
    return api.sh(s.id, alive_cmd("kept.pid")).body.value("stdout", "") == "dead\n";
  }));
}

}  // namespace
}  // namespace agentbox::testing
