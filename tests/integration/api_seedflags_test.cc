// agentboxd as a drop-in for seed 001's toolbox-server: started with exactly the seed's command
// line (--port P --workdir D --multi-agent --shell /bin/bash --shared-dirs ... --toolchain-path
// ...) and driven with the seed client's JSON only.

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;

// A port nobody listens on right now (bound to :0, read back, closed).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Temp dirs for --workdir and the shared templates, made before the daemon starts.
struct SeedDirs {
  SeedDirs() {
    char tmpl[] = "/tmp/agentbox-seedflags-XXXXXX";
    root = mkdtemp(tmpl);
    workdir = root + "/workspace";  // made by the daemon
    shared = root + "/templates";
    fs::create_directories(shared + "/style");
    std::ofstream(shared + "/style/styles.json") << R"({"color":"red"})";
  }
  ~SeedDirs() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  std::string root, workdir, shared;
};

class SeedFlags : public ::testing::Test {
 protected:
  SeedDirs dirs_;
  int port_ = free_port();
  Daemon daemon_{{"--port", std::to_string(port_), "--workdir", dirs_.workdir, "--multi-agent",
                  "--shell", "/bin/bash", "--shared-dirs", "site-templates:" + dirs_.shared,
                  "--toolchain-path", "/opt/toolchain/bin"}};
  Api api_{daemon_};
  const std::string agent_ = "engineer-acme_12345";

  // The seed client's /exec body (RemoteExecutor): env, cgroup, and artifact_dir as the host path.
  json seed_exec(const std::string& command) const {
    return {{"command", command},
            {"timeout_sec", 120},
            {"max_output_bytes", 131072},
            {"env", {{"AGENT_ID", agent_}, {"AGENT_WORKSPACE", "/mnt/workspace/" + agent_}}},
            {"cgroup", {{"memory_mb", 512}, {"cpu_percent", 100}, {"max_pids", 256}}},
            {"artifact_dir", "/mnt/workspace/" + agent_ + "/"}};
  }
};

TEST_F(SeedFlags, TheSeedCommandLineServesTheSeedClient) {
  ASSERT_GT(port_, 0);
  EXPECT_EQ(daemon_.host_port(), "127.0.0.1:" + std::to_string(port_));
  // The seed's trust model (no token on all interfaces) is allowed only loudly.
  EXPECT_NE(daemon_.log().find("WITHOUT a token"), std::string::npos) << daemon_.log();
  EXPECT_EQ(api_.get("/healthz").status, 200);

  // exec: bash runs the command, the toolchain is first in PATH after seed 004's venv and
  // node_modules bins, the box is isolated (its own
  // /workspace), and the artifact comes back under the host path the client sent.
  auto r = api_.post("/exec", seed_exec("echo \"bash=$BASH_VERSION\"; echo \"path=$PATH\"; "
                                        "pwd; printf png > /workspace/cat.png"));
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["exit_code"], 0) << r;
  std::string out = r.body["stdout"];
  EXPECT_NE(out.find("bash=5"), std::string::npos) << out;  // bookworm's bash is 5.x
  EXPECT_NE(out.find("path=/workspace/.venv/bin:/workspace/node_modules/.bin:/opt/toolchain/bin:"
                     "/usr/"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("\n/workspace\n"), std::string::npos) << out;
  ASSERT_EQ(r.body["artifacts"].size(), 1u) << r;
  EXPECT_EQ(r.body["artifacts"][0]["path"], "/mnt/workspace/" + agent_ + "/cat.png");
  EXPECT_EQ(r.body["artifacts"][0]["size"], 3);

  // The workspace is {workdir}/{agent_id} on the host.
  EXPECT_EQ(read_host_file(dirs_.workdir + "/" + agent_ + "/cat.png"), "png");
  EXPECT_FALSE(fs::exists(daemon_.data_dir() + "/workspaces/" + agent_));

  // The same exec once more (the client sends its cgroup every time), artifact_dir given as
  // this daemon's own host path of the workspace.
  json again = seed_exec("mkdir -p out && printf abcd > out/r.txt");
  again["artifact_dir"] = dirs_.workdir + "/" + agent_ + "/out";
  auto r2 = api_.post("/exec", again);
  ASSERT_EQ(r2.status, 200) << r2;
  ASSERT_EQ(r2.body["artifacts"].size(), 1u) << r2;
  EXPECT_EQ(r2.body["artifacts"][0]["path"], dirs_.workdir + "/" + agent_ + "/out/r.txt");

  // exec-stream: lines, then the exit line; bash again.
  std::string all;
  auto s = api_.client().request_stream(
      "POST", "/exec-stream",
      json{{"command", "echo \"$0\"; echo \"${BASH_VERSINFO[0]}\""},
           {"env", {{"AGENT_ID", agent_}}}}
          .dump(),
      [&](std::string_view c) {
        all.append(c);
        return true;
      });
  ASSERT_TRUE(s.has_value()) << s.error().message;
  ASSERT_EQ(s->status, 200) << s->body;
  EXPECT_NE(all.find(R"("line":"/bin/bash")"), std::string::npos) << all;
  EXPECT_NE(all.find(R"("line":"5")"), std::string::npos) << all;
  EXPECT_NE(all.find(R"("exit_code":0)"), std::string::npos) << all;

  // write, then read back; and the shared prefix.
  auto w = api_.post("/workspace/write", {{"agent_id", agent_},
                                          {"path", "repos/site/index.html"},
                                          {"content", "<!doctype html>"}});
  ASSERT_EQ(w.status, 200) << w;
  EXPECT_EQ(w.body["bytes_written"], 15);
  EXPECT_EQ(read_host_file(dirs_.workdir + "/" + agent_ + "/repos/site/index.html"), "<!doctype html>");
  auto rd = api_.post("/workspace/read", {{"agent_id", agent_}, {"path", "repos/site/index.html"}});
  ASSERT_EQ(rd.status, 200) << rd;
  EXPECT_EQ(rd.body["content"], "<!doctype html>");
  auto sh = api_.post("/workspace/read",
                      {{"agent_id", agent_}, {"path", "site-templates/style/styles.json"}});
  ASSERT_EQ(sh.status, 200) << sh;
  EXPECT_EQ(sh.body["content"], R"({"color":"red"})");
  EXPECT_EQ(sh.body["size"], 15);
}

// /opt (the toolchains) is in every box, read-only.
TEST_F(SeedFlags, OptIsVisibleReadOnly) {
  if (!fs::is_directory("/opt")) GTEST_SKIP() << "no /opt on this host";
  std::string first;
  for (const auto& e : fs::directory_iterator("/opt")) {
    first = e.path().filename().string();
    break;
  }
  auto r = api_.post("/exec", seed_exec("ls /opt; awk '$2 == \"/opt\" {print $4}' /proc/self/mounts"));
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["exit_code"], 0) << r;
  std::string out = r.body["stdout"];
  if (!first.empty()) {
    EXPECT_NE(out.find(first + "\n"), std::string::npos) << out;
  }
  EXPECT_NE(out.find("ro,"), std::string::npos) << out;
}

// /workspace/read and /workspace/write reach the agent's workspace and the --shared-dirs
// prefixes only, as the seed describes them: not the box's /etc or /tmp.
TEST_F(SeedFlags, ReadAndWriteStayInTheWorkspaceAndTheSharedDirs) {
  auto w = api_.post("/workspace/write",
                     {{"agent_id", agent_}, {"path", "notes/a.txt"}, {"content", "mine"}});
  ASSERT_EQ(w.status, 200) << w;
  auto made = api_.post("/exec", seed_exec("echo secret > /tmp/x"));
  ASSERT_EQ(made.body["exit_code"], 0) << made;
  for (const std::string& path : {std::string("notes/a.txt"), std::string("/workspace/notes/a.txt"),
                                  std::string("notes/../notes/a.txt")}) {
    auto r = api_.post("/workspace/read", {{"agent_id", agent_}, {"path", path}});
    EXPECT_EQ(r.status, 200) << path << r;
    EXPECT_EQ(r.body.value("content", ""), "mine") << path;
  }
  for (const std::string& path : {std::string("/etc/passwd"), std::string("/tmp/x"),
                                  std::string("/workspace/../etc/passwd"),
                                  "../" + agent_ + "/notes/a.txt", std::string("/workspace2/a")}) {
    auto r = api_.post("/workspace/read", {{"agent_id", agent_}, {"path", path}});
    EXPECT_EQ(r.status, 403) << path << r;
    EXPECT_EQ(r.body.dump().find("secret"), std::string::npos) << path;
    auto wr =
        api_.post("/workspace/write", {{"agent_id", agent_}, {"path", path}, {"content", "x"}});
    EXPECT_EQ(wr.status, 403) << path << wr;
  }
  auto tmp = api_.post("/exec", seed_exec("cat /tmp/x; ls /etc/x /tmp/y 2>/dev/null"));
  EXPECT_EQ(tmp.body["stdout"], "secret\n") << "nothing was written outside the workspace";
  auto sh = api_.post("/workspace/read",
                      {{"agent_id", agent_}, {"path", "site-templates/style/styles.json"}});
  EXPECT_EQ(sh.status, 200) << sh;
}

// --shell sets the shell of every string command: seed 001's /exec and /v1's exec alike.
TEST_F(SeedFlags, TheShellRunsV1CommandsToo) {
  auto seed = api_.post("/exec", seed_exec("echo \"[$BASH_VERSION]\""));
  EXPECT_EQ(seed.body.value("stdout", "").rfind("[5", 0), 0u) << seed;
  auto v1 = api_.exec(agent_, {{"command", "echo \"[$BASH_VERSION]\""}});
  ASSERT_EQ(v1.status, 200) << v1;
  EXPECT_EQ(v1.body.value("stdout", "").rfind("[5", 0), 0u) << v1;
  // argv is run as given, never through the shell.
  auto argv = api_.exec(agent_, {{"argv", {"/bin/sh", "-c", "echo \"[$BASH_VERSION]\""}}});
  EXPECT_EQ(argv.body.value("stdout", ""), "[]\n") << argv;
}

// Without --shell, /v1 keeps /bin/sh; the config's `shell` sets it as the flag does.
TEST(SeedFlagsShell, V1KeepsShUnlessAShellIsGiven) {
  Daemon plain;
  Api api(plain);
  api.create("s");
  EXPECT_EQ(api.sh("s", "echo \"[$BASH_VERSION]\"").body.value("stdout", ""), "[]\n");
  TempDir dir("agentbox-shell-cfg");
  std::ofstream(dir / "c.yaml") << "shell: /bin/bash\n";
  Daemon bash({"--config", dir / "c.yaml"});
  Api api2(bash);
  api2.create("s");
  auto r = api2.sh("s", "echo \"[$BASH_VERSION]\"");
  EXPECT_EQ(r.body.value("stdout", "").rfind("[5", 0), 0u) << r;
}

// Old command lines give --shared-readonly a path, with or without '=': accepted, a no-op, and
// the log says it is deprecated.
TEST(SeedFlagsSharedReadonly, TheValueFormsAreAcceptedWithADeprecationLine) {
  for (const std::vector<std::string>& form :
       {std::vector<std::string>{"--shared-readonly", "/mnt/shared-readonly"},
        std::vector<std::string>{"--shared-readonly=/mnt/shared-readonly"},
        std::vector<std::string>{"--shared-readonly"}}) {
    std::vector<std::string> args = {"--multi-agent", "--token", "t"};
    args.insert(args.end(), form.begin(), form.end());
    Daemon d(args);
    EXPECT_NE(d.log().find("--shared-readonly"), std::string::npos) << d.log();
    EXPECT_NE(d.log().find("deprecated"), std::string::npos) << d.log();
    Api api(d, "t");
    EXPECT_EQ(api.get("/v1/sessions").status, 200);
  }
}

// The seed's /mnt/shared-readonly is seen read-only in every --multi-agent box when the host
// has it (made here for the test when the host has none, and removed again).
TEST(SeedFlagsSharedReadonly, TheHostsSharedReadonlyIsSeenReadOnly) {
  const std::string dir = "/mnt/shared-readonly";
  std::error_code ec;
  if (!fs::is_directory("/mnt", ec)) GTEST_SKIP() << "no /mnt on this host";
  const bool made = !fs::exists(dir, ec);
  if (made) {
    ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  }
  struct Remove {
    bool made;
    std::string dir;
    ~Remove() {
      if (made) ::rmdir(dir.c_str());
    }
  } remove{made, dir};
  {
    Daemon d({"--multi-agent", "--token", "t"});
    Api api(d, "t");
    api.create("a");
    auto r = api.sh("a", "test -d " + dir + " && awk '$2 == \"" + dir +
                             "\" {print $4}' /proc/self/mounts | grep -q '^ro,' && echo ro; "
                             "touch " +
                             dir + "/x 2>/dev/null || echo refused");
    EXPECT_EQ(r.body.value("stdout", ""), "ro\nrefused\n") << r;
    EXPECT_EQ(api.del("/v1/sessions/a").status, 200);
  }
  EXPECT_FALSE(fs::exists(dir + "/x"));
}

// What the seed command line refuses, each exit 2 naming the flag.
TEST(SeedFlagsRefused, BadValuesExitTwoNamingTheFlag) {
  std::string out;
  EXPECT_EQ(Daemon::run_to_exit({"--port", "70000", "--multi-agent"}, &out), 2);
  EXPECT_NE(out.find("--port"), std::string::npos) << out;
  EXPECT_EQ(Daemon::run_to_exit({"--port", "9", "--backend", "ns"}, &out), 2);
  EXPECT_NE(out.find("--multi-agent"), std::string::npos) << out;
  EXPECT_EQ(Daemon::run_to_exit({"--port", "9", "--multi-agent", "--shell", "/nonexistent/sh"},
                                &out),
            2);
  EXPECT_NE(out.find("--shell"), std::string::npos) << out;
  // A --toolchain-path host dir the isolated boxes would not see: refused naming readonly_dirs.
  TempDir dir("agentbox-toolchain");
  fs::create_directories(dir / "bin");
  EXPECT_EQ(Daemon::run_to_exit({"--multi-agent", "--token", "t", "--listen", "127.0.0.1:0",
                                 "--data-dir", dir / "data", "--toolchain-path", dir / "bin"},
                                &out),
            2);
  EXPECT_NE(out.find("readonly_dirs"), std::string::npos) << out;
  EXPECT_NE(out.find(dir / "bin"), std::string::npos) << out;
}

}  // namespace
}  // namespace agentbox::testing
