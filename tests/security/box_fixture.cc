#include "security/box_fixture.h"
#include "support/support.h"

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace agentbox::security {

Daemon& shared_daemon() {
  // Destroyed at exit, when the daemon is stopped with SIGTERM (it unmounts its quota disks and
  // removes its cgroups) and its temp dir removed. ctest runs every test case in a process of its
  // own, so a daemon left to die with the process (PR_SET_PDEATHSIG's SIGKILL) would leave its
  // dir, mounts and cgroups behind once per test.
  static std::unique_ptr<Daemon> d = [] {
    // Only this daemon inherits the token: set for its spawn, unset again at once.
    ::setenv("AGENTBOX_TOKEN", kSuiteToken, 1);
    auto started = std::make_unique<Daemon>(std::vector<std::string>{"--backend", "ns"});
    ::unsetenv("AGENTBOX_TOKEN");
    return started;
  }();
  return *d;
}

Box::Box(Daemon& d, std::string id, json spec, std::string token)
    : daemon_(d),
      id_(std::move(id)),
      client_(std::make_unique<client::Client>(d.options(std::move(token)))) {
  spec["id"] = id_;
  auto r = client_->request("POST", "/v1/sessions", spec.dump());
  if (!r || (r->status != 200 && r->status != 201)) {
    throw std::runtime_error("create session " + id_ + ": " + (r ? r->body : r.error().message));
  }
  json s = json::parse(r->body);
  uid_ = s.value("uid", 0u);
  std::ifstream f(AGENTBOX_PROBE, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto put =
      client_->request("PUT", "/v1/sessions/" + id_ + "/files?path=/workspace/.probe&mode=0755",
                       bytes, "application/octet-stream");
  if (!put || put->status != 200) {
    throw std::runtime_error("upload probe: " + (put ? put->body : put.error().message));
  }
}

std::string Box::workspace_host() const {
  return daemon_.data_dir() + "/workspaces/" + id_;
}

json Box::exec(std::vector<std::string> argv, int timeout_sec, json extra) {
  extra["argv"] = std::move(argv);
  extra["timeout_sec"] = timeout_sec;
  auto r = client_->request("POST", "/v1/sessions/" + id_ + "/exec", extra.dump());
  if (!r) return json{{"status", 0}, {"error", r.error().message}};
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded()) j = json{{"raw", r->body}};
  j["status"] = r->status;
  return j;
}

json Box::sh(const std::string& command, int timeout_sec) {
  return exec({"/bin/sh", "-c", command}, timeout_sec);
}

std::string Box::probe(const std::string& attack, std::vector<std::string> args) {
  std::vector<std::string> argv = {"/workspace/.probe", attack};
  argv.insert(argv.end(), args.begin(), args.end());
  json r = exec(argv, 30);
  if (r.value("status", 0) != 200) return "HTTP " + r.dump();
  if (!r["signal"].is_null()) return "KILLED " + std::to_string(r["signal"].get<int>());
  std::string out = r.value("stdout", "");
  auto nl = out.find('\n');
  return nl == std::string::npos ? out : out.substr(0, nl);
}

// Whether `ancestor` is `pid`'s parent, grandparent, ... (box processes hang below their init,
// the init below the daemon, the daemon below this test process).
bool descends_from(pid_t pid, pid_t ancestor) {
  for (int depth = 0; pid > 1 && depth < 64; ++depth) {
    std::string ppid = proc_status(pid, "PPid");
    if (ppid.empty()) return false;
    pid = static_cast<pid_t>(std::stol(ppid));
    if (pid == ancestor) return true;
  }
  return false;
}

std::vector<pid_t> host_pids_of_uid(uid_t uid) {
  // Only this test process's own boxes: test binaries run in parallel with daemons of their
  // own, and a session id (so its uid) may be the same in two of them.
  const pid_t self = ::getpid();
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    pid_t pid = static_cast<pid_t>(std::stol(e->d_name));
    std::string uids = proc_status(pid, "Uid");
    if (!uids.empty() && std::stoul(uids) == uid && descends_from(pid, self)) out.push_back(pid);
  }
  closedir(d);
  return out;
}

pid_t box_init_pid(pid_t member) {
  char want[128] = {0};
  std::string link = "/proc/" + std::to_string(member) + "/ns/pid";
  if (readlink(link.c_str(), want, sizeof want - 1) <= 0) return -1;
  DIR* d = opendir("/proc");
  if (!d) return -1;
  pid_t found = -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string dir = std::string("/proc/") + e->d_name;
    if (slurp(dir + "/comm") != "agentbox-init\n") continue;
    char ns[128] = {0};
    if (readlink((dir + "/ns/pid").c_str(), ns, sizeof ns - 1) <= 0) continue;
    // The init's own pid namespace is the box's (it is pid 1 there).
    if (std::string(ns) == want) {
      found = static_cast<pid_t>(std::stol(e->d_name));
      break;
    }
  }
  closedir(d);
  return found;
}

pid_t start_sleeper(Box& b) {
  auto r = b.sh("sleep 600 >/dev/null 2>&1 &");
  if (r.value("exit_code", -2) != 0) return -1;
  for (int i = 0; i < 100; ++i) {
    for (pid_t p : host_pids_of_uid(b.uid())) {
      if (slurp("/proc/" + std::to_string(p) + "/comm") == "sleep\n") return p;
    }
    usleep(20000);
  }
  return -1;
}

std::string cgroup_of(pid_t pid, const std::string& controller) {
  std::istringstream in(slurp("/proc/" + std::to_string(pid) + "/cgroup"));
  for (std::string line; std::getline(in, line);) {
    auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string ctl = line.substr(a + 1, b - a - 1);
    bool match = controller.empty() ? ctl.empty() : false;
    for (std::size_t s = 0; !controller.empty() && s <= ctl.size();) {
      std::size_t e = ctl.find(',', s);
      if (e == std::string::npos) e = ctl.size();
      if (ctl.substr(s, e - s) == controller) match = true;
      s = e + 1;
    }
    if (match) return line.substr(b + 1);
  }
  return "";
}

std::string proc_status(pid_t pid, const std::string& key) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      auto v = line.substr(key.size() + 1);
      auto b = v.find_first_not_of(" \t");
      return b == std::string::npos ? "" : v.substr(b);
    }
  }
  return "";
}

bool wait_no_pids_of_uid(uid_t uid, double seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (host_pids_of_uid(uid).empty()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return host_pids_of_uid(uid).empty();
}

}  // namespace agentbox::security
