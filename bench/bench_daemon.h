#pragma once
// What every section of `make bench` shares (agentbox_bench.cc, cluster_section.cc): the daemon
// under test, started on loopback with a fresh data dir, and the few calls every section makes.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/client.h"

extern char** environ;

namespace bench {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
using agentbox::client::Client;
using agentbox::client::ClientOptions;

inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The daemons running now, so that die() does not leave them behind.
inline std::vector<pid_t> g_daemons;

[[noreturn]] inline void die(const std::string& msg) {
  std::fprintf(stderr, "agentbox-bench: %s\n", msg.c_str());
  for (pid_t pid : g_daemons) ::kill(pid, SIGKILL);
  std::exit(1);
}

// Runs argv with posix_spawn and waits; returns the exit status (-1 if it could not start).
inline int spawn_wait(const std::vector<std::string>& args, bool quiet = true) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet) {
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  }
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Starts args[0] (the path of a program) with stdout to /dev/null, stderr kept: its pid. Dies when
// it cannot.
inline pid_t spawn_stdout_quiet(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) die("cannot start " + args[0]);
  return pid;
}

// The daemon under test: started on port 0 with a fresh data dir, stopped with SIGTERM.
class Daemon {
 public:
  // `dir` empty: a fresh one of this bench process. A given dir is reused as it is (its data
  // dir included: a restart) and kept when the daemon stops.
  // `listen` 127.0.0.1:0 (the ready file names the port) unless a node needs a known address.
  Daemon(const std::string& bin, const std::string& backend, const std::vector<std::string>& extra,
         fs::path dir = {}, const std::string& listen = "127.0.0.1:0")
      : bin_(bin) {
    if (dir.empty()) {
      static int n = 0;
      dir_ = fs::temp_directory_path() /
             ("agentbox-bench-" + std::to_string(getpid()) + "-" + std::to_string(n++));
      fs::remove_all(dir_);
      remove_dir_ = true;
    } else {
      dir_ = dir;
    }
    fs::create_directories(dir_);
    std::string ready = (dir_ / "ready").string();
    fs::remove(ready);
    started_ = Clock::now();
    std::vector<std::string> args = {
        bin,         "--listen", listen,         "--data-dir", (dir_ / "data").string(),
        "--backend", backend,    "--ready-file", ready,        "--log-level",
        "warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    // Its usage hint (stdout) would interleave with the figures; warnings (stderr) stay.
    pid_ = spawn_stdout_quiet(std::move(args));
    g_daemons.push_back(pid_);
    for (int i = 0; i < 60000; ++i) {
      std::ifstream f(ready);
      std::string addr;
      if (f && std::getline(f, addr) && !addr.empty()) {
        url_ = "http://" + addr;
        ready_ms_ = ms_since(started_);
        return;
      }
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) die("agentboxd exited at startup");
      usleep(1000);
    }
    die("agentboxd did not become ready");
  }
  ~Daemon() {
    kill(pid_, SIGTERM);
    int st;
    waitpid(pid_, &st, 0);
    std::erase(g_daemons, pid_);
    std::error_code ec;
    if (remove_dir_) fs::remove_all(dir_, ec);
  }
  const std::string& url() const { return url_; }
  // From spawn to the ready file naming the bound address.
  double ready_ms() const { return ready_ms_; }
  pid_t pid() const { return pid_; }
  fs::path dir() const { return dir_; }
  const std::string& bin() const { return bin_; }

 private:
  std::string bin_;
  fs::path dir_;
  bool remove_dir_ = false;
  pid_t pid_ = -1;
  std::string url_;
  Clock::time_point started_;
  double ready_ms_ = 0;
};

inline Client make_client(const Daemon& d) {
  return Client(ClientOptions{.server = d.url()});
}

inline void create_session(Client& c, const std::string& id) {
  nlohmann::json body = {{"id", id}};
  auto r = c.request("POST", "/v1/sessions", body.dump());
  if (!r || (r->status != 201 && r->status != 200)) {
    die("create session " + id + ": " + (r ? r->body : r.error().message));
  }
}

inline bool exec_true(Client& c, const std::string& id) {
  static const std::string body = R"({"argv":["/bin/true"]})";
  auto r = c.request("POST", "/v1/sessions/" + id + "/exec", body);
  if (!r || r->status != 200) {
    std::fprintf(stderr, "exec failed: %s\n", r ? r->body.c_str() : r.error().message.c_str());
    return false;
  }
  return r->body.find("\"exit_code\":0") != std::string::npos;
}

inline std::string ratio_note(double r, const char* target) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "ratio %.2f (target %s)", r, target);
  return buf;
}

}  // namespace bench
