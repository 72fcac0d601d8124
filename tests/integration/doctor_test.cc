// `agentbox doctor` end to end: the real binary on this host (root, namespaces and cgroups
// present) against a real ns daemon, as nobody (the ns backend cannot run: exit 1 and the
// fix), in cluster mode with an etcd that does not answer, and with no daemon running.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "integration/daemon.h"

namespace agentbox {
namespace {

std::string cli_binary() {
  const char* dir = std::getenv("AGENTBOX_BIN_DIR");
  return std::string(dir && *dir ? dir : "build/bin") + "/agentbox";
}

struct Outcome {
  int code = -1;
  std::string out;  // stdout and stderr
};

std::ostream& operator<<(std::ostream& os, const Outcome& r) {
  return os << "exit " << r.code << "\n" << r.out;
}

// Runs a shell command line to its end (the arguments here are plain words and paths).
Outcome run_cmd(const std::string& cmd) {
  Outcome r;
  FILE* p = ::popen((cmd + " 2>&1 </dev/null").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  return r;
}

TEST(DoctorReal, ThisHostAndARunningNsDaemonAreFine) {
  Daemon d({"--backend", "ns"});
  const std::string config = d.temp_dir() + "/agentboxd.yaml";
  std::ofstream(config) << "backend: ns\ndata_dir: " << d.data_dir() << "\n";
  Outcome r = run_cmd(cli_binary() + " --server " + d.url() + " doctor --config " + config);
  EXPECT_EQ(r.code, 0) << r;
  for (const char* line : {"ok    privileges: root", "ok    clone3", "ok    openat2",
                           "ok    seccomp", "ok    overlayfs", "ok    namespaces",
                           "ok    agentbox-init", "this host can run agentboxd"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r;
  }
  EXPECT_NE(r.out.find("ok    daemon: " + d.url() + "/readyz: ready"), std::string::npos) << r;
  EXPECT_NE(r.out.find("ok    data dir: " + d.data_dir()), std::string::npos) << r;
  // This machine's cgroups (hybrid v1 here, pure v2 elsewhere) are usable either way.
  EXPECT_NE(r.out.find("ok    cgroups: v"), std::string::npos) << r;
}

TEST(DoctorReal, AsNobodyTheNsBackendCannotRunAndTheFixIsShown) {
  testing::TempDir dir("agentbox-doctor");
  Outcome r = run_cmd("setpriv --reuid=65534 --regid=65534 --clear-groups -- " + cli_binary() +
                      " doctor --no-daemon --backend ns --data-dir " + dir.path());
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_NE(r.out.find("FAIL  privileges"), std::string::npos) << r;
  EXPECT_NE(r.out.find("fix: run agentboxd as root"), std::string::npos) << r;
  EXPECT_NE(r.out.find("default backend cannot run here"), std::string::npos) << r;

  // The same user with the host backend: nothing blocks.
  r = run_cmd("setpriv --reuid=65534 --regid=65534 --clear-groups -- " + cli_binary() +
              " doctor --no-daemon --backend host --data-dir /tmp");
  EXPECT_EQ(r.code, 0) << r;
}

TEST(DoctorReal, ClusterModeWithoutEtcdFails) {
  testing::TempDir dir("agentbox-doctor");
  const std::string config = dir.path() + "/agentboxd.yaml";
  // Port 1 on loopback: nothing listens there, the connection is refused at once.
  std::ofstream(config) << "data_dir: " << dir.path() << "\ncluster:\n"
                        << "  etcd: [http://127.0.0.1:1]\n  secret_file: /nonexistent\n";
  Outcome r = run_cmd(cli_binary() + " doctor --no-daemon --config " + config);
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_NE(r.out.find("FAIL  etcd: http://127.0.0.1:1/health: no answer"), std::string::npos) << r;
}

TEST(DoctorReal, NoDaemonRunningIsAWarningWithTheWayToStartIt) {
  testing::TempDir dir("agentbox-doctor");
  Outcome r =
      run_cmd(cli_binary() + " --server http://127.0.0.1:1 doctor --data-dir " + dir.path());
  EXPECT_EQ(r.code, 0) << r;
  EXPECT_NE(r.out.find("WARN  daemon: http://127.0.0.1:1/readyz: not running"), std::string::npos)
      << r;
  EXPECT_NE(r.out.find("systemctl start agentboxd"), std::string::npos) << r;
}

}  // namespace
}  // namespace agentbox
