// The agentbox CLI end to end: the real binary ($AGENTBOX_BIN_DIR/agentbox) as a subprocess
// against the real daemon (host backend, port 0, temp data dir). Asserts what a person at a
// terminal sees: stdout, stderr, exit codes, and the bytes that land in the workspace.

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "integration/daemon.h"

namespace agentbox {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

extern "C" char** environ;

std::string cli_binary() {
  const char* dir = std::getenv("AGENTBOX_BIN_DIR");
  return std::string(dir && *dir ? dir : "build/bin") + "/agentbox";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

std::string random_bytes(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (std::size_t i = 0; i < n; i += 8) {
    std::uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<std::size_t>(8, n - i));
  }
  return out;
}

// One run of the CLI: its own stdin, stdout and stderr pipes, and an environment with the
// caller's AGENTBOX_* variables replaced by `env`.
class CliProcess {
 public:
  CliProcess(const std::vector<std::string>& args, const std::vector<std::string>& env,
             std::string stdin_data) {
    std::vector<std::string> argv = {cli_binary()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> envv;
    for (char** e = environ; *e; ++e) {
      if (std::strncmp(*e, "AGENTBOX_URL=", 13) != 0 && std::strncmp(*e, "AGENTBOX_TOKEN=", 15)) {
        envv.emplace_back(*e);
      }
    }
    envv.insert(envv.end(), env.begin(), env.end());
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : envv) cenv.push_back(e.data());
    cenv.push_back(nullptr);

    int in[2], out[2], err[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC)) {
      throw std::runtime_error("pipe2 failed");
    }
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execve(cargv[0], cargv.data(), cenv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    stdin_ = UniqueFd(in[1]);
    stdout_ = UniqueFd(out[0]);
    stderr_ = UniqueFd(err[0]);
    // Small inputs are written at once; big ones by a thread so the child can drain them.
    writer_ = std::thread([fd = std::move(stdin_), data = std::move(stdin_data)]() mutable {
      std::string_view rest = data;
      signal(SIGPIPE, SIG_IGN);
      while (!rest.empty()) {
        ssize_t n = write(fd.get(), rest.data(), rest.size());
        if (n <= 0) break;
        rest.remove_prefix(static_cast<std::size_t>(n));
      }
    });
  }
  ~CliProcess() {
    if (pid_ > 0 && !status_) {
      kill(pid_, SIGKILL);
      wait();
    }
    if (writer_.joinable()) writer_.join();
  }

  // Reads whatever is available on stdout/stderr, waiting up to `ms`. False once both closed.
  bool pump(int ms) {
    pollfd fds[2] = {{stdout_.get(), POLLIN, 0}, {stderr_.get(), POLLIN, 0}};
    int nfds = 0;
    for (auto& p : fds) {
      if (p.fd >= 0)
        ++nfds;
      else
        p.events = 0;
    }
    if (nfds == 0) return false;
    if (poll(fds, 2, ms) <= 0) return true;
    char buf[65536];
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        (i == 0 ? out_ : err_).append(buf, static_cast<std::size_t>(n));
      } else {
        (i == 0 ? stdout_ : stderr_).reset();
      }
    }
    return true;
  }

  // Pumps until stdout contains `needle` (true) or the deadline passes / output ends (false).
  bool wait_for_stdout(const std::string& needle, std::chrono::seconds limit) {
    auto deadline = Clock::now() + limit;
    while (out_.find(needle) == std::string::npos) {
      if (Clock::now() > deadline || !pump(100)) return out_.find(needle) != std::string::npos;
    }
    return true;
  }

  bool running() {
    if (status_) return false;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return false;
    }
    return true;
  }

  // Drains the output and returns the exit status (the test fails after 120 s).
  int wait() {
    auto deadline = Clock::now() + std::chrono::seconds(120);
    while (pump(100)) {
      if (Clock::now() > deadline) {
        ADD_FAILURE() << "agentbox did not finish in time";
        kill(pid_, SIGKILL);
        break;
      }
    }
    if (!status_) {
      int st = 0;
      waitpid(pid_, &st, 0);
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    return *status_;
  }

  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  UniqueFd stdin_, stdout_, stderr_;
  std::thread writer_;
  std::string out_, err_;
};

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

std::ostream& operator<<(std::ostream& os, const CliRun& r) {
  return os << "exit " << r.code << "\n--- stdout:\n"
            << r.out.substr(0, 2000) << "\n--- stderr:\n"
            << r.err.substr(0, 2000);
}

// `agentbox --server <d> args...`, run to its end.
CliRun run_cli(const Daemon& d, std::vector<std::string> args) {
  args.insert(args.begin(), {"--server", d.url()});
  CliProcess p(args, {}, "");
  CliRun r;
  r.code = p.wait();
  r.out = p.out();
  r.err = p.err();
  return r;
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { daemon_ = new Daemon(); }
  static void TearDownTestSuite() {
    delete daemon_;
    daemon_ = nullptr;
  }

  // Runs `agentbox --server URL args...` to completion.
  static CliRun cli(const std::vector<std::string>& args, std::string stdin_data = {},
                    std::vector<std::string> env = {}) {
    std::vector<std::string> full = {"--server", daemon_->url()};
    full.insert(full.end(), args.begin(), args.end());
    CliProcess p(full, env, std::move(stdin_data));
    CliRun r;
    r.code = p.wait();
    r.out = p.out();
    r.err = p.err();
    return r;
  }

  static std::string workspace(const std::string& id) {
    return daemon_->data_dir() + "/workspaces/" + id;
  }
  std::string local_dir() {
    std::string d = daemon_->temp_dir() + "/local-" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(d);
    return d;
  }

  static Daemon* daemon_;
};

Daemon* CliTest::daemon_ = nullptr;

TEST_F(CliTest, SessionCreateLsShowRm) {
  CliRun c = cli({"session", "create", "cli-s1", "--label", "team=a", "--env", "FOO=bar",
                  "--memory-mb", "256"});
  ASSERT_EQ(c.code, 0) << c;
  json j = json::parse(c.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << c;
  EXPECT_EQ(j["id"], "cli-s1");
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["labels"]["team"], "a");
  EXPECT_EQ(j["limits"]["memory_mb"], 256);
  EXPECT_TRUE(fs::is_directory(workspace("cli-s1")));

  // Idempotent: the same id again is the same session.
  CliRun again = cli({"session", "create", "cli-s1", "-q"});
  ASSERT_EQ(again.code, 0) << again;
  EXPECT_EQ(again.out, "cli-s1\n");

  CliRun ls = cli({"session", "ls"});
  ASSERT_EQ(ls.code, 0) << ls;
  std::istringstream lines(ls.out);
  std::string header, row;
  std::getline(lines, header);
  for (const char* col : {"ID", "STATE", "BACKEND", "UID", "AGE", "IDLE", "TTL", "LABELS"}) {
    EXPECT_NE(header.find(col), std::string::npos) << header;
  }
  bool found = false;
  while (std::getline(lines, row)) {
    if (row.rfind("cli-s1 ", 0) == 0) {
      found = true;
      EXPECT_NE(row.find("running"), std::string::npos) << row;
      EXPECT_NE(row.find("host"), std::string::npos) << row;
      EXPECT_NE(row.find("team=a"), std::string::npos) << row;
    }
  }
  EXPECT_TRUE(found) << ls;

  CliRun show = cli({"session", "show", "cli-s1"});
  ASSERT_EQ(show.code, 0) << show;
  EXPECT_EQ(json::parse(show.out, nullptr, false)["id"], "cli-s1") << show;

  CliRun rm = cli({"session", "rm", "cli-s1"});
  ASSERT_EQ(rm.code, 0) << rm;
  EXPECT_FALSE(fs::exists(workspace("cli-s1")));
  CliRun gone = cli({"session", "show", "cli-s1"});
  EXPECT_EQ(gone.code, 3) << gone;  // not found
  EXPECT_EQ(gone.err.rfind("agentbox: ENOENT: ", 0), 0u) << gone;
  EXPECT_NE(gone.err.find("cli-s1"), std::string::npos) << gone;
  EXPECT_TRUE(gone.out.empty());
}

TEST_F(CliTest, SessionSuspendResumeKeepaliveTtlMountsAndSkills) {
  CliRun c = cli({"session", "create", "cli-life", "--ttl", "600", "--label", "k=v", "-q"});
  ASSERT_EQ(c.code, 0) << c;
  ASSERT_EQ(cli({"exec", "cli-life", "--", "sh", "-c", "echo kept > kept.txt"}).code, 0);
  CliRun s = cli({"session", "suspend", "cli-life"});
  ASSERT_EQ(s.code, 0) << s;
  EXPECT_EQ(s.out, "cli-life suspended\n");
  CliRun ls = cli({"session", "ls"});
  bool found = false;
  std::istringstream lines(ls.out);
  for (std::string row; std::getline(lines, row);) {
    if (row.rfind("cli-life ", 0) != 0) continue;
    found = true;
    EXPECT_NE(row.find("suspended"), std::string::npos) << row;
    EXPECT_NE(row.find(" 600 "), std::string::npos) << row;  // TTL
    EXPECT_NE(row.find("k=v"), std::string::npos) << row;
    // Age and idle of a fresh session are a few seconds, in seconds (the clock ticks in whole
    // seconds, so a slow machine may already show 1s or 2s).
    std::istringstream cols(row);
    int seconds_columns = 0;
    for (std::string col; cols >> col;) {
      if (col.size() < 2 || col.back() != 's') continue;
      const std::string digits = col.substr(0, col.size() - 1);
      if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
      EXPECT_LT(std::stoi(digits), 60) << row;
      ++seconds_columns;
    }
    EXPECT_EQ(seconds_columns, 2) << row;
  }
  EXPECT_TRUE(found) << ls;
  CliRun k = cli({"session", "keepalive", "cli-life"});
  ASSERT_EQ(k.code, 0) << k;
  EXPECT_EQ(k.out, "cli-life suspended\n");
  CliRun r = cli({"session", "resume", "cli-life"});
  ASSERT_EQ(r.code, 0) << r;
  EXPECT_EQ(r.out, "cli-life running\n");
  CliRun cat = cli({"cat", "cli-life:kept.txt"});
  EXPECT_EQ(cat.out, "kept\n") << cat;
  CliRun missing = cli({"session", "suspend", "cli-nobody"});
  EXPECT_EQ(missing.code, 3) << missing;
  EXPECT_EQ(missing.err.rfind("agentbox: ENOENT: ", 0), 0u) << missing;

  // --mount and --skill reach the server, which names the refused field (this daemon allows
  // no host mounts); a malformed --mount is a usage error.
  CliRun m = cli({"session", "create", "cli-m", "--mount", daemon_->temp_dir() + ":/data:ro"});
  EXPECT_EQ(m.code, 8) << m;  // permission denied
  EXPECT_NE(m.err.find("EACCES"), std::string::npos) << m;
  EXPECT_NE(m.err.find("mounts[0].host_path"), std::string::npos) << m;
  CliRun sk = cli({"session", "create", "cli-m", "--skill", "web=" + daemon_->temp_dir()});
  EXPECT_EQ(sk.code, 8) << sk;
  EXPECT_NE(sk.err.find("skills.web"), std::string::npos) << sk;
  EXPECT_EQ(cli({"session", "create", "cli-m", "--mount", "/srv/data"}).code, 2);
  EXPECT_EQ(cli({"session", "create", "cli-m", "--mount", "/a:/b:rx"}).code, 2);
  EXPECT_EQ(cli({"session", "show", "cli-m"}).code, 3);
}

TEST_F(CliTest, SessionRmArchivePrintsThePathAndRestoreBringsItBack) {
  ASSERT_EQ(cli({"session", "create", "cli-arch", "-q"}).code, 0);
  ASSERT_EQ(cli({"exec", "cli-arch", "--", "sh", "-c", "echo kept > kept.txt"}).code, 0);
  CliRun rm = cli({"session", "rm", "--archive", "cli-arch"});
  ASSERT_EQ(rm.code, 0) << rm;
  ASSERT_FALSE(rm.out.empty()) << rm;
  std::string path = rm.out.substr(0, rm.out.size() - 1);  // one line: the path
  EXPECT_EQ(rm.out.back(), '\n');
  EXPECT_TRUE(fs::is_regular_file(path)) << path;
  EXPECT_FALSE(fs::exists(workspace("cli-arch")));

  CliRun restore = cli({"session", "restore", "cli-arch", path});
  ASSERT_EQ(restore.code, 0) << restore;
  EXPECT_EQ(json::parse(restore.out, nullptr, false)["id"], "cli-arch") << restore;
  CliRun cat = cli({"cat", "cli-arch:kept.txt"});
  EXPECT_EQ(cat.code, 0) << cat;
  EXPECT_EQ(cat.out, "kept\n");

  // Again onto the now existing session: EEXIST, exit 7 (conflict).
  CliRun again = cli({"session", "restore", "cli-arch", path});
  EXPECT_EQ(again.code, 7) << again;
  EXPECT_EQ(again.err.rfind("agentbox: EEXIST: ", 0), 0u) << again;
  // Usage: both arguments are required.
  EXPECT_EQ(cli({"session", "restore", "cli-arch"}).code, 2);
}

TEST_F(CliTest, SessionCreateFromScopeTemplate) {
  CliRun c = cli({"session", "create", "--scope", "{launcher_type}_{launcher_id}", "--var",
                  "launcher_type=group", "-q"});
  ASSERT_EQ(c.code, 0) << c;
  EXPECT_EQ(c.out, "group_unknown\n");
  EXPECT_EQ(cli({"session", "rm", "group_unknown"}).code, 0);
}

// `session create --network none|allowlist|open --allow DOMAIN... --cpu-time N --tmp-mb N
// --max-open-files N`: the session object shows what was asked; what the backend cannot give is
// ENOTSUP (exit 9), a bad combination a usage error (exit 2, nothing sent).
TEST(CliNetwork, SessionCreateNetworkAndMoreLimits) {
  Daemon d({"--backend", "ns", "--allow-backend", "host"});
  auto cli = [&d](std::vector<std::string> args) { return run_cli(d, std::move(args)); };
  CliRun c = cli({"session", "create", "cli-net", "--network", "allowlist", "--allow",
                  "example.org", "--allow", "*.example.net", "--cpu-time", "30", "--tmp-mb", "64",
                  "--max-open-files", "256"});
  ASSERT_EQ(c.code, 0) << c;
  json j = json::parse(c.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << c;
  EXPECT_EQ(j["backend"], "ns") << c;
  EXPECT_EQ(j["network"]["mode"], "allowlist") << c;
  EXPECT_EQ(j["network"]["allow"], json({"example.org", "*.example.net"})) << c;
  EXPECT_EQ(j["limits"]["cpu_time_sec"], 30) << c;
  EXPECT_EQ(j["limits"]["tmp_mb"], 64) << c;
  EXPECT_EQ(j["limits"]["max_open_files"], 256) << c;
  EXPECT_EQ(cli({"session", "rm", "cli-net"}).code, 0);
  // --allow alone is an allowlist; --network none is the default made explicit.
  CliRun a = cli({"session", "create", "cli-net2", "--allow", "example.org"});
  ASSERT_EQ(a.code, 0) << a;
  EXPECT_EQ(json::parse(a.out, nullptr, false)["network"]["mode"], "allowlist") << a;
  EXPECT_EQ(cli({"session", "rm", "cli-net2"}).code, 0);
  CliRun none = cli({"session", "create", "cli-net4", "--network", "none"});
  ASSERT_EQ(none.code, 0) << none;
  EXPECT_EQ(json::parse(none.out, nullptr, false)["network"]["mode"], "none") << none;
  EXPECT_EQ(cli({"session", "rm", "cli-net4"}).code, 0);
  // The host backend has no network namespace: "open" is not what it can give.
  CliRun open = cli({"session", "create", "cli-net3", "--backend", "host", "--network", "open"});
  EXPECT_EQ(open.code, 9) << open;
  EXPECT_EQ(open.err.rfind("agentbox: ENOTSUP: ", 0), 0u) << open;
  for (std::vector<std::string> args :
       {std::vector<std::string>{"session", "create", "x", "--network", "wide"},
        {"session", "create", "x", "--network", "open", "--allow", "a.test"},
        {"session", "create", "x", "--cpu-time", "soon"}}) {
    CliRun r = cli(args);
    EXPECT_EQ(r.code, 2) << ::testing::PrintToString(args) << "\n" << r;
  }
  EXPECT_EQ(cli({"session", "show", "x"}).code, 3);  // nothing was sent
}

TEST_F(CliTest, BadInputIsAnErrorOrAUsageError) {
  CliRun bad_id = cli({"session", "create", "no/slashes"});
  EXPECT_EQ(bad_id.code, 1) << bad_id;
  EXPECT_EQ(bad_id.err.rfind("agentbox: EINVAL: ", 0), 0u) << bad_id;

  // Usage errors exit 2 and never reach the server.
  for (std::vector<std::string> args : {std::vector<std::string>{"session", "create"},
                                        {"exec"},
                                        {"cp", "a", "b"},
                                        {"nosuchcommand"},
                                        {"cat", "nocolon"},
                                        {"session", "create", "x", "--var", "novalue"},
                                        {"exec", "s", "--timeout", "soon", "--", "true"}}) {
    CliRun r = cli(args);
    EXPECT_EQ(r.code, 2) << ::testing::PrintToString(args) << "\n" << r;
  }
  CliRun help = cli({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("exec"), std::string::npos);
  // The exit codes and the environment are documented where a user looks.
  for (const char* want : {"Exit codes", "  3   not found", "  4   auth", "  5   unreachable",
                           "  6   quota", "AGENTBOX_URL", "AGENTBOX_TOKEN", "WAIT_FOR_SIDECAR"}) {
    EXPECT_NE(help.out.find(want), std::string::npos) << want << "\n" << help.out;
  }
  for (const char* cmd : {"stat", "mv", "mkdir", "rm", "health", "repair", "wait"}) {
    EXPECT_NE(help.out.find("\n  " + std::string(cmd)), std::string::npos) << cmd;
  }
}

TEST_F(CliTest, ExecPropagatesExitCodeAndSplitsStreams) {
  CliRun r = cli({"exec", "cli-exec", "--", "sh", "-c", "echo out; echo err >&2; exit 3"});
  EXPECT_EQ(r.code, 3) << r;
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");

  CliRun ok = cli({"exec", "cli-exec", "--", "true"});
  EXPECT_EQ(ok.code, 0) << ok;
  CliRun missing = cli({"exec", "cli-exec", "--", "/no/such/binary"});
  EXPECT_EQ(missing.code, 127) << missing;
  CliRun sig = cli({"exec", "cli-exec", "--", "sh", "-c", "kill -TERM $$"});
  EXPECT_EQ(sig.code, 128 + SIGTERM) << sig;
  // Without "--" the command starts at the first word that is not an exec option; a "--"
  // after that belongs to the command.
  CliRun bare = cli({"exec", "cli-exec", "echo", "a", "--", "-b"});
  EXPECT_EQ(bare.code, 0) << bare;
  EXPECT_EQ(bare.out, "a -- -b\n");
  CliRun unknown = cli({"exec", "cli-exec", "--bogus", "--", "true"});
  EXPECT_EQ(unknown.code, 2) << unknown;
  CliRun shell = cli({"exec", "cli-exec", "-c", "echo $((6*7)) | tr 4 X"});
  EXPECT_EQ(shell.code, 0) << shell;
  EXPECT_EQ(shell.out, "X2\n");
}

TEST_F(CliTest, ExecEnvCwdStdinAndTimeout) {
  ASSERT_EQ(cli({"session", "create", "cli-env", "-q"}).code, 0);
  ASSERT_EQ(cli({"mkdir", "cli-env:/workspace/sub"}).code, 0);
  CliRun env = cli({"exec", "cli-env", "--env", "GREETING=hi there", "--cwd", "/workspace/sub",
                    "--", "sh", "-c", "echo \"$GREETING\"; basename \"$PWD\""});
  EXPECT_EQ(env.code, 0) << env;
  EXPECT_EQ(env.out, "hi there\nsub\n");

  CliRun in = cli({"exec", "cli-env", "-i", "--", "wc", "-c"}, std::string(1000, 'x'));
  EXPECT_EQ(in.code, 0) << in;
  EXPECT_EQ(in.out.substr(in.out.find_first_not_of(' ')), "1000\n");

  CliRun slow = cli({"exec", "cli-env", "--timeout", "1", "--", "sleep", "30"});
  EXPECT_EQ(slow.code, 124) << slow;
  EXPECT_NE(slow.err.find("ETIMEDOUT"), std::string::npos) << slow;
}

TEST_F(CliTest, ExecStreamsOutputLive) {
  // The command prints, then waits for a file the test creates only after it has seen that
  // output: it can only finish if the first line reached us while it was still running.
  ASSERT_EQ(cli({"session", "create", "cli-live", "-q"}).code, 0);
  std::vector<std::string> args = {
      "--server",
      daemon_->url(),
      "exec",
      "cli-live",
      "--",
      "sh",
      "-c",
      "echo first; echo to-stderr >&2; i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; "
      "i=$((i+1)); done; echo second"};
  CliProcess p(args, {}, "");
  ASSERT_TRUE(p.wait_for_stdout("first\n", std::chrono::seconds(60))) << p.err();
  EXPECT_TRUE(p.running());
  EXPECT_EQ(p.out().find("second"), std::string::npos);
  write_file(workspace("cli-live") + "/go", "");
  EXPECT_EQ(p.wait(), 0) << p.err();
  EXPECT_EQ(p.out(), "first\nsecond\n");
  EXPECT_EQ(p.err(), "to-stderr\n");
}

TEST_F(CliTest, CopyBigBinaryFileBothWays) {
  std::string dir = local_dir();
  std::string data = random_bytes(5 * 1000 * 1000 + 17, 42);
  data[100] = '\0';
  data[101] = '\n';
  write_file(dir + "/big.bin", data);
  chmod((dir + "/big.bin").c_str(), 0750);

  CliRun up = cli({"cp", dir + "/big.bin", "cli-cp:/workspace/in/big.bin", "-p"});
  EXPECT_EQ(up.code, 3) << up;  // no such session yet: cp does not create one
  EXPECT_EQ(up.err.rfind("agentbox: ENOENT: ", 0), 0u) << up;

  ASSERT_EQ(cli({"session", "create", "cli-cp", "-q"}).code, 0);
  up = cli({"cp", "-p", dir + "/big.bin", "cli-cp:/workspace/in/big.bin"});
  ASSERT_EQ(up.code, 0) << up;
  EXPECT_TRUE(up.out.empty());
  EXPECT_TRUE(read_file(workspace("cli-cp") + "/in/big.bin") == data);
  struct stat st {};
  ASSERT_EQ(stat((workspace("cli-cp") + "/in/big.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);  // the local mode travels, like cp

  CliRun down = cli({"cp", "cli-cp:/workspace/in/big.bin", dir + "/back.bin"});
  ASSERT_EQ(down.code, 0) << down;
  std::string back = read_file(dir + "/back.bin");
  EXPECT_EQ(back.size(), data.size());
  EXPECT_TRUE(back == data);

  // Into an existing directory, the name is kept; relative paths are under /workspace.
  fs::create_directories(dir + "/into");
  ASSERT_EQ(cli({"cp", "cli-cp:in/big.bin", dir + "/into"}).code, 0);
  EXPECT_TRUE(read_file(dir + "/into/big.bin") == data);
  ASSERT_EQ(cli({"cp", dir + "/big.bin", "cli-cp:/workspace/in"}).code, 0);
  ASSERT_EQ(cli({"cp", dir + "/big.bin", "cli-cp:/workspace/in/"}).code, 0);

  // '-' is stdin and stdout, also for binary data.
  CliRun from_stdin = cli({"cp", "-", "cli-cp:/workspace/piped.bin"}, data);
  ASSERT_EQ(from_stdin.code, 0) << from_stdin;
  EXPECT_TRUE(read_file(workspace("cli-cp") + "/piped.bin") == data);
  CliRun to_stdout = cli({"cp", "cli-cp:/workspace/piped.bin", "-"});
  ASSERT_EQ(to_stdout.code, 0) << to_stdout.err;
  EXPECT_TRUE(to_stdout.out == data);
  // No progress bar when stderr is not a terminal.
  EXPECT_TRUE(to_stdout.err.empty()) << to_stdout.err;
}

// Runs `agentbox --server URL args...` with stderr on a pseudo-terminal (stdin and stdout on
// /dev/null), as a person at a terminal would; returns its exit status and what the terminal
// showed.
int cli_on_tty(const std::vector<std::string>& args, std::string* shown) {
  int master = -1, slave = -1;
  if (::openpty(&master, &slave, nullptr, nullptr, nullptr) != 0) {
    ADD_FAILURE() << "openpty: " << std::strerror(errno);
    return -1;
  }
  UniqueFd m(master);
  UniqueFd s(slave);
  std::vector<std::string> argv = {cli_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int null = ::open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(s.get(), 2);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  s.reset();
  // Read the terminal until the CLI exits and the slave side is closed (EIO), or 120 s pass.
  auto deadline = Clock::now() + std::chrono::seconds(120);
  char buf[4096];
  while (Clock::now() < deadline) {
    pollfd p{m.get(), POLLIN, 0};
    if (poll(&p, 1, 200) < 0) break;
    if (p.revents == 0) continue;
    ssize_t n = read(m.get(), buf, sizeof buf);
    if (n <= 0) break;
    shown->append(buf, static_cast<std::size_t>(n));
  }
  int st = 0;
  if (Clock::now() >= deadline) kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

TEST_F(CliTest, CopyOverOneMiBShowsAProgressBarOnATerminal) {
  std::string dir = local_dir();
  std::string data = random_bytes(3 * 1024 * 1024 + 5, 7);
  write_file(dir + "/tty.bin", data);
  ASSERT_EQ(cli({"session", "create", "cli-tty", "-q"}).code, 0);

  std::string up;
  ASSERT_EQ(
      cli_on_tty({"--server", daemon_->url(), "cp", dir + "/tty.bin", "cli-tty:tty.bin"}, &up), 0)
      << up;
  EXPECT_TRUE(read_file(workspace("cli-tty") + "/tty.bin") == data);
  // The bar: the file's name, a bracketed bar, a percentage and the sizes, ending at 100%.
  EXPECT_NE(up.find("tty.bin ["), std::string::npos) << up;
  EXPECT_NE(up.find("] 100% 3.0 MiB / 3.0 MiB"), std::string::npos) << up;

  std::string down;
  ASSERT_EQ(
      cli_on_tty({"--server", daemon_->url(), "cp", "cli-tty:tty.bin", dir + "/back.bin"}, &down),
      0)
      << down;
  EXPECT_TRUE(read_file(dir + "/back.bin") == data);
  EXPECT_NE(down.find("] 100% 3.0 MiB / 3.0 MiB"), std::string::npos) << down;

  // A small file gets no bar, even on a terminal.
  write_file(dir + "/small.txt", "hello\n");
  std::string small;
  ASSERT_EQ(cli_on_tty({"--server", daemon_->url(), "cp", dir + "/small.txt", "cli-tty:small.txt"},
                       &small),
            0)
      << small;
  EXPECT_EQ(small.find('%'), std::string::npos) << small;
}

TEST_F(CliTest, ExecStdinUpToTheCliLimitIsAcceptedByTheServer) {
  // The CLI reads up to 16 MiB of stdin into the exec request; the server must take a request
  // that big (its exec body cap is above it), not answer 413.
  ASSERT_EQ(cli({"session", "create", "cli-stdin", "-q"}).code, 0);
  std::string text(16u << 20, 'x');
  for (std::size_t i = 80; i < text.size(); i += 81) text[i] = '\n';
  CliRun in = cli({"exec", "cli-stdin", "-i", "--", "wc", "-c"}, text);
  ASSERT_EQ(in.code, 0) << in;
  EXPECT_EQ(in.out.substr(in.out.find_first_not_of(' ')), std::to_string(text.size()) + "\n");

  // One byte more is refused by the CLI itself, with a hint.
  CliRun over = cli({"exec", "cli-stdin", "-i", "--", "wc", "-c"}, text + "y");
  EXPECT_EQ(over.code, 6) << over;  // over a size cap
  EXPECT_EQ(over.err.rfind("agentbox: ETOOBIG: stdin is over 16.0 MiB", 0), 0u) << over;
  EXPECT_NE(over.err.find("agentbox cp"), std::string::npos) << over;

  // Bytes that JSON must escape (6 bytes each) can push a smaller stdin over the server's
  // request limit: the CLI says so before sending anything.
  CliRun escaped =
      cli({"exec", "cli-stdin", "-i", "--", "wc", "-c"}, std::string(5u << 20, '\x01'));
  EXPECT_EQ(escaped.code, 6) << escaped;
  EXPECT_EQ(escaped.err.rfind("agentbox: ETOOBIG: stdin encodes to a 30.0 MiB request", 0), 0u)
      << escaped;
}

TEST_F(CliTest, CopyErrorsNameWhatIsWrong) {
  std::string dir = local_dir();
  ASSERT_EQ(cli({"session", "create", "cli-cperr", "-q"}).code, 0);
  CliRun missing = cli({"cp", "cli-cperr:/workspace/nope.txt", dir + "/x"});
  EXPECT_EQ(missing.code, 3) << missing;
  EXPECT_EQ(missing.err.rfind("agentbox: ENOENT: ", 0), 0u) << missing;
  EXPECT_NE(missing.err.find("nope.txt"), std::string::npos) << missing;
  EXPECT_FALSE(fs::exists(dir + "/x"));
  EXPECT_TRUE(fs::is_empty(dir));  // no temp file left behind

  CliRun no_parent = cli({"cp", "-", "cli-cperr:/workspace/a/b/c.txt"}, "x");
  EXPECT_EQ(no_parent.code, 3) << no_parent;
  EXPECT_EQ(no_parent.err.rfind("agentbox: ENOENT: ", 0), 0u) << no_parent;

  CliRun escape = cli({"cp", "-", "cli-cperr:/workspace/../../etc/x"}, "x");
  EXPECT_EQ(escape.code, 8) << escape;
  EXPECT_EQ(escape.err.rfind("agentbox: EACCES: ", 0), 0u) << escape;

  CliRun local_missing = cli({"cp", dir + "/not-here", "cli-cperr:/workspace/x"});
  EXPECT_EQ(local_missing.code, 3) << local_missing;  // a local file: the same class
  EXPECT_NE(local_missing.err.find("not-here"), std::string::npos) << local_missing;
}

TEST_F(CliTest, CatLsRmMkdir) {
  ASSERT_EQ(cli({"session", "create", "cli-fs", "-q"}).code, 0);
  ASSERT_EQ(cli({"mkdir", "cli-fs:/workspace/a/b/c"}).code, 0);
  EXPECT_TRUE(fs::is_directory(workspace("cli-fs") + "/a/b/c"));
  ASSERT_EQ(cli({"cp", "-", "cli-fs:/workspace/a/hello.txt"}, "hello\nworld\n").code, 0);

  CliRun cat = cli({"cat", "cli-fs:/workspace/a/hello.txt"});
  EXPECT_EQ(cat.code, 0) << cat;
  EXPECT_EQ(cat.out, "hello\nworld\n");

  CliRun ls = cli({"ls", "cli-fs:/workspace/a"});
  EXPECT_EQ(ls.code, 0) << ls;
  EXPECT_EQ(ls.out, "b/\nhello.txt\n");
  CliRun ls_ws = cli({"ls", "cli-fs"});
  EXPECT_EQ(ls_ws.code, 0) << ls_ws;
  EXPECT_EQ(ls_ws.out, "a/\n");
  CliRun ls_long = cli({"ls", "-l", "cli-fs:a"});
  EXPECT_EQ(ls_long.code, 0) << ls_long;
  EXPECT_NE(ls_long.out.find("drwx"), std::string::npos) << ls_long;
  EXPECT_NE(ls_long.out.find(" 12 "), std::string::npos) << ls_long;  // hello.txt's size
  CliRun ls_file = cli({"ls", "cli-fs:/workspace/a/hello.txt"});
  EXPECT_EQ(ls_file.code, 0) << ls_file;
  EXPECT_NE(ls_file.out.find("hello.txt"), std::string::npos) << ls_file;

  CliRun not_empty = cli({"rm", "cli-fs:/workspace/a"});
  EXPECT_EQ(not_empty.code, 7) << not_empty;
  EXPECT_EQ(not_empty.err.rfind("agentbox: ENOTEMPTY: ", 0), 0u) << not_empty;
  EXPECT_TRUE(fs::exists(workspace("cli-fs") + "/a/hello.txt"));

  EXPECT_EQ(cli({"rm", "cli-fs:/workspace/a/hello.txt"}).code, 0);
  EXPECT_FALSE(fs::exists(workspace("cli-fs") + "/a/hello.txt"));
  EXPECT_EQ(cli({"rm", "-r", "cli-fs:/workspace/a"}).code, 0);
  EXPECT_FALSE(fs::exists(workspace("cli-fs") + "/a"));

  CliRun cat_missing = cli({"cat", "cli-fs:/workspace/x"});
  EXPECT_EQ(cat_missing.code, 3) << cat_missing;
  EXPECT_EQ(cat_missing.err.rfind("agentbox: ENOENT: ", 0), 0u) << cat_missing;
  // Names the file (as the backend spells it: the host backend's workspace is a host dir).
  EXPECT_NE(cat_missing.err.find("/x"), std::string::npos) << cat_missing;
  EXPECT_TRUE(cat_missing.out.empty());

  CliRun rm_ws = cli({"rm", "-r", "cli-fs:/workspace"});
  EXPECT_EQ(rm_ws.code, 8) << rm_ws;
  EXPECT_EQ(rm_ws.err.rfind("agentbox: EACCES: ", 0), 0u) << rm_ws;
}

TEST_F(CliTest, UnknownSessionIsENOENTEverywhere) {
  for (std::vector<std::string> args : {std::vector<std::string>{"session", "show", "cli-none"},
                                        {"session", "rm", "cli-none"},
                                        {"cat", "cli-none:/workspace/x"},
                                        {"ls", "cli-none"},
                                        {"rm", "cli-none:/workspace/x"},
                                        {"mkdir", "cli-none:/workspace/x"},
                                        {"stat", "cli-none:/workspace/x"},
                                        {"mv", "cli-none:/workspace/x", "y"},
                                        {"health", "cli-none"}}) {
    CliRun r = cli(args);
    EXPECT_EQ(r.code, 3) << ::testing::PrintToString(args) << "\n" << r;
    EXPECT_EQ(r.err.rfind("agentbox: ENOENT: ", 0), 0u) << r;
  }
}

TEST_F(CliTest, ServerFromEnvironmentAndUnreachableServer) {
  // AGENTBOX_URL replaces --server.
  CliProcess p({"session", "ls"}, {"AGENTBOX_URL=" + daemon_->url()}, "");
  EXPECT_EQ(p.wait(), 0) << p.err();
  EXPECT_EQ(p.out().rfind("ID", 0), 0u) << p.out();

  // Nothing listens on this port (a daemon that has stopped).
  Daemon stopped;
  std::string url = stopped.url();
  stopped.stop();
  CliProcess down({"--server", url, "session", "ls"}, {}, "");
  EXPECT_EQ(down.wait(), 5);  // unreachable
  EXPECT_EQ(down.err().rfind("agentbox: EUNAVAILABLE: ", 0), 0u) << down.err();
  for (std::vector<std::string> args : {std::vector<std::string>{"exec", "s", "--", "true"},
                                        {"stat", "s:x"},
                                        {"mv", "s:a", "b"},
                                        {"health", "s"},
                                        {"ls", "s"}}) {
    std::vector<std::string> full = {"--server", url};
    full.insert(full.end(), args.begin(), args.end());
    CliProcess p2(full, {}, "");
    EXPECT_EQ(p2.wait(), 5) << ::testing::PrintToString(args) << "\n" << p2.err();
  }
}

TEST(CliAuthTest, TokenFromFlagOrEnvironment) {
  Daemon d({"--token", "s3cret"});
  CliProcess none({"--server", d.url(), "session", "ls"}, {}, "");
  EXPECT_EQ(none.wait(), 4);  // auth
  EXPECT_EQ(none.err().rfind("agentbox: EUNAUTHORIZED: ", 0), 0u) << none.err();

  CliProcess wrong({"--server", d.url(), "--token", "nope", "session", "ls"}, {}, "");
  EXPECT_EQ(wrong.wait(), 4);
  EXPECT_EQ(wrong.err().rfind("agentbox: EUNAUTHORIZED: ", 0), 0u) << wrong.err();

  CliProcess flag({"--server", d.url(), "--token", "s3cret", "session", "create", "tok", "-q"}, {},
                  "");
  EXPECT_EQ(flag.wait(), 0) << flag.err();
  EXPECT_EQ(flag.out(), "tok\n");

  CliProcess env({"exec", "tok", "--", "echo", "via-env"},
                 {"AGENTBOX_URL=" + d.url(), "AGENTBOX_TOKEN=s3cret"}, "");
  EXPECT_EQ(env.wait(), 0) << env.err();
  EXPECT_EQ(env.out(), "via-env\n");

  // exec's own failures use the same classes (the command's exit code is only passed through
  // when it ran); /healthz needs no token, so `wait` works without one.
  CliProcess exec_wrong({"--server", d.url(), "--token", "nope", "exec", "tok", "--", "true"}, {},
                        "");
  EXPECT_EQ(exec_wrong.wait(), 4);
  EXPECT_EQ(exec_wrong.err().rfind("agentbox: EUNAUTHORIZED: ", 0), 0u) << exec_wrong.err();
  CliProcess wait_anon({"--server", d.url(), "wait", "--timeout", "5"}, {}, "");
  EXPECT_EQ(wait_anon.wait(), 0) << wait_anon.err();

  // The flag wins over the environment.
  CliProcess both({"--token", "s3cret", "session", "ls"},
                  {"AGENTBOX_URL=" + d.url(), "AGENTBOX_TOKEN=wrong"}, "");
  EXPECT_EQ(both.wait(), 0) << both.err();
}

TEST_F(CliTest, StatMvRecursiveRmAndEmptyLs) {
  ASSERT_EQ(cli({"session", "create", "cli-mv", "-q"}).code, 0);
  ASSERT_EQ(cli({"mkdir", "cli-mv:/workspace/d/sub"}).code, 0);
  ASSERT_EQ(cli({"cp", "-", "cli-mv:/workspace/d/a.txt"}, "twelve bytes").code, 0);
  ASSERT_EQ(chmod((workspace("cli-mv") + "/d/a.txt").c_str(), 0640), 0);

  // stat: one "key: value" line each; --json is the server's object.
  CliRun st = cli({"stat", "cli-mv:d/a.txt"});
  ASSERT_EQ(st.code, 0) << st;
  EXPECT_NE(st.out.find("type:     regular file\n"), std::string::npos) << st;
  EXPECT_NE(st.out.find("size:     12\n"), std::string::npos) << st;
  EXPECT_NE(st.out.find("mode:     0640 (-rw-r-----)\n"), std::string::npos) << st;
  EXPECT_NE(st.out.find("modified: 20"), std::string::npos) << st;
  EXPECT_NE(st.out.find("a.txt\n"), std::string::npos) << st;  // the path line
  CliRun st_dir = cli({"stat", "cli-mv:/workspace/d"});
  ASSERT_EQ(st_dir.code, 0) << st_dir;
  EXPECT_NE(st_dir.out.find("type:     directory\n"), std::string::npos) << st_dir;
  EXPECT_NE(st_dir.out.find("(drwx"), std::string::npos) << st_dir;
  CliRun st_json = cli({"stat", "--json", "cli-mv:d/a.txt"});
  ASSERT_EQ(st_json.code, 0) << st_json;
  json j = json::parse(st_json.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << st_json;
  EXPECT_EQ(j["size"], 12);
  EXPECT_EQ(j["is_dir"], false);
  CliRun st_missing = cli({"stat", "cli-mv:d/nope"});
  EXPECT_EQ(st_missing.code, 3) << st_missing;
  EXPECT_EQ(st_missing.err.rfind("agentbox: ENOENT: ", 0), 0u) << st_missing;
  EXPECT_NE(st_missing.err.find("nope"), std::string::npos) << st_missing;
  EXPECT_TRUE(st_missing.out.empty());

  // mv: a rename; into an existing directory the name is kept; the destination may be given
  // with or without the session.
  CliRun mv = cli({"mv", "cli-mv:d/a.txt", "cli-mv:d/b.txt"});
  ASSERT_EQ(mv.code, 0) << mv;
  EXPECT_TRUE(mv.out.empty() && mv.err.empty()) << mv;
  EXPECT_FALSE(fs::exists(workspace("cli-mv") + "/d/a.txt"));
  EXPECT_EQ(read_file(workspace("cli-mv") + "/d/b.txt"), "twelve bytes");
  ASSERT_EQ(cli({"mv", "cli-mv:d/b.txt", "/workspace/d/sub"}).code, 0);
  EXPECT_EQ(read_file(workspace("cli-mv") + "/d/sub/b.txt"), "twelve bytes");
  ASSERT_EQ(cli({"rename", "cli-mv:d/sub", "cli-mv:moved/"}).code, 3);  // no "moved" dir yet
  ASSERT_EQ(cli({"mv", "cli-mv:d/sub", "cli-mv:moved"}).code, 0);
  EXPECT_EQ(read_file(workspace("cli-mv") + "/moved/b.txt"), "twelve bytes");
  CliRun mv_missing = cli({"mv", "cli-mv:d/nope", "cli-mv:d/x"});
  EXPECT_EQ(mv_missing.code, 3) << mv_missing;
  EXPECT_EQ(mv_missing.err.rfind("agentbox: ENOENT: ", 0), 0u) << mv_missing;
  CliRun mv_other = cli({"mv", "cli-mv:moved", "cli-else:moved"});
  EXPECT_EQ(mv_other.code, 2) << mv_other;
  EXPECT_NE(mv_other.err.find("same session"), std::string::npos) << mv_other;
  CliRun mv_escape = cli({"mv", "cli-mv:moved", "cli-mv:/workspace/../../x"});
  EXPECT_EQ(mv_escape.code, 8) << mv_escape;
  EXPECT_TRUE(fs::exists(workspace("cli-mv") + "/moved/b.txt"));

  // ls of an empty directory: nothing on stdout, "(empty)" on stderr, success.
  CliRun empty = cli({"ls", "cli-mv:d"});
  EXPECT_EQ(empty.code, 0) << empty;
  EXPECT_EQ(empty.out, "");
  EXPECT_EQ(empty.err, "(empty)\n");
  CliRun empty_long = cli({"ls", "-l", "cli-mv:d"});
  EXPECT_EQ(empty_long.code, 0) << empty_long;
  EXPECT_EQ(empty_long.err, "(empty)\n");

  // rm -r takes a whole tree; without -r a non-empty directory is a conflict.
  ASSERT_EQ(cli({"mkdir", "cli-mv:moved/deep/er"}).code, 0);
  EXPECT_EQ(cli({"rm", "cli-mv:moved"}).code, 7);
  CliRun rmr = cli({"rm", "-r", "cli-mv:moved"});
  EXPECT_EQ(rmr.code, 0) << rmr;
  EXPECT_FALSE(fs::exists(workspace("cli-mv") + "/moved"));
  EXPECT_EQ(cli({"rm", "-r", "cli-mv:moved"}).code, 3);
  CliRun ls_after = cli({"ls", "cli-mv"});
  EXPECT_EQ(ls_after.out, "d/\n") << ls_after;
}

// `agentbox template push|ls|build|rollback|rm` and `session create --template`, as a person at
// a terminal sees them.
TEST_F(CliTest, TemplatePushLsBuildRollbackRmAndSessionsOnIt) {
  const std::string d = local_dir();
  write_file(d + "/t.yaml", "name: cli-tmpl\ndescription: from the cli\nsetup:\n  - echo one > v.txt\n");
  CliRun p = cli({"template", "push", d + "/t.yaml"});
  ASSERT_EQ(p.code, 0) << p;
  EXPECT_EQ(p.out, "cli-tmpl created\n") << p;
  EXPECT_EQ(cli({"template", "push", d + "/nope.yaml"}).code, 3);
  CliRun bad = cli({"template", "push", "-"}, "name: [\n");
  EXPECT_NE(bad.code, 0) << bad;
  EXPECT_NE(bad.err.find("line"), std::string::npos) << bad;

  // A session on a template never built: refused, nothing made.
  CliRun early = cli({"session", "create", "cli-t0", "--template", "cli-tmpl", "-q"});
  EXPECT_EQ(early.code, 7) << early;
  EXPECT_NE(early.err.find("build it first"), std::string::npos) << early;

  CliRun b1 = cli({"template", "build", "cli-tmpl"});
  ASSERT_EQ(b1.code, 0) << b1;
  EXPECT_NE(b1.out.find("==> setup[0]: echo one > v.txt"), std::string::npos) << b1;
  EXPECT_NE(b1.out.find(" version 1 ("), std::string::npos) << b1;

  // Stdin, a warning for an unknown key, a replacement; its build is version 2.
  CliRun p2 = cli({"template", "push", "-"},
                  "name: cli-tmpl\nfrobnicate: 1\nsetup:\n  - echo two > v.txt\n");
  ASSERT_EQ(p2.code, 0) << p2;
  EXPECT_EQ(p2.out, "cli-tmpl replaced\n") << p2;
  EXPECT_NE(p2.err.find("agentbox: warning: "), std::string::npos) << p2;
  EXPECT_NE(p2.err.find("frobnicate"), std::string::npos) << p2;
  ASSERT_EQ(cli({"template", "build", "cli-tmpl"}).code, 0);

  CliRun ls = cli({"template", "ls"});
  ASSERT_EQ(ls.code, 0) << ls;
  EXPECT_EQ(ls.out.rfind("NAME", 0), 0u) << ls;
  EXPECT_NE(ls.out.find("\ncli-tmpl "), std::string::npos) << ls;
  CliRun lj = cli({"template", "ls", "--json"});
  json j = json::parse(lj.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << lj;
  json mine;
  for (const json& t : j["templates"]) {
    if (t["name"] == "cli-tmpl") mine = t;
  }
  EXPECT_EQ(mine["current_version"], 2) << lj;
  EXPECT_EQ(mine["snapshots"].size(), 2u) << lj;

  CliRun s2 = cli({"session", "create", "cli-t2", "--template", "cli-tmpl", "-q"});
  ASSERT_EQ(s2.code, 0) << s2;
  EXPECT_EQ(s2.out, "cli-t2\n");
  EXPECT_EQ(read_file(workspace("cli-t2") + "/v.txt"), "two\n");

  CliRun rb = cli({"template", "rollback", "cli-tmpl", "1"});
  ASSERT_EQ(rb.code, 0) << rb;
  EXPECT_EQ(rb.out, "cli-tmpl current version 1\n") << rb;
  EXPECT_EQ(cli({"template", "rollback", "cli-tmpl", "9"}).code, 3);
  ASSERT_EQ(cli({"session", "create", "cli-t1", "--template", "cli-tmpl", "-q"}).code, 0);
  EXPECT_EQ(read_file(workspace("cli-t1") + "/v.txt"), "one\n");
  ASSERT_EQ(cli({"session", "create", "cli-t2b", "--template", "cli-tmpl@2", "-q"}).code, 0);
  EXPECT_EQ(read_file(workspace("cli-t2b") + "/v.txt"), "two\n");

  // A failing build: the step named on stderr, exit 1, version 1 still current.
  write_file(d + "/t.yaml", "name: cli-tmpl\nsetup:\n  - echo three > v.txt\n  - exit 4\n");
  ASSERT_EQ(cli({"template", "push", d + "/t.yaml"}).code, 0);
  CliRun fb = cli({"template", "build", "cli-tmpl"});
  EXPECT_EQ(fb.code, 1) << fb;
  EXPECT_NE(fb.err.find("failed: setup[1]"), std::string::npos) << fb;
  CliRun lj2 = cli({"template", "ls", "--json"});
  json j2 = json::parse(lj2.out, nullptr, false);
  ASSERT_TRUE(j2.is_object()) << lj2;
  for (const json& t : j2["templates"]) {
    if (t["name"] == "cli-tmpl") {
      EXPECT_EQ(t["current_version"], 1) << lj2;
      EXPECT_EQ(t["snapshots"].size(), 2u) << lj2;
    }
  }

  // In use: rm refused (exit 7); once the sessions are gone, removed.
  CliRun busy = cli({"template", "rm", "cli-tmpl"});
  EXPECT_EQ(busy.code, 7) << busy;
  for (const char* s : {"cli-t1", "cli-t2", "cli-t2b"}) {
    EXPECT_EQ(cli({"session", "rm", s}).code, 0) << s;
  }
  CliRun rm = cli({"template", "rm", "cli-tmpl"});
  EXPECT_EQ(rm.code, 0) << rm;
  EXPECT_EQ(cli({"template", "rm", "cli-tmpl"}).code, 3);
  EXPECT_EQ(cli({"template", "ls"}).out.find("cli-tmpl"), std::string::npos);
  EXPECT_EQ(cli({"template", "build"}).code, 2);
}

TEST_F(CliTest, HealthAndRepair) {
  ASSERT_EQ(cli({"session", "create", "cli-health", "-q"}).code, 0);
  CliRun h = cli({"health", "cli-health"});
  ASSERT_EQ(h.code, 0) << h;
  EXPECT_EQ(h.out.rfind("CHECK", 0), 0u) << h;
  EXPECT_NE(h.out.find("\nbox "), std::string::npos) << h;
  EXPECT_NE(h.out.find("\nworkspace "), std::string::npos) << h;
  EXPECT_EQ(h.out.find("FAIL"), std::string::npos) << h;
  EXPECT_NE(h.out.find("cli-health: healthy\n"), std::string::npos) << h;
  CliRun hj = cli({"health", "--json", "cli-health"});
  ASSERT_EQ(hj.code, 0) << hj;
  json j = json::parse(hj.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << hj;
  EXPECT_EQ(j["healthy"], true);
  EXPECT_TRUE(j["checks"].is_array());

  // repair: the server's answer, whatever it is, read right. Not built yet (422 today, 501
  // ENOTSUP by the contract): the server's message and exit 9; built: the checks afterwards.
  CliRun rep = cli({"repair", "cli-health"});
  if (rep.code == 9) {
    EXPECT_EQ(rep.err.rfind("agentbox: ", 0), 0u) << rep;
    EXPECT_NE(rep.err.find("repair"), std::string::npos) << rep;
    EXPECT_NE(rep.err.find("not"), std::string::npos) << rep;
    EXPECT_TRUE(rep.out.empty()) << rep;
  } else {
    EXPECT_TRUE(rep.code == 0 || rep.code == 11) << rep;
    EXPECT_NE(rep.out.find("cli-health: "), std::string::npos) << rep;
  }
  EXPECT_EQ(cli({"repair", "cli-nobody"}).code, 3);
  EXPECT_EQ(cli({"health"}).code, 2);
}

TEST_F(CliTest, SessionMountsAdd) {
  ASSERT_EQ(cli({"session", "create", "cli-madd", "-q"}).code, 0);
  // Usage errors, before anything is sent.
  EXPECT_EQ(cli({"session", "mounts", "add", "cli-madd"}).code, 2);
  EXPECT_EQ(cli({"session", "mounts", "add", "cli-madd", "--mount", "/srv"}).code, 2);
  EXPECT_EQ(cli({"session", "mounts", "add", "cli-madd", "--skill", "noequals"}).code, 2);
  EXPECT_EQ(
      cli({"session", "mounts", "add", "cli-madd", "--skill", "w=/x", "--skill-mode", "rx"}).code,
      2);
  EXPECT_EQ(
      cli({"session", "mounts", "add", "cli-madd", "--mount", "/a:/b", "--skill-mode", "ro"}).code,
      2);

  // This daemon allows no host mounts: the server refuses the dir (403 EACCES) naming it.
  CliRun r = cli({"session", "mounts", "add", "cli-madd", "--skill", "web=" + daemon_->temp_dir(),
                  "--skill-mode", "ro"});
  EXPECT_EQ(r.code, 8) << r;
  EXPECT_EQ(r.err.rfind("agentbox: ", 0), 0u) << r;
  EXPECT_NE(r.err.find("skills.web"), std::string::npos) << r;
  EXPECT_TRUE(r.out.empty()) << r;
}

// `session mounts add` against a daemon that allows a mount root: live into the running box,
// what the server refuses exits with the cause's code.
TEST(CliMounts, SessionMountsAddPutsASkillIntoTheRunningBox) {
  testing::TempDir tmp("agentbox-cli-mounts");
  const std::string root = tmp.path();
  fs::create_directories(root + "/skills/web");
  std::ofstream(root + "/skills/web/SKILL.md") << "# web\n";
  {
    Daemon d({"--backend", "ns", "--allow-mount-root", root});
    auto cli = [&d](std::vector<std::string> args) { return run_cli(d, std::move(args)); };
    ASSERT_EQ(cli({"session", "create", "cm", "-q"}).code, 0);
    CliRun add = cli({"session", "mounts", "add", "cm", "--skill", "web=" + root + "/skills/web"});
    ASSERT_EQ(add.code, 0) << add;
    EXPECT_EQ(add.out, "cm: added, live (visible to the next exec)\n") << add;
    CliRun cat = cli({"exec", "cm", "--", "cat", "/workspace/.skills/web/SKILL.md"});
    EXPECT_EQ(cat.code, 0) << cat;
    EXPECT_EQ(cat.out, "# web\n") << cat;
    // --json: the server's answer, with "applied".
    fs::create_directories(root + "/data");
    CliRun js = cli({"session", "mounts", "add", "cm", "--mount", root + "/data:/data:ro", "--json"});
    ASSERT_EQ(js.code, 0) << js;
    json j = json::parse(js.out, nullptr, false);
    EXPECT_EQ(j["applied"], "next_start") << js.out;  // /data: a new dir on the read-only root
    EXPECT_EQ(j["session"]["mounts"][0]["mount_path"], "/data") << js.out;
    // Refused by the server: a taken target (1), a missing host dir (3, not found).
    CliRun dup = cli({"session", "mounts", "add", "cm", "--skill", "web=" + root + "/data"});
    EXPECT_EQ(dup.code, 1) << dup;
    EXPECT_NE(dup.err.find("skills.web"), std::string::npos) << dup;
    CliRun missing = cli({"session", "mounts", "add", "cm", "--skill", "x=" + root + "/nope"});
    EXPECT_EQ(missing.code, 3) << missing;
    EXPECT_NE(missing.err.find("skills.x"), std::string::npos) << missing;
    EXPECT_EQ(cli({"session", "mounts", "add", "nobody", "--skill", "w=" + root + "/data"}).code,
              3);
  }
}

// agentbox session limits and agentbox network change a running ns box in place.
TEST(CliLive, SessionLimitsAndNetworkChangeTheRunningBox) {
  Daemon d({"--backend", "ns"});
  auto cli = [&d](std::vector<std::string> args) { return run_cli(d, std::move(args)); };
  ASSERT_EQ(cli({"session", "create", "cl", "-q", "--max-pids", "64"}).code, 0);
  ASSERT_EQ(cli({"exec", "cl", "--", "sh", "-c", "echo up > /tmp/alive"}).code, 0);
  CliRun lim = cli({"session", "limits", "cl", "--max-pids", "12", "--memory-mb", "300"});
  ASSERT_EQ(lim.code, 0) << lim;
  EXPECT_NE(lim.out.find("cl: "), std::string::npos) << lim;
  EXPECT_NE(lim.out.find(" max_pids=12"), std::string::npos) << lim;
  EXPECT_NE(lim.out.find(" memory_mb=300"), std::string::npos) << lim;
  // The box's pids.max is 12 now: 20 sleeping children cannot all be forked.
  CliRun forks = cli({"exec", "cl", "--", "python3", "-c",
                      "import os,time\nn=0\nfor i in range(20):\n  try: p=os.fork()\n"
                      "  except OSError: break\n  if p==0:\n    time.sleep(1); os._exit(0)\n"
                      "  n+=1\nprint(n, flush=True)\nfor i in range(n): os.wait()"});
  EXPECT_EQ(forks.code, 0) << forks;
  EXPECT_LT(std::strtol(forks.out.c_str(), nullptr, 10), 12) << forks;
  EXPECT_GT(std::strtol(forks.out.c_str(), nullptr, 10), 0) << forks;
  EXPECT_EQ(cli({"session", "limits", "cl"}).code, 2);  // nothing to change
  CliRun bad = cli({"session", "limits", "cl", "--memory-mb", "1"});
  EXPECT_EQ(bad.code, 1) << bad;
  EXPECT_NE(bad.err.find("limits.memory_mb"), std::string::npos) << bad;
  CliRun disk = cli({"session", "limits", "cl", "--disk-mb", "64"});
  EXPECT_EQ(disk.code, 9) << disk;
  EXPECT_NE(disk.err.find("limits.disk_mb"), std::string::npos) << disk;
  EXPECT_EQ(cli({"session", "limits", "nobody", "--max-pids", "64"}).code, 3);

  CliRun al = cli({"network", "cl", "allowlist", "--allow", "example.test"});
  ASSERT_EQ(al.code, 0) << al;
  EXPECT_EQ(al.out, "cl: network allowlist example.test\n") << al;
  EXPECT_EQ(cli({"exec", "cl", "--", "sh", "-c", "echo $HTTP_PROXY"}).out,
            "http://127.0.0.1:3128\n");
  CliRun none = cli({"network", "cl", "none", "--json"});
  ASSERT_EQ(none.code, 0) << none;
  EXPECT_EQ(json::parse(none.out, nullptr, false)["network"]["mode"], "none") << none;
  EXPECT_EQ(cli({"exec", "cl", "--", "sh", "-c", "echo \"[$HTTP_PROXY]\"; cat /tmp/alive"}).out,
            "[]\nup\n");
  EXPECT_EQ(cli({"network", "cl", "bogus"}).code, 2);
  CliRun allow = cli({"network", "cl", "none", "--allow", "example.test"});
  EXPECT_EQ(allow.code, 1) << allow;
  EXPECT_NE(allow.err.find("network.allow"), std::string::npos) << allow;
  EXPECT_EQ(cli({"network", "nobody", "none"}).code, 3);
}

// --host-path DIR[:ro]: the host dir is the session's workspace (seed 002's primary mount).
TEST(CliMounts, SessionCreateHostPathMakesTheHostDirTheWorkspace) {
  testing::TempDir tmp("agentbox-cli-hostpath");
  const std::string root = tmp.path();
  const std::string dir = root + "/proj";
  fs::create_directories(dir);
  std::ofstream(dir + "/old.txt") << "old\n";
  {
    Daemon d({"--backend", "ns", "--allow-mount-root", root});
    auto cli = [&d](std::vector<std::string> args) { return run_cli(d, std::move(args)); };
    CliRun made = cli({"session", "create", "hp", "--host-path", dir});
    ASSERT_EQ(made.code, 0) << made;
    json j = json::parse(made.out, nullptr, false);
    EXPECT_EQ(j["host_path"], dir) << made.out;
    EXPECT_EQ(j["host_path_mode"], "rw") << made.out;
    EXPECT_EQ(j["mount_path"], "/workspace") << made.out;
    CliRun w =
        cli({"exec", "hp", "--", "sh", "-c", "cat old.txt && echo new > /workspace/new.txt"});
    EXPECT_EQ(w.code, 0) << w;
    EXPECT_EQ(w.out, "old\n") << w;
    EXPECT_EQ(read_file(dir + "/new.txt"), "new\n");

    ASSERT_EQ(cli({"session", "create", "hpro", "-q", "--host-path", dir + ":ro"}).code, 0);
    CliRun ro = cli({"exec", "hpro", "--", "touch", "/workspace/ro.txt"});
    EXPECT_NE(ro.code, 0) << ro;
    EXPECT_NE(ro.err.find("Read-only file system"), std::string::npos) << ro;
    EXPECT_FALSE(fs::exists(dir + "/ro.txt"));

    // Malformed: usage errors before any request; outside the roots: refused by the server.
    EXPECT_EQ(cli({"session", "create", "x", "--host-path", "rel/dir"}).code, 2);
    EXPECT_EQ(cli({"session", "create", "x", "--host-path", dir + ":rx"}).code, 2);
    CliRun out = cli({"session", "create", "x", "--host-path", "/etc"});
    EXPECT_EQ(out.code, 8) << out;  // EACCES: not under an allowed mount root
    EXPECT_NE(out.err.find("host_path"), std::string::npos) << out;

    // Removing the sessions leaves the dir and its files.
    EXPECT_EQ(cli({"session", "rm", "hp"}).code, 0);
    EXPECT_EQ(cli({"session", "rm", "hpro"}).code, 0);
    EXPECT_EQ(read_file(dir + "/old.txt"), "old\n");
    EXPECT_EQ(read_file(dir + "/new.txt"), "new\n");
  }
}

// A loopback port nothing listens on (bound, then released).
int free_port() {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (!s || ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ADD_FAILURE() << "free_port: " << std::strerror(errno);
    return -1;
  }
  return ntohs(a.sin_port);
}

TEST_F(CliTest, WaitForAServerThatIsUp) {
  CliRun up = cli({"wait"});  // --server
  EXPECT_EQ(up.code, 0) << up;
  EXPECT_TRUE(up.out.empty() && up.err.empty()) << up;
  // Seed 001's spelling: WAIT_FOR_SIDECAR=host:port, no scheme; an explicit URL too.
  CliProcess env({"wait"}, {"WAIT_FOR_SIDECAR=" + daemon_->host_port()}, "");
  EXPECT_EQ(env.wait(), 0) << env.err();
  CliProcess arg({"wait", "--timeout", "5", daemon_->url() + "/healthz"}, {}, "");
  EXPECT_EQ(arg.wait(), 0) << arg.err();
}

TEST_F(CliTest, WaitTimesOutWhereNothingListens) {
  std::string dead = "127.0.0.1:" + std::to_string(free_port());
  auto t0 = Clock::now();
  CliRun r = cli({"wait", "--timeout", "1", dead});
  EXPECT_EQ(r.code, 5) << r;
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(900)) << "gave up before the timeout";
  EXPECT_EQ(r.err.rfind("agentbox: ETIMEDOUT: http://" + dead +
                            "/healthz did not answer 200 "
                            "within 1 s",
                        0),
            0u)
      << r;
  EXPECT_NE(r.err.find("refused"), std::string::npos) << r;  // why the last attempt failed

  // The same from seed 001's variables alone.
  CliProcess env({"wait"}, {"WAIT_FOR_SIDECAR=" + dead, "WAIT_FOR_SIDECAR_TIMEOUT=1"}, "");
  EXPECT_EQ(env.wait(), 5) << env.err();
  EXPECT_NE(env.err().find("within 1 s"), std::string::npos) << env.err();
  // A malformed timeout is a usage error naming the variable.
  CliProcess bad({"wait"}, {"WAIT_FOR_SIDECAR=" + dead, "WAIT_FOR_SIDECAR_TIMEOUT=soon"}, "");
  EXPECT_EQ(bad.wait(), 2) << bad.err();
  EXPECT_NE(bad.err().find("WAIT_FOR_SIDECAR_TIMEOUT=soon"), std::string::npos) << bad.err();
}

TEST(CliWaitTest, WaitsUntilTheDaemonComesUp) {
  // The sidecar race seed 001 solves: the waiter starts first, the daemon later.
  std::string hp = "127.0.0.1:" + std::to_string(free_port());
  CliProcess waiter({"wait", "--timeout", "60", hp}, {}, "");
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_TRUE(waiter.running()) << waiter.err();  // still waiting: nothing listens yet
  Daemon d({"--listen", hp});
  ASSERT_EQ(d.host_port(), hp);
  EXPECT_EQ(waiter.wait(), 0) << waiter.err();
}

// ---- processes and terminals ----

// Polls `pred` every 50 ms for up to `limit`.
bool eventually(const std::function<bool()>& pred,
                std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

// `agentbox ps` rows as words: the line of the process tagged `tag` ("" if none).
std::string ps_row(const std::string& table, const std::string& tag) {
  std::istringstream in(table);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string pid, t;
    words >> pid >> t;
    if (t == tag) return line;
  }
  return "";
}

TEST_F(CliTest, ProcessesStartPsLogsAndKill) {
  CliRun st = cli(
      {"start", "cli-proc", "--tag", "job", "--", "sh", "-c", "echo out; echo err >&2; exit 3"});
  ASSERT_EQ(st.code, 0) << st;
  json obj = json::parse(st.out, nullptr, false);
  ASSERT_TRUE(obj.is_object()) << st;
  EXPECT_EQ(obj["tag"], "job");
  EXPECT_GT(obj["pid"].get<int>(), 0);

  // logs -f ends with the process; stdout and stderr stay apart.
  CliRun lf = cli({"logs", "-f", "cli-proc", "job"});
  EXPECT_EQ(lf.code, 0) << lf;
  EXPECT_EQ(lf.out, "out\n");
  EXPECT_EQ(lf.err, "err\n");
  // By pid too, and without -f it prints what is kept.
  CliRun lp = cli({"logs", "cli-proc", std::to_string(obj["pid"].get<int>())});
  EXPECT_EQ(lp.code, 0) << lp;
  EXPECT_EQ(lp.out, "out\n");

  CliRun q = cli({"start", "-q", "cli-proc", "--tag", "srv", "--", "sleep", "600"});
  ASSERT_EQ(q.code, 0) << q;
  const std::string srv_pid = q.out.substr(0, q.out.find('\n'));
  EXPECT_EQ(q.out, srv_pid + "\n");
  EXPECT_GT(std::stoi(srv_pid), 0);
  // A tag is unique among live processes: conflict.
  CliRun dup = cli({"start", "cli-proc", "--tag", "srv", "--", "true"});
  EXPECT_EQ(dup.code, 7) << dup;
  EXPECT_NE(dup.err.find("EEXIST"), std::string::npos) << dup;

  CliRun ps = cli({"ps", "cli-proc"});
  ASSERT_EQ(ps.code, 0) << ps;
  EXPECT_EQ(ps.out.rfind("PID", 0), 0u) << ps;
  for (const char* col : {"TAG", "STATUS", "EXIT", "COMMAND"}) {
    EXPECT_NE(ps.out.substr(0, ps.out.find('\n')).find(col), std::string::npos) << ps;
  }
  std::string job = ps_row(ps.out, "job");
  EXPECT_NE(job.find("exited"), std::string::npos) << ps.out;
  EXPECT_NE(job.find("  3  "), std::string::npos) << ps.out;
  EXPECT_NE(job.find("sh -c 'echo out; echo err >&2; exit 3'"), std::string::npos) << ps.out;
  std::string row = ps_row(ps.out, "srv");
  EXPECT_EQ(row.rfind(srv_pid + " ", 0), 0u) << ps.out;
  EXPECT_NE(row.find("running"), std::string::npos) << ps.out;
  EXPECT_NE(row.find("sleep 600"), std::string::npos) << ps.out;

  // kill --signal sends that signal; the process ends by it.
  CliRun term = cli({"kill", "--signal", "TERM", "cli-proc", "srv"});
  EXPECT_EQ(term.code, 0) << term;
  std::string after;
  EXPECT_TRUE(eventually([&] {
    after = ps_row(cli({"ps", "cli-proc"}).out, "srv");
    return after.find("killed") != std::string::npos;
  })) << after;
  EXPECT_NE(after.find("signal 15"), std::string::npos) << after;

  // Plain kill ends it (and everything it started), by pid as well as by tag.
  CliRun tree =
      cli({"start", "-q", "cli-proc", "--tag", "tree", "-c", "sleep 600 & sleep 600 & wait"});
  ASSERT_EQ(tree.code, 0) << tree;
  CliRun k = cli({"kill", "cli-proc", tree.out.substr(0, tree.out.find('\n'))});
  EXPECT_EQ(k.code, 0) << k;
  EXPECT_NE(ps_row(cli({"ps", "cli-proc"}).out, "tree").find("signal 9"), std::string::npos);

  // cwd and env reach the process.
  ASSERT_EQ(cli({"mkdir", "cli-proc:/workspace/sub"}).code, 0);
  ASSERT_EQ(cli({"start", "cli-proc", "--tag", "env", "--cwd", "/workspace/sub", "-e",
                 "GREETING=hi there", "-c", "echo \"$GREETING\"; basename \"$PWD\""})
                .code,
            0);
  CliRun envout = cli({"logs", "-f", "cli-proc", "env"});
  EXPECT_EQ(envout.out, "hi there\nsub\n") << envout;
}

TEST_F(CliTest, ProcessErrorsUseTheExitCodesOfTheirCause) {
  ASSERT_EQ(cli({"session", "create", "cli-perr", "-q"}).code, 0);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"logs", "cli-perr", "nosuch"},
        {"logs", "-f", "cli-perr", "nosuch"},
        {"kill", "cli-perr", "nosuch"},
        {"kill", "--signal", "INT", "cli-perr", "4242"},
        {"attach", "cli-perr", "nosuch"},
        {"ps", "cli-no-such-session"}}) {
    CliRun r = cli(args);
    EXPECT_EQ(r.code, 3) << args[0] << " " << args.back() << ": " << r;
    EXPECT_NE(r.err.find("ENOENT"), std::string::npos) << r;
  }
  // Managed processes: the server's answer (501 where they are not built) is passed through.
  CliRun managed = cli({"start", "cli-perr", "--restart", "on-failure", "--", "true"});
  if (managed.code != 0) {
    EXPECT_EQ(managed.code, 9) << managed;
    EXPECT_NE(managed.err.find("ENOTSUP"), std::string::npos) << managed;
    EXPECT_NE(managed.err.find("restart"), std::string::npos) << managed;
  }
  CliRun sometimes = cli({"start", "cli-perr", "--restart", "sometimes", "--", "true"});
  EXPECT_EQ(sometimes.code, 1) << sometimes;
  EXPECT_NE(sometimes.err.find("restart"), std::string::npos) << sometimes;
  ASSERT_EQ(cli({"start", "cli-perr", "--tag", "s", "--", "sleep", "600"}).code, 0);
  CliRun stop = cli({"kill", "--signal", "STOP", "cli-perr", "s"});
  EXPECT_EQ(stop.code, 1) << stop;
  EXPECT_NE(stop.err.find("signal"), std::string::npos) << stop;
  // Nothing sent: no command, an option where the command goes.
  EXPECT_EQ(cli({"start", "cli-perr"}).code, 2);
  EXPECT_EQ(cli({"start", "cli-perr", "--bogus", "--", "true"}).code, 2);
  EXPECT_EQ(cli({"logs", "cli-perr"}).code, 2);
  EXPECT_EQ(cli({"kill", "cli-perr", "s"}).code, 0);
}

// A TCP relay between the CLI and the daemon whose connections the test can cut, to drop a
// `logs -f` stream in the middle.
class Relay {
 public:
  explicit Relay(std::string target) : target_(std::move(target)) {
    listen_ = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_.get(), 16) != 0 ||
        ::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("relay: bind/listen failed");
    }
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~Relay() {
    stop_ = true;
    acceptor_.join();
    cut();
    for (auto& t : pumps_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int accepted() const { return accepted_; }
  // Ends every connection open now, both ways.
  void cut() {
    std::lock_guard lock(mu_);
    for (int fd : live_) ::shutdown(fd, SHUT_RDWR);
  }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_.get(), POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      UniqueFd in(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!in) continue;
      auto colon = target_.rfind(':');
      UniqueFd out(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(target_.substr(colon + 1))));
      ::inet_pton(AF_INET, target_.substr(0, colon).c_str(), &a.sin_addr);
      if (::connect(out.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) continue;
      ++accepted_;
      std::lock_guard lock(mu_);
      live_.push_back(in.get());
      live_.push_back(out.get());
      pumps_.emplace_back([this, a = std::move(in), b = std::move(out)]() mutable {
        pump(a.get(), b.get());
        std::lock_guard l(mu_);
        std::erase(live_, a.get());
        std::erase(live_, b.get());
      });
    }
  }
  // Copies both ways until either side ends.
  void pump(int a, int b) {
    char buf[65536];
    for (;;) {
      pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
      if (::poll(p, 2, 200) < 0) return;
      for (int i = 0; i < 2; ++i) {
        if (!p[i].revents) continue;
        ssize_t n = ::read(p[i].fd, buf, sizeof buf);
        if (n <= 0) return;
        if (!write_all_fd(i == 0 ? b : a, buf, static_cast<std::size_t>(n))) return;
      }
    }
  }
  static bool write_all_fd(int fd, const char* p, std::size_t n) {
    while (n > 0) {
      ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }

  std::string target_;
  UniqueFd listen_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::mutex mu_;
  std::vector<int> live_;
  std::vector<std::thread> pumps_;
  std::thread acceptor_;
};

TEST_F(CliTest, LogsFollowResumesAfterDroppedConnectionsWithoutLossOrRepeat) {
  // 60 numbered lines, one every 50 ms, then exit 0.
  ASSERT_EQ(cli({"start", "cli-follow", "--tag", "count", "-c",
                 "i=0; while [ $i -lt 60 ]; do echo line$i; i=$((i+1)); sleep 0.05; done"})
                .code,
            0);
  Relay relay(daemon_->host_port());
  CliProcess f({"--server", relay.url(), "logs", "-f", "cli-follow", "count"}, {}, "");
  // Cut the stream three times while the lines come.
  for (int cut = 0; cut < 3; ++cut) {
    std::string want = "line" + std::to_string(10 + cut * 15) + "\n";
    ASSERT_TRUE(f.wait_for_stdout(want, std::chrono::seconds(20))) << f.out() << f.err();
    relay.cut();
  }
  EXPECT_EQ(f.wait(), 0) << f.err();
  std::string want;
  for (int i = 0; i < 60; ++i) want += "line" + std::to_string(i) + "\n";
  EXPECT_EQ(f.out(), want);
  EXPECT_EQ(f.err(), "");
  EXPECT_GE(relay.accepted(), 4);  // it did reconnect after each cut
}

TEST_F(CliTest, AttachInLineModeSendsLinesAndEndsWithTheProcessExitCode) {
  ASSERT_EQ(cli({"start", "cli-attach", "--tag", "echo", "-i", "-c",
                 "while read l; do echo \"got $l\"; done; exit 4"})
                .code,
            0);
  CliProcess a({"--server", daemon_->url(), "attach", "cli-attach", "echo"}, {},
               "one\n{\"jsonrpc\":\"2.0\",\"id\":1}\nlast-without-newline");
  ASSERT_TRUE(a.wait_for_stdout("got last-without-newline\n", std::chrono::seconds(20)))
      << a.out() << a.err();
  // One attacher at a time.
  CliRun second = cli({"attach", "cli-attach", "echo"});
  EXPECT_EQ(second.code, 7) << second;
  EXPECT_TRUE(a.running()) << a.err();  // our stdin ended, still attached
  // The process ends (its stdin closed through the API): attach exits with its code.
  client::Client c(daemon_->options());
  auto closed = c.request("POST", "/v1/sessions/cli-attach/processes/echo/stdin?close=true", "",
                          "application/octet-stream");
  ASSERT_TRUE(closed && closed->status == 200);
  EXPECT_EQ(a.wait(), 4) << a.err();
  EXPECT_EQ(a.out(), "got one\ngot {\"jsonrpc\":\"2.0\",\"id\":1}\ngot last-without-newline\n");
}

TEST_F(CliTest, AttachToAPtyProcessAndShellWithoutATerminal) {
  // A pty process attached from a pipe: the bytes go to its terminal, its exit code comes back.
  ASSERT_EQ(cli({"start", "cli-pty", "--tag", "term", "--pty", "--", "sh"}).code, 0);
  CliRun at = cli({"attach", "cli-pty", "term"}, "echo at-$((40+2)); exit 6\n");
  EXPECT_EQ(at.code, 6) << at;
  EXPECT_NE(at.out.find("at-42"), std::string::npos) << at;

  // shell from a pipe: the end of stdin is the end of input (^D) for the shell.
  CliRun sh = cli({"shell", "cli-pty"}, "echo from-$((6*7))\n");
  EXPECT_EQ(sh.code, 0) << sh;
  EXPECT_NE(sh.out.find("from-42"), std::string::npos) << sh;
  CliRun code = cli({"shell", "cli-pty", "--", "sh", "-c", "echo \"$1\"; exit 5", "sh", "a b"});
  EXPECT_EQ(code.code, 5) << code;
  EXPECT_NE(code.out.find("a b"), std::string::npos) << code;
  CliRun killed = cli({"shell", "cli-pty", "--", "sh", "-c", "kill -TERM $$"});
  EXPECT_EQ(killed.code, 128 + SIGTERM) << killed;
  // The shell's processes ended with it.
  CliRun left = cli({"ps", "cli-pty"});
  EXPECT_EQ(left.out.find("running"), std::string::npos) << left;
}

// tmux on a socket of its own under the test's temp dir; the server is killed at the end.
class Tmux {
 public:
  explicit Tmux(std::string dir) : sock_(std::move(dir) + "/tmux.sock") {}
  ~Tmux() { (void)run("kill-server 2>/dev/null"); }
  // Runs `tmux -S SOCK <args>` (a shell command line) and returns its stdout.
  std::string run(const std::string& args) {
    std::string cmd = "tmux -S " + sock_ + " -f /dev/null " + args;
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      std::size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
      ::pclose(p);
    }
    return out;
  }
  std::string screen() { return run("capture-pane -p -t t"); }
  // The pane's "ROWS COLS", as `stty size` inside prints it.
  std::string pane_size() {
    std::string s = run("display-message -p -t t '#{pane_height} #{pane_width}'");
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }

 private:
  std::string sock_;
};

TEST_F(CliTest, ShellOnARealTerminalResizesAndPassesTheExitCode) {
  Tmux tmux(daemon_->temp_dir());
  // The pane runs the CLI, then prints its exit code and stays (for capture-pane).
  std::string inner =
      cli_binary() + " --server " + daemon_->url() + " shell cli-tmux; echo rc=$?; exec sleep 600";
  tmux.run("new-session -d -s t -x 100 -y 30 '" + inner + "'");
  tmux.run("set-option -t t status off");
  // `stty size` in the box shows our terminal's size, and follows it when it changes.
  auto size_seen = [&](const std::string& want) {
    return eventually(
        [&] {
          tmux.run("send-keys -t t 'stty size' Enter");
          return eventually([&] { return tmux.screen().find(want) != std::string::npos; },
                            std::chrono::seconds(2));
        },
        std::chrono::seconds(30));
  };
  std::string before = tmux.pane_size();
  ASSERT_FALSE(before.empty());
  EXPECT_TRUE(size_seen(before)) << before << "\n" << tmux.screen();
  tmux.run("resize-window -t t -x 120 -y 40");
  std::string after = tmux.pane_size();
  ASSERT_NE(after, before);
  EXPECT_NE(after.find(" 120"), std::string::npos) << after;
  EXPECT_TRUE(size_seen(after)) << after << "\n" << tmux.screen();

  // Typed keys run in the box; its exit code is the CLI's.
  tmux.run("send-keys -t t 'echo h\"\"i; exit 3' Enter");
  std::string screen;
  ASSERT_TRUE(eventually([&] {
    screen = tmux.screen();
    return screen.find("rc=") != std::string::npos;
  })) << screen;
  EXPECT_NE(screen.find("\nhi\n"), std::string::npos) << screen;
  EXPECT_NE(screen.find("rc=3"), std::string::npos) << screen;
}

}  // namespace
}  // namespace agentbox
