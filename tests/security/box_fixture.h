#pragma once
// The security suite's harness: one agentboxd on the ns backend per test binary, sessions as
// `Box`es, the attacker binary (agentbox-probe) uploaded into each, and host-side views of the
// box's processes (/proc of the host, where the box cannot reach).

#include <sys/types.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/client.h"
#include "integration/daemon.h"
#include "support/support.h"

namespace agentbox::security {

using nlohmann::json;

// The bearer token of shared_daemon(). The daemon gets it the way an operator would give it, in
// its environment (AGENTBOX_TOKEN), so T0 can check that no box ever sees it. Boxes send it to
// every daemon (one without tokens ignores it).
inline constexpr char kSuiteToken[] = "agentbox-suite-token-5f1c0e7d9a";

// The daemon shared by every test of the binary (started on first use, stopped at exit).
Daemon& shared_daemon();

class Box {
 public:
  // Creates (or gets) session `id` with `spec` merged into the create body, and uploads the probe.
  Box(Daemon& d, std::string id, json spec = json::object(), std::string token = kSuiteToken);
  const std::string& id() const { return id_; }
  uid_t uid() const { return uid_; }
  client::Client& client() { return *client_; }
  // Host path of the workspace (data_dir/workspaces/<id>).
  std::string workspace_host() const;

  // POST exec; returns the reply object (exec result, or {"error":...} with "status").
  json exec(std::vector<std::string> argv, int timeout_sec = 30, json extra = json::object());
  json sh(const std::string& command, int timeout_sec = 30);
  // Runs `agentbox-probe ATTACK ARGS...` in the box; returns its first stdout line, or
  // "KILLED <signal>" when the probe died of a signal (seccomp's SIGSYS, OOM's SIGKILL).
  std::string probe(const std::string& attack, std::vector<std::string> args = {});

 private:
  Daemon& daemon_;
  std::string id_;
  uid_t uid_ = 0;
  std::unique_ptr<client::Client> client_;
};

// Host pids whose real uid is `uid` (the box's commands, seen from outside), of this test
// process's own daemons only.
std::vector<pid_t> host_pids_of_uid(uid_t uid);
// The host pid of the box's init (agentbox-init in the same pid namespace as host pid `member`),
// -1 if not found.
pid_t box_init_pid(pid_t member);
// Starts `sleep 600` in the box (it outlives its exec, by design) and returns its host pid.
pid_t start_sleeper(Box& b);
// The cgroup path (as in /proc/<pid>/cgroup) of `pid` for a v1 controller, or "" for the v2
// unified line ("" if absent).
std::string cgroup_of(pid_t pid, const std::string& controller);
// A "Key:" line's value from /proc/<pid>/status, trimmed; "" if absent.
std::string proc_status(pid_t pid, const std::string& key);
// The whole of a host file ("" if unreadable).
using testing::slurp;
// Waits up to `seconds` for no process of `uid` to remain on the host.
bool wait_no_pids_of_uid(uid_t uid, double seconds);

}  // namespace agentbox::security
