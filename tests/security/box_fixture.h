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

namespace agentbox::security {

using nlohmann::json;

// The daemon shared by every test of the binary (started on first use).
Daemon& shared_daemon();

class Box {
 public:
  // Creates (or gets) session `id` with `spec` merged into the create body, and uploads the probe.
  Box(Daemon& d, std::string id, json spec = json::object());
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

// Host pids whose real uid is `uid` (the box's commands, seen from outside).
std::vector<pid_t> host_pids_of_uid(uid_t uid);
// A "Key:" line's value from /proc/<pid>/status, trimmed; "" if absent.
std::string proc_status(pid_t pid, const std::string& key);
// The whole of a host file ("" if unreadable).
std::string slurp(const std::string& path);
// Waits up to `seconds` for no process of `uid` to remain on the host.
bool wait_no_pids_of_uid(uid_t uid, double seconds);

}  // namespace agentbox::security
