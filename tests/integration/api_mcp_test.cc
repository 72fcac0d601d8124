// The MCP endpoint (POST|GET|DELETE /v1/sessions/{id}/mcp), driven by the stock
// @modelcontextprotocol/sdk client (tests/node/mcp_client.mjs) as an agent framework drives it,
// and by hand for what the client never sends: missing or foreign session ids, a browser Origin,
// malformed JSON, another tenant.

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

std::string run(const std::string& cmd, int* status) { return run_shell(cmd, status); }

struct Raw {
  int status = 0;
  json body;
  std::string headers;
};

// One POST to the MCP endpoint with curl: `extra` are more curl arguments (headers).
Raw mcp_post(const Daemon& d, const std::string& session, const std::string& body,
             const std::string& extra) {
  std::string hdr_file = d.temp_dir() + "/headers";
  std::string cmd = "curl -s -D " + hdr_file + " -o - -w '\\n%{http_code}' -X POST " +
                    "-H 'Content-Type: application/json' " +
                    "-H 'Accept: application/json, text/event-stream' " + extra + " --data-binary '" +
                    body + "' " + d.url() + "/v1/sessions/" + session + "/mcp";
  int st = 0;
  std::string out = run(cmd, &st);
  Raw r;
  auto nl = out.rfind('\n');
  if (nl == std::string::npos) return r;
  r.status = std::atoi(out.c_str() + nl + 1);
  r.body = json::parse(out.substr(0, nl), nullptr, false);
  r.headers = slurp(hdr_file);
  std::filesystem::remove(hdr_file);
  return r;
}

// The Mcp-Session-Id header of an initialize reply.
std::string session_header(const std::string& headers) {
  std::string lower = headers;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto pos = lower.find("mcp-session-id:");
  if (pos == std::string::npos) return "";
  pos += 15;
  auto end = headers.find('\r', pos);
  std::string v = headers.substr(pos, end - pos);
  v.erase(0, v.find_first_not_of(' '));
  return v;
}

const char* kInit =
    R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",)"
    R"("capabilities":{},"clientInfo":{"name":"curl","version":"1"}}})";
const char* kList = R"({"jsonrpc":"2.0","id":2,"method":"tools/list"})";

std::string node_dir() { return AGENTBOX_NODE_DIR; }

TEST(McpApi, TheStockClientUsesEveryTool) {
  ASSERT_TRUE(std::filesystem::exists(node_dir() +
                                      "/node_modules/@modelcontextprotocol/sdk/package.json"))
      << "the MCP SDK is not installed: run scripts/bootstrap";
  Daemon d({"--token", "t0k"});
  int status = -1;
  std::string out = run("cd " + node_dir() + " && node mcp_client.mjs " + d.url() +
                            "/v1/sessions/mcp1/mcp t0k 2>&1",
                        &status);
  ASSERT_EQ(status, 0) << out << "\n" << d.log();
  json r = json::parse(out, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << out;

  EXPECT_EQ(r["session_id"].get<std::string>().size(), 32u) << r["session_id"];
  EXPECT_EQ(r["server"]["name"], "agentbox");
  for (const char* t : {"exec", "read_file", "write_file", "edit_file", "list_dir", "stat", "mkdir",
                        "rename", "remove", "start_process", "process_output", "kill_process"}) {
    EXPECT_NE(std::find(r["tools"].begin(), r["tools"].end(), t), r["tools"].end()) << t;
  }
  // A command that ran is a result, whatever its exit code.
  EXPECT_EQ(r["exec"]["stdout"], "hi\n");
  EXPECT_EQ(r["exec"]["stderr"], "err\n");
  EXPECT_EQ(r["exec"]["exit_code"], 3);
  EXPECT_EQ(r["exec"]["timed_out"], false);
  EXPECT_EQ(r["exec_stdin"]["stdout"], "SHOUT");
  EXPECT_EQ(r["exec_timeout"]["timed_out"], true);
  EXPECT_EQ(r["exec_timeout"]["exit_code"], -1);
  // An argument the tool does not take is refused, never ignored.
  EXPECT_EQ(r["exec_unknown_arg"]["isError"], true);
  EXPECT_NE(r["exec_unknown_arg"]["text"].get<std::string>().find("ENOTSUP"), std::string::npos)
      << r["exec_unknown_arg"];
  EXPECT_NE(r["exec_unknown_arg"]["text"].get<std::string>().find("'user'"), std::string::npos);

  EXPECT_EQ(r["write"]["size"], 22);
  EXPECT_EQ(r["read"]["content"], "hello world\nbye world\n");
  EXPECT_EQ(r["read"]["truncated"], false);
  // edit_file: an ambiguous or missing old_string fails and leaves the file as it was.
  EXPECT_EQ(r["edit_ambiguous"]["isError"], true);
  EXPECT_NE(r["edit_ambiguous"]["text"].get<std::string>().find("occurs 2 times"),
            std::string::npos)
      << r["edit_ambiguous"];
  EXPECT_EQ(r["edit"]["replacements"], 1);
  EXPECT_EQ(r["edit_missing"]["isError"], true);
  EXPECT_EQ(r["read_after_edit"]["content"], "agentbox");
  EXPECT_EQ(r["read_after_edit"]["size"], 25);
  EXPECT_EQ(r["read_after_edit"]["truncated"], true);
  // Binary content: refused as text, exact as base64.
  EXPECT_NE(r["read_binary_as_text"].get<std::string>().find("EINVAL"), std::string::npos)
      << r["read_binary_as_text"];
  EXPECT_EQ(r["read_binary"]["content"], "AAEC/v8=");
  EXPECT_EQ(r["read_binary"]["size"], 5);

  ASSERT_EQ(r["list"]["entries"].size(), 1u) << r["list"];
  EXPECT_EQ(r["list"]["entries"][0]["name"], "moved.txt");
  EXPECT_EQ(r["stat"]["size"], 25);
  EXPECT_EQ(r["stat"]["is_dir"], false);
  EXPECT_TRUE(r["remove_not_empty"]["text"].get<std::string>().starts_with("ENOTEMPTY"))
      << r["remove_not_empty"];
  EXPECT_TRUE(r["stat_gone"]["text"].get<std::string>().starts_with("ENOENT")) << r["stat_gone"];

  EXPECT_EQ(r["start"]["tag"], "srv");
  EXPECT_EQ(r["start"]["state"], "running");
  EXPECT_EQ(r["process_output"]["stdout"], "started\n");
  EXPECT_EQ(r["kill"]["state"], "killed");
  EXPECT_EQ(r["unknown_tool"]["code"], -32602) << r["unknown_tool"];
  EXPECT_EQ(r["terminated"], true);

  // What the tools did is in the session, as the REST API sees it.
  Api api(d, "t0k");
  EXPECT_EQ(api.get(files_target("mcp1", "bin/blob")).raw, std::string("\0\1\2\xfe\xff", 5));
  EXPECT_EQ(api.get(files_target("mcp1", "a/b/c/moved.txt")).status, 404);
}

TEST(McpApi, TheTransportRefusesWhatTheSpecificationRefuses) {
  TempDir cfg("agentbox-mcp");
  ASSERT_TRUE(spit(cfg.path() + "/config.yaml",
                   "tenants:\n  - {name: alice, tokens: [alice-token]}\n"
                   "  - {name: bob, tokens: [bob-token]}\n"
                   "allowed_origins: [http://app.test]\n"));
  Daemon d({"--config", cfg.path() + "/config.yaml"});
  const std::string alice = "-H 'Authorization: Bearer alice-token' ";
  const std::string bob = "-H 'Authorization: Bearer bob-token' ";

  EXPECT_EQ(mcp_post(d, "m", kInit, "").status, 401);
  auto init = mcp_post(d, "m", kInit, alice);
  ASSERT_EQ(init.status, 200) << init.body;
  EXPECT_EQ(init.body["result"]["protocolVersion"], "2025-06-18");
  EXPECT_EQ(init.body["result"]["capabilities"]["tools"]["listChanged"], false);
  std::string sid = session_header(init.headers);
  ASSERT_EQ(sid.size(), 32u) << init.headers;
  const std::string with_sid = alice + "-H 'Mcp-Session-Id: " + sid + "' ";

  auto list = mcp_post(d, "m", kList, with_sid);
  EXPECT_EQ(list.status, 200);
  EXPECT_EQ(list.body["result"]["tools"].size(), 12u);
  // No session id after initialize: 400; an unknown one, or one of another URL or tenant: 404.
  EXPECT_EQ(mcp_post(d, "m", kList, alice).status, 400);
  EXPECT_EQ(mcp_post(d, "m", kList, alice + "-H 'Mcp-Session-Id: 0123' ").status, 404);
  EXPECT_EQ(mcp_post(d, "other", kList, with_sid).status, 404);
  auto foreign = mcp_post(d, "m", kList, bob + "-H 'Mcp-Session-Id: " + sid + "' ");
  EXPECT_EQ(foreign.status, 404) << foreign.body;
  // A browser page (it sends an Origin) is refused unless its origin is allowed: DNS rebinding.
  auto browser = mcp_post(d, "m", kList, with_sid + "-H 'Origin: http://evil.test' ");
  EXPECT_EQ(browser.status, 403);
  EXPECT_NE(browser.body.dump().find("evil.test"), std::string::npos) << browser.body;
  EXPECT_EQ(mcp_post(d, "m", kList, with_sid + "-H 'Origin: http://app.test' ").status, 200);
  // JSON-RPC errors.
  auto bad = mcp_post(d, "m", "{not json", with_sid);
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body["error"]["code"], -32700) << bad.body;
  auto batch = mcp_post(d, "m", "[" + std::string(kList) + "]", with_sid);
  EXPECT_EQ(batch.status, 400);
  EXPECT_EQ(batch.body["error"]["code"], -32600);
  auto method = mcp_post(d, "m", R"({"jsonrpc":"2.0","id":3,"method":"resources/list"})", with_sid);
  EXPECT_EQ(method.status, 200);
  EXPECT_EQ(method.body["error"]["code"], -32601);
  auto notification =
      mcp_post(d, "m", R"({"jsonrpc":"2.0","method":"notifications/initialized"})", with_sid);
  EXPECT_EQ(notification.status, 202);
  auto version = mcp_post(d, "m", kList, with_sid + "-H 'MCP-Protocol-Version: 1999-01-01' ");
  EXPECT_EQ(version.status, 400);
  auto wrong_args = mcp_post(
      d, "m", R"({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"exec","arguments":{"command":7}}})",
      with_sid);
  EXPECT_EQ(wrong_args.status, 200);
  EXPECT_EQ(wrong_args.body["result"]["isError"], true) << wrong_args.body;
  EXPECT_NE(wrong_args.body["result"]["content"][0]["text"].get<std::string>().find("command"),
            std::string::npos);

  // GET has no stream (405); DELETE ends the MCP session, after which its id is unknown.
  Api a(d, "alice-token");
  auto get = a.get("/v1/sessions/m/mcp");
  EXPECT_EQ(get.status, 405);
  EXPECT_EQ(get.headers["allow"], "POST, DELETE");
  int st = 0;
  std::string del = run("curl -s -o /dev/null -w '%{http_code}' -X DELETE " + with_sid + d.url() +
                            "/v1/sessions/m/mcp",
                        &st);
  EXPECT_EQ(del, "200");
  EXPECT_EQ(mcp_post(d, "m", kList, with_sid).status, 404);
  // The agentbox session stays; bob does not see it.
  EXPECT_EQ(a.get("/v1/sessions/m").status, 200);
  EXPECT_EQ(Api(d, "bob-token").get("/v1/sessions/m").status, 404);
}

// ---- agentbox mcp SESSION: the same tools over stdio

std::string cli_binary() {
  const char* dir = std::getenv("AGENTBOX_BIN_DIR");
  if (dir != nullptr && *dir != 0) return std::string(dir) + "/agentbox";
  return std::filesystem::path(Daemon::binary()).parent_path() / "agentbox";
}

// The stock SDK's stdio transport starts the CLI as a desktop agent starts a local MCP server.
TEST(McpStdio, TheStockClientUsesTheToolsOverStdio) {
  ASSERT_TRUE(std::filesystem::exists(node_dir() +
                                      "/node_modules/@modelcontextprotocol/sdk/package.json"))
      << "the MCP SDK is not installed: run scripts/bootstrap";
  Daemon d({"--token", "t0k"});
  int status = -1;
  std::string out = run("cd " + node_dir() + " && node mcp_stdio_client.mjs " + cli_binary() +
                            " " + d.url() + " t0k stdio1",
                        &status);
  ASSERT_EQ(status, 0) << out << "\n" << d.log();
  json r = json::parse(out, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << out;
  EXPECT_EQ(r["server"]["name"], "agentbox");
  EXPECT_EQ(r["tools"].size(), 12u) << r["tools"];
  EXPECT_EQ(r["exec"]["stdout"], "hi\n");
  EXPECT_EQ(r["exec"]["exit_code"], 3);
  EXPECT_EQ(r["read"]["content"], "over stdio\n");
  // A slow command does not hold up what comes after it.
  EXPECT_EQ(r["slow"]["stdout"], "slow\n");
  EXPECT_EQ(r["order"], json::array({"ping", "quick", "slow"})) << r["order"];
  EXPECT_EQ(r["unknown_arg"]["isError"], true);
  EXPECT_EQ(r["stderr"], "") << r["stderr"];
  // The tools acted on the agentbox session, as the REST API sees it.
  Api api(d, "t0k");
  EXPECT_EQ(api.get(files_target("stdio1", "notes/a.txt")).raw, "over stdio\n");
}

// `agentbox mcp` with its own pipes, a line at a time.
class StdioBridge {
 public:
  StdioBridge(const std::string& server, const std::string& token, const std::string& session) {
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC)) {
      throw std::runtime_error("pipe2 failed");
    }
    std::vector<std::string> argv = {cli_binary(), "--server", server, "--token", token, "mcp",
                                     session};
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    in_ = in[1];
    out_ = out[0];
    err_ = err[0];
  }
  ~StdioBridge() {
    if (in_ >= 0) ::close(in_);
    if (pid_ > 0 && status_ < 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(out_);
    ::close(err_);
  }

  void send(const std::string& line) {
    std::string l = line + "\n";
    ASSERT_EQ(::write(in_, l.data(), l.size()), static_cast<ssize_t>(l.size()));
  }
  // The next line of stdout, parsed; null after 20 s without one.
  json next() {
    for (int waited = 0; waited < 20000;) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return json::parse(line, nullptr, false);
      }
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) {
        waited += 100;
        continue;
      }
      char b[65536];
      ssize_t n = ::read(out_, b, sizeof b);
      if (n <= 0) break;
      buf_.append(b, static_cast<std::size_t>(n));
    }
    return nullptr;
  }
  // Closes stdin; the exit status and what is left on stderr.
  int finish(std::string* err) {
    ::close(in_);
    in_ = -1;
    int st = 0;
    ::waitpid(pid_, &st, 0);
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    char b[4096];
    ssize_t n;
    while ((n = ::read(err_, b, sizeof b)) > 0) err->append(b, static_cast<std::size_t>(n));
    while ((n = ::read(out_, b, sizeof b)) > 0) buf_.append(b, static_cast<std::size_t>(n));
    return status_;
  }
  const std::string& rest() const { return buf_; }

 private:
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  int status_ = -1;
  std::string buf_;
};

std::string exec_call(int id, const std::string& command) {
  return json{{"jsonrpc", "2.0"},
              {"id", id},
              {"method", "tools/call"},
              {"params", {{"name", "exec"}, {"arguments", {{"command", command}}}}}}
      .dump();
}

// What a desktop agent would otherwise see break: a line that is not JSON, a daemon that is
// restarted under it (the endpoint forgets MCP sessions; the bridge initializes again), a
// daemon that is gone (a JSON-RPC error for the request, not a dead server), a bad token.
TEST(McpStdio, BadLinesARestartedDaemonAndAGoneOne) {
  TempDir tmp("agentbox-mcpstdio");
  const std::string data = tmp.path() + "/data";
  auto d = std::make_unique<Daemon>(std::vector<std::string>{"--token", "t0k", "--data-dir", data});
  const std::string listen = d->host_port();
  StdioBridge b(d->url(), "t0k", "s1");

  b.send("this is not json");
  json parse_error = b.next();
  EXPECT_EQ(parse_error["error"]["code"], -32700) << parse_error;
  EXPECT_TRUE(parse_error["id"].is_null());

  b.send(kInit);
  json init = b.next();
  EXPECT_EQ(init["id"], 1) << init;
  EXPECT_EQ(init["result"]["protocolVersion"], "2025-06-18");
  b.send(R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
  b.send(exec_call(2, "echo one > f; cat f"));
  json one = b.next();
  EXPECT_EQ(one["id"], 2) << one;
  EXPECT_EQ(one["result"]["structuredContent"]["stdout"], "one\n") << one;

  // kill -9 and a new daemon on the same address and data dir: the next call just works.
  EXPECT_EQ(d->stop(SIGKILL), 128 + SIGKILL);
  d.reset();
  d = std::make_unique<Daemon>(
      std::vector<std::string>{"--token", "t0k", "--data-dir", data, "--listen", listen});
  b.send(exec_call(3, "cat f"));
  json again = b.next();
  EXPECT_EQ(again["id"], 3) << again;
  EXPECT_EQ(again["result"]["structuredContent"]["stdout"], "one\n") << again;

  // The daemon gone (a clean stop this time, so that it removes its cgroups): the request is
  // answered with an error naming why.
  EXPECT_EQ(d->stop(SIGTERM), 0);
  b.send(R"({"jsonrpc":"2.0","id":4,"method":"ping"})");
  json gone = b.next();
  EXPECT_EQ(gone["id"], 4) << gone;
  EXPECT_EQ(gone["error"]["code"], -32000) << gone;
  EXPECT_NE(gone["error"]["message"].get<std::string>().find("EUNAVAILABLE"), std::string::npos)
      << gone;

  std::string err;
  EXPECT_EQ(b.finish(&err), 0) << err;
  EXPECT_EQ(b.rest(), "");
  EXPECT_NE(err.find("initialized again"), std::string::npos) << err;
}

TEST(McpStdio, AWrongTokenIsAnErrorForTheRequest) {
  Daemon d({"--token", "t0k"});
  StdioBridge b(d.url(), "wrong", "s1");
  b.send(kInit);
  json r = b.next();
  EXPECT_EQ(r["id"], 1) << r;
  EXPECT_EQ(r["error"]["code"], -32000) << r;
  EXPECT_NE(r["error"]["message"].get<std::string>().find("EUNAUTHORIZED"), std::string::npos) << r;
  std::string err;
  EXPECT_EQ(b.finish(&err), 0) << err;
  EXPECT_NE(err.find("EUNAUTHORIZED"), std::string::npos) << err;
  EXPECT_EQ(Api(d, "t0k").get("/v1/sessions/s1").status, 404);
}

}  // namespace
}  // namespace agentbox::testing
