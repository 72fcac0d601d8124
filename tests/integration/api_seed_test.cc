// Seed 001's routes, exactly: POST /exec, POST /exec-stream, POST /workspace/read (with
// --shared-dirs), POST /workspace/write, GET /healthz.

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

std::set<std::string> keys_of(const json& j) {
  std::set<std::string> out;
  for (auto it = j.begin(); it != j.end(); ++it) out.insert(it.key());
  return out;
}

// A host dir with a shared template tree, made before the daemon starts.
struct SharedTree {
  SharedTree() {
    char tmpl[] = "/tmp/agentbox-shared-XXXXXX";
    dir = mkdtemp(tmpl);
    std::filesystem::create_directories(dir + "/style");
    std::ofstream(dir + "/style/styles.json") << R"({"color":"red"})";
  }
  ~SharedTree() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string dir;
};

class SeedApi : public ::testing::Test {
 protected:
  SharedTree shared_;
  Daemon daemon_{{"--shared-dirs", "site-templates:" + shared_.dir}};
  Api api_{daemon_};
};

TEST_F(SeedApi, ExecReplyHasExactlyTheSeedFields) {
  auto r = api_.post("/exec", {{"command", "echo hi; echo err >&2; pwd"},
                               {"timeout_sec", 120},
                               {"max_output_bytes", 131072},
                               {"env", {{"AGENT_ID", "engineer-acme_12345"},
                                        {"AGENT_WORKSPACE", "/mnt/workspace/x"}}},
                               {"cgroup", {{"memory_mb", 512}, {"cpu_percent", 100},
                                           {"max_pids", 256}}}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(keys_of(r.body), (std::set<std::string>{"stdout", "stderr", "exit_code",
                                                    "duration_ms", "artifacts"}));
  auto ws = api_.get("/v1/sessions/engineer-acme_12345");
  ASSERT_EQ(ws.status, 200) << "the agent's session was not created: " << ws;
  // Runs in the agent's workspace; cgroup became the session's limits.
  EXPECT_EQ(r.body["stdout"], "hi\n" + ws.body["workspace"].get<std::string>() + "\n");
  EXPECT_EQ(r.body["stderr"], "err\n");
  EXPECT_EQ(r.body["exit_code"], 0);
  EXPECT_TRUE(r.body["duration_ms"].is_number_integer());
  EXPECT_EQ(ws.body["limits"]["memory_mb"], 512);
  EXPECT_EQ(ws.body["limits"]["max_pids"], 256);
  // A later exec with the same cgroup runs in the session; another one changes the live box's
  // limits first where the backend can (ns: LiveLimits has the rest), else it is 501 ENOTSUP
  // naming it, never run as if applied (api_failclosed_test).
  auto again = api_.post("/exec", {{"command", "echo again"},
                                   {"agent_id", "engineer-acme_12345"},
                                   {"cgroup", {{"memory_mb", 512}}}});
  ASSERT_EQ(again.status, 200) << again;
  EXPECT_EQ(again.body["stdout"], "again\n");
  auto other = api_.post("/exec", {{"command", "echo other"},
                                   {"agent_id", "engineer-acme_12345"},
                                   {"cgroup", {{"memory_mb", 1024}}}});
  const bool live = test_backend() == "ns";
  EXPECT_EQ(other.status, live ? 200 : 501) << other;
  EXPECT_EQ(api_.get("/v1/sessions/engineer-acme_12345").body["limits"]["memory_mb"],
            live ? 1024 : 512);

  // The env reaches the command.
  auto env = api_.post("/exec", {{"command", "echo $AGENT_ID"},
                                 {"env", {{"AGENT_ID", "engineer-acme_12345"}}}});
  EXPECT_EQ(env.body["stdout"], "engineer-acme_12345\n");
  // Top-level agent_id works too.
  auto top = api_.post("/exec", {{"command", "exit 5"}, {"agent_id", "other"}});
  ASSERT_EQ(top.status, 200) << top;
  EXPECT_EQ(top.body["exit_code"], 5);
  EXPECT_EQ(api_.get("/v1/sessions/other").status, 200);
}

TEST_F(SeedApi, ExecArtifacts) {
  auto r = api_.post("/exec", {{"command", "mkdir -p out; echo data > out/r.txt"},
                               {"agent_id", "art"},
                               {"artifact_dir", "/workspace/out"}});
  ASSERT_EQ(r.status, 200) << r;
  ASSERT_EQ(r.body["artifacts"].size(), 1u) << r;
  const json& a = r.body["artifacts"][0];
  EXPECT_EQ(keys_of(a), (std::set<std::string>{"path", "size", "mime_type"}));
  EXPECT_TRUE(a["path"].get<std::string>().ends_with("out/r.txt")) << a;
  EXPECT_EQ(a["size"], 5);
}

TEST_F(SeedApi, ExecBadInput) {
  auto no_agent = api_.post("/exec", {{"command", "true"}});
  EXPECT_EQ(no_agent.status, 400) << no_agent;
  EXPECT_NE(no_agent.message().find("agent_id"), std::string::npos) << no_agent;
  auto no_command = api_.post("/exec", {{"agent_id", "a"}});
  EXPECT_EQ(no_command.status, 400) << no_command;
  EXPECT_NE(no_command.message().find("'command'"), std::string::npos) << no_command;
  auto bad_agent = api_.post("/exec", {{"command", "true"}, {"agent_id", "../a"}});
  EXPECT_EQ(bad_agent.status, 400) << bad_agent;
  auto bad_cgroup = api_.post("/exec", {{"command", "true"}, {"agent_id", "a"},
                                        {"cgroup", {{"memory_mb", "x"}}}});
  EXPECT_EQ(bad_cgroup.status, 400) << bad_cgroup;
  EXPECT_NE(bad_cgroup.message().find("'cgroup.memory_mb'"), std::string::npos) << bad_cgroup;
  auto bad_timeout = api_.post("/exec", {{"command", "true"}, {"agent_id", "a"},
                                         {"timeout_sec", "soon"}});
  EXPECT_EQ(bad_timeout.status, 400);
  EXPECT_NE(bad_timeout.message().find("field 'timeout_sec' must be a number"),
            std::string::npos);
}

TEST_F(SeedApi, ExecStreamSendsLinesThenTheExitLine) {
  std::string all;
  auto r = api_.client().request_stream(
      "POST", "/exec-stream",
      json{{"command", "echo first; echo second; printf 'no newline'"},
           {"env", {{"AGENT_ID", "streamer"}}}}
          .dump(),
      [&](std::string_view c) {
        all.append(c);
        return true;
      });
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->headers["content-type"], "application/x-ndjson");
  std::vector<json> lines;
  std::size_t start = 0;
  for (std::size_t nl; (nl = all.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(json::parse(all.substr(start, nl - start)));
  }
  ASSERT_EQ(lines.size(), 4u) << all;
  EXPECT_EQ(lines[0], (json{{"stream", "stdout"}, {"line", "first"}}));
  EXPECT_EQ(lines[1], (json{{"stream", "stdout"}, {"line", "second"}}));
  EXPECT_EQ(lines[2], (json{{"stream", "stdout"}, {"line", "no newline"}}));
  EXPECT_EQ(keys_of(lines[3]), (std::set<std::string>{"exit_code", "duration_ms"}));
  EXPECT_EQ(lines[3]["exit_code"], 0);
}

TEST_F(SeedApi, WriteThenReadInTheAgentWorkspace) {
  auto w = api_.post("/workspace/write", {{"agent_id", "engineer-acme_12345"},
                                          {"path", "repos/site/index.html"},
                                          {"content", "<!doctype html>é"}});
  ASSERT_EQ(w.status, 200) << w;
  EXPECT_EQ(keys_of(w.body), std::set<std::string>{"bytes_written"});
  EXPECT_EQ(w.body["bytes_written"], std::string("<!doctype html>é").size());

  auto r = api_.post("/workspace/read",
                     {{"agent_id", "engineer-acme_12345"}, {"path", "repos/site/index.html"}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(keys_of(r.body), (std::set<std::string>{"content", "size"}));
  EXPECT_EQ(r.body["content"], "<!doctype html>é");
  EXPECT_EQ(r.body["size"], std::string("<!doctype html>é").size());
  // The file is the agent's, visible to its commands.
  auto cat = api_.post("/exec", {{"command", "cat repos/site/index.html"},
                                 {"agent_id", "engineer-acme_12345"}});
  EXPECT_EQ(cat.body["stdout"], "<!doctype html>é");

  auto missing = api_.post("/workspace/read",
                           {{"agent_id", "engineer-acme_12345"}, {"path", "nope.txt"}});
  EXPECT_EQ(missing.status, 404) << missing;
  auto escape = api_.post("/workspace/read",
                          {{"agent_id", "engineer-acme_12345"}, {"path", "../../etc/passwd"}});
  EXPECT_EQ(escape.status, 403) << escape;
  auto wescape = api_.post("/workspace/write", {{"agent_id", "engineer-acme_12345"},
                                                {"path", "../x"}, {"content", "x"}});
  EXPECT_EQ(wescape.status, 403) << wescape;
  auto no_content = api_.post("/workspace/write", {{"agent_id", "a"}, {"path", "x"}});
  EXPECT_EQ(no_content.status, 400);
  EXPECT_NE(no_content.message().find("'content'"), std::string::npos) << no_content;
  auto no_path = api_.post("/workspace/read", {{"agent_id", "a"}});
  EXPECT_EQ(no_path.status, 400);
  EXPECT_NE(no_path.message().find("'path'"), std::string::npos) << no_path;
}

TEST_F(SeedApi, SharedDirPrefixReadsFromTheSharedDir) {
  auto r = api_.post("/workspace/read", {{"agent_id", "engineer-acme_12345"},
                                         {"path", "site-templates/style/styles.json"}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["content"], R"({"color":"red"})");
  EXPECT_EQ(r.body["size"], 15);

  // Only at a path-component boundary, and never out of the shared dir.
  auto not_prefix = api_.post("/workspace/read", {{"agent_id", "engineer-acme_12345"},
                                                  {"path", "site-templates2/style/styles.json"}});
  EXPECT_EQ(not_prefix.status, 404) << not_prefix;
  auto escape = api_.post("/workspace/read", {{"agent_id", "x"},
                                              {"path", "site-templates/../../../etc/passwd"}});
  EXPECT_EQ(escape.status, 403) << escape;
  // Shared dirs are read-only.
  auto write = api_.post("/workspace/write", {{"agent_id", "x"},
                                              {"path", "site-templates/style/new.json"},
                                              {"content", "{}"}});
  EXPECT_EQ(write.status, 403) << write;
  EXPECT_FALSE(std::filesystem::exists(shared_.dir + "/style/new.json"));
}

TEST_F(SeedApi, HealthzIsOk) {
  // Seed 001 reads only the status; the body is LangBot's liveness JSON.
  auto r = api_.get("/healthz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body["live"], true) << r;
}

}  // namespace
}  // namespace agentbox::testing
