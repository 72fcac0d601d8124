// Ops and the daemon itself: /healthz, /readyz, /metrics, auth, routing errors, request limits,
// malformed HTTP, flags and config file, refusing an open listen address, SIGTERM.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

// The value of an unlabelled metric line ("name 12"), -1 if absent.
double metric(const std::string& text, const std::string& name) {
  std::size_t pos = 0;
  while ((pos = text.find(name, pos)) != std::string::npos) {
    bool line_start = pos == 0 || text[pos - 1] == '\n';
    std::size_t after = pos + name.size();
    if (line_start && after < text.size() && text[after] == ' ') {
      return std::stod(text.substr(after + 1));
    }
    pos = after;
  }
  return -1;
}

TEST(OpsApi, HealthzReadyzAndMetrics) {
  Daemon d;
  Api api(d);
  auto health = api.get("/healthz");
  EXPECT_EQ(health.status, 200);
  // LangBot's liveness shape (PROTOCOLS.md 2.1), which its health probe parses.
  EXPECT_NE(health.headers["content-type"].find("application/json"), std::string::npos);
  EXPECT_EQ(health.body["live"], true) << health;
  EXPECT_EQ(health.body["resources"]["sessions"], 0) << health;
  EXPECT_EQ(health.body["resources"]["managed_processes"], 0) << health;
  api.create("one");
  EXPECT_TRUE(eventually([&] { return api.get("/healthz").body["resources"]["sessions"] == 1; }))
      << api.get("/healthz");
  auto ready = api.get("/readyz");
  EXPECT_EQ(ready.status, 200) << ready;

  auto before = api.get("/metrics");
  ASSERT_EQ(before.status, 200);
  EXPECT_NE(before.headers["content-type"].find("text/plain"), std::string::npos);
  for (const char* name :
       {"agentbox_sessions{state=\"running\"}", "agentbox_execs_total",
        "agentbox_execs_failed_total", "agentbox_execs_timed_out_total",
        "agentbox_exec_duration_seconds_bucket{le=\"+Inf\"}", "agentbox_exec_duration_seconds_sum",
        "agentbox_exec_duration_seconds_count", "agentbox_bytes_in_total",
        "agentbox_bytes_out_total", "agentbox_runner_connections"}) {
    EXPECT_GE(metric(before.raw, name), 0) << name << " missing in:\n" << before.raw;
  }
  EXPECT_EQ(metric(before.raw, "agentbox_execs_total"), 0);
  EXPECT_EQ(metric(before.raw, "agentbox_sessions{state=\"running\"}"), 1);  // "one"

  ASSERT_EQ(api.sh("m", "true").status, 200);
  ASSERT_EQ(api.sh("m", "exit 1").status, 200);
  ASSERT_EQ(api.exec("m", {{"command", "sleep 10"}, {"timeout_sec", 0.5}}).status, 200);
  auto after = api.get("/metrics");
  EXPECT_EQ(metric(after.raw, "agentbox_execs_total"), 3);
  EXPECT_EQ(metric(after.raw, "agentbox_execs_failed_total"), 1);
  EXPECT_EQ(metric(after.raw, "agentbox_execs_timed_out_total"), 1);
  EXPECT_EQ(metric(after.raw, "agentbox_exec_duration_seconds_count"), 3);
  EXPECT_EQ(metric(after.raw, "agentbox_exec_duration_seconds_bucket{le=\"+Inf\"}"), 3);
  EXPECT_EQ(metric(after.raw, "agentbox_sessions{state=\"running\"}"), 2);  // "one", "m"
  EXPECT_GT(metric(after.raw, "agentbox_bytes_in_total"),
            metric(before.raw, "agentbox_bytes_in_total"));
  EXPECT_GT(metric(after.raw, "agentbox_bytes_out_total"),
            metric(before.raw, "agentbox_bytes_out_total"));
  EXPECT_EQ(metric(after.raw, "agentbox_runner_connections"), 0);
}

TEST(OpsApi, TokensGuardEveryRouteButHealthz) {
  Daemon d({"--token", "s3cret", "--token", "other-token"});
  Api none(d);
  Api wrong(d, "s3cret-not");
  Api right(d, "s3cret");
  Api second(d, "other-token");

  auto r = none.get("/v1/sessions");
  EXPECT_EQ(r.status, 401) << r;
  EXPECT_EQ(r.code(), "EUNAUTHORIZED");
  EXPECT_EQ(wrong.get("/v1/sessions").status, 401);
  EXPECT_EQ(right.get("/v1/sessions").status, 200);
  EXPECT_EQ(second.get("/v1/sessions").status, 200);
  // Every route, even unknown ones, says 401 before anything else.
  EXPECT_EQ(none.post("/v1/sessions", {{"id", "x"}}).status, 401);
  EXPECT_EQ(none.post("/exec", {{"command", "true"}, {"agent_id", "a"}}).status, 401);
  EXPECT_EQ(none.get("/metrics").status, 401);
  EXPECT_EQ(none.get("/readyz").status, 401);
  EXPECT_EQ(none.get("/no/such/route").status, 401);
  EXPECT_EQ(none.put(files_target("x", "f"), std::string(100000, 'x')).status, 401);
  EXPECT_EQ(none.get("/healthz").status, 200);
  EXPECT_EQ(right.get("/v1/sessions/x").status, 404);  // nothing was created
  // The token is never written to the log.
  EXPECT_EQ(d.log().find("s3cret"), std::string::npos);
}

TEST(OpsApi, UnknownRouteIs404AndWrongMethodIs405) {
  Daemon d;
  Api api(d);
  for (const std::string path :
       {"/", "/v2/sessions", "/v1/sessions/x/nope", "/v1/sessions/", "/exec/extra"}) {
    auto r = api.get(path);
    EXPECT_EQ(r.status, 404) << path << ": " << r;
    EXPECT_EQ(r.code(), "ENOENT") << path;
  }
  auto r = api.call("PATCH", "/v1/sessions");
  EXPECT_EQ(r.status, 405) << r;
  EXPECT_EQ(r.code(), "EINVAL");
  EXPECT_NE(r.headers["allow"].find("POST"), std::string::npos);
  EXPECT_EQ(api.get("/exec").status, 405);
  EXPECT_EQ(api.call("POST", "/healthz").status, 405);
  EXPECT_EQ(api.call("PUT", "/v1/sessions/x/stat?path=a").status, 405);
}

TEST(OpsApi, OversizedBodiesAndHeadersAre413AndTheDaemonKeepsServing) {
  Daemon d;
  Api api(d);
  std::string big = R"({"id":"x","labels":{"k":")" + std::string(2u << 20, 'a') + R"("}})";
  auto r = api.call("POST", "/v1/sessions", big);
  EXPECT_EQ(r.status, 413) << r;
  EXPECT_EQ(r.code(), "ETOOBIG");
  // Exec bodies carry stdin: their cap is higher (24 MiB), but a cap still.
  auto exec = api.call("POST", "/v1/sessions/x/exec",
                       R"({"command":"true","stdin":")" + std::string(25u << 20, 'a') + "\"}");
  EXPECT_EQ(exec.status, 413) << exec;
  EXPECT_EQ(exec.code(), "ETOOBIG");

  RawConnection raw(d.host_port());
  raw.send("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(16384, 'h') + "\r\n\r\n");
  std::string reply = raw.read_response();
  EXPECT_EQ(http_status_of(reply), 413) << reply.substr(0, 200);

  // Chunked JSON over the cap is caught while it streams.
  RawConnection chunked(d.host_port());
  chunked.send("POST /v1/sessions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  std::string piece(256u << 10, ' ');
  char size_line[32];
  snprintf(size_line, sizeof size_line, "%zx\r\n", piece.size());
  for (int i = 0; i < 8; ++i) {
    if (!chunked.send(std::string(size_line) + piece + "\r\n")) break;
  }
  std::string creply = chunked.read_response();
  EXPECT_EQ(http_status_of(creply), 413) << creply.substr(0, 200);

  EXPECT_EQ(api.get("/healthz").status, 200);
  EXPECT_EQ(api.get("/v1/sessions/x").status, 404);
}

TEST(OpsApi, MalformedHttpIs400AndOtherClientsAreUnaffected) {
  Daemon d;
  for (const std::string& junk :
       {std::string("GARBAGE\r\n\r\n"), std::string("GET / HTTP/9.9\r\n\r\n"),
        std::string("GET /healthz HTTP/1.1\r\nContent-Length: abc\r\n\r\n"),
        std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11)}) {
    RawConnection raw(d.host_port());
    raw.send(junk);
    std::string reply = raw.read_until_close(std::chrono::seconds(10));
    int status = http_status_of(reply);
    EXPECT_TRUE((status >= 400 && status < 500) || status == -1)
        << junk << " -> " << reply.substr(0, 200);
  }
  {
    RawConnection half(d.host_port());  // a client that stops mid-header
    half.send("POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Le");
  }
  {
    RawConnection body_cut(d.host_port());  // and one that stops mid-body
    body_cut.send("POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"id\":");
  }
  Api api(d);
  EXPECT_EQ(api.get("/healthz").status, 200);
  EXPECT_EQ(api.post("/v1/sessions", {{"id", "fine"}}).status, 201);
  // No input made it answer 500 or crash.
  EXPECT_TRUE(d.running());
  EXPECT_EQ(d.log().find("-> 500"), std::string::npos) << d.log();
}

TEST(OpsApi, KeepAliveServesManyRequestsOnOneConnection) {
  Daemon d;
  RawConnection raw(d.host_port());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(raw.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
    std::string reply = raw.read_response();
    ASSERT_EQ(http_status_of(reply), 200) << i;
    EXPECT_TRUE(reply.ends_with("}")) << reply;
    EXPECT_NE(reply.find("\"live\":true"), std::string::npos) << reply;
  }
  // Pipelined requests are answered in order.
  ASSERT_TRUE(
      raw.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(http_status_of(raw.read_response()), 200);
  EXPECT_EQ(http_status_of(raw.read_response()), 404);
}

TEST(OpsApi, NonLoopbackListenNeedsAToken) {
  char tmpl[] = "/tmp/agentbox-it-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::string out;
  int rc = Daemon::run_to_exit({"--listen", "0.0.0.0:0", "--data-dir", dir + "/data"}, &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("token"), std::string::npos) << out;
  rc = Daemon::run_to_exit({"--listen", "nonsense", "--data-dir", dir + "/data"}, &out);
  EXPECT_EQ(rc, 2) << out;
  rc = Daemon::run_to_exit({"--backend", "no-such-backend", "--data-dir", dir + "/data"}, &out);
  EXPECT_EQ(rc, 2) << out;
  rc = Daemon::run_to_exit({"--no-such-flag"}, &out);
  EXPECT_NE(rc, 0) << out;
  rc = Daemon::run_to_exit({"--help"}, &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("--shared-dirs"), std::string::npos) << out;
  std::filesystem::remove_all(dir);

  // With a token it starts, and answers with auth on.
  Daemon exposed({"--listen", "0.0.0.0:0", "--token", "t0ken"});
  EXPECT_EQ(Api(exposed, "t0ken").get("/v1/sessions").status, 200);
  EXPECT_EQ(Api(exposed).get("/v1/sessions").status, 401);
}

TEST(OpsApi, ConfigFileIsReadAndFlagsOverrideIt) {
  TempDir tmp("agentbox-cfg");  // removed however the test ends
  const std::string dir = tmp.path();
  std::string file = dir + "/agentboxd.yaml";
  std::ofstream(file) << "listen: 127.0.0.1:0\n"
                         "backend: host\n"
                         "tokens: [from-file]\n"
                         "max_file_mb: 1\n"
                         "log_level: debug\n";
  {
    Daemon d({"--config", file});
    EXPECT_EQ(Api(d, "from-file").get("/v1/sessions").status, 200);
    EXPECT_EQ(Api(d).get("/v1/sessions").status, 401);
    Api api(d, "from-file");
    api.create("c");
    EXPECT_EQ(api.put(files_target("c", "f"), std::string((1u << 20) + 10, 'x')).status, 413);
  }
  {
    Daemon d({"--config", file, "--token", "from-flag", "--max-file-mb", "2"});
    EXPECT_EQ(Api(d, "from-flag").get("/v1/sessions").status, 200);
    EXPECT_EQ(Api(d, "from-file").get("/v1/sessions").status, 401);
    Api api(d, "from-flag");
    api.create("c");
    EXPECT_EQ(api.put(files_target("c", "f"), std::string((1u << 20) + 10, 'x')).status, 200);
  }
  std::ofstream(file) << "listen: [unclosed\n";
  std::string out;
  EXPECT_EQ(Daemon::run_to_exit({"--config", file}, &out), 2) << out;
}

TEST(OpsApi, SigtermKillsRunningCommandsAndExitsZero) {
  Daemon d;
  Api api(d);
  api.create("busy");
  std::thread runner([&] {
    Api a(d);
    // Either a reply (the killed command's result) or a closed connection is fine; what
    // matters is that the command dies and the daemon exits cleanly.
    (void)a.client().request(
        "POST", "/v1/sessions/busy/exec",
        json{{"command", "echo $$ > busy.pid; sleep 60"}, {"timeout_sec", 600}}.dump());
  });
  pid_t pid = 0;
  ASSERT_TRUE(eventually([&] {
    auto r = api.get(files_target("busy", "busy.pid"));
    if (r.status == 200) pid = static_cast<pid_t>(std::stol(r.raw));
    return pid > 0;
  }));
  ASSERT_TRUE(process_alive(pid));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(d.stop(SIGTERM), 0) << d.log();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(14));
  runner.join();
  EXPECT_TRUE(eventually([&] { return !process_alive(pid); }, 5)) << "command outlived daemon";
  EXPECT_FALSE(d.running());
}

TEST(OpsApi, ReadyFileAndStartupMessage) {
  Daemon d;
  EXPECT_NE(d.host_port().find("127.0.0.1:"), std::string::npos);
  EXPECT_NE(d.log().find("curl"), std::string::npos) << d.log();
  EXPECT_NE(d.log().find(d.host_port()), std::string::npos) << d.log();
  EXPECT_EQ(d.stop(SIGINT), 0);
}

// Issue 3, "Backend choice": ns is the default; when it cannot run, the daemon refuses to start
// and names what is missing, unless the operator explicitly asks for no isolation. Never a
// silent fallback. Here ns is made unusable by running a copy of agentboxd that has no
// agentbox-init beside it.
TEST(OpsApi, NoSilentFallbackWhenTheNsBackendCannotRun) {
  char tmpl[] = "/tmp/agentbox-noinit-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::filesystem::copy_file(Daemon::binary(), dir + "/agentboxd");
  auto run = [&](const std::string& args) {
    std::string cmd = "cd " + dir +
                      " && timeout --preserve-status -s TERM 3 ./agentboxd --listen 127.0.0.1:0 " +
                      "--data-dir " + dir + "/data " + args + " 2>&1; echo \"rc=$?\"";
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    ::pclose(p);
    return out;
  };
  for (const char* args : {"", "--backend ns"}) {
    std::string out = run(args);
    EXPECT_NE(out.find("rc=1\n"), std::string::npos) << args << ": " << out;
    EXPECT_NE(out.find("cannot run on this host"), std::string::npos) << out;
    EXPECT_NE(out.find("agentbox-init"), std::string::npos)
        << "does not name what is missing: " << out;
    EXPECT_NE(out.find("--backend host"), std::string::npos) << "no way out offered: " << out;
    EXPECT_EQ(out.find("listening on"), std::string::npos) << out;
  }
  // Explicitly without isolation it serves (and stops cleanly on the SIGTERM of `timeout`).
  std::string out = run("--backend host");
  EXPECT_NE(out.find("listening on"), std::string::npos) << out;
  EXPECT_NE(out.find("rc=0\n"), std::string::npos) << out;
  // --check-backend reports the same, for scripts.
  out = run("--check-backend ns");
  EXPECT_NE(out.find("rc=1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("agentbox-init"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace agentbox::testing
