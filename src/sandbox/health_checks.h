#pragma once
// Workspace health and repair (issue 13, seed 004 "Workspace Health Checks"): built-in checks of a
// session's box and workspace, the template's own checks, and a repair step for each.
//
// Built-in checks, in this order (API.md "Templates, snapshots, health, packages"):
//   box        the box is up                                  (repair: none; the caller resumes)
//   workspace  the workspace is a directory                  (none)
//   disk       the workspace's filesystem is below 95% full   (none: the user must delete files)
//              (with limits.disk_mb that filesystem is the session's own capped disk)
//   python     only when pyproject.toml lists dependencies: .venv/bin/python runs and every
//              listed distribution is installed               (install_from_manifest(kPip))
//   node       only when package.json lists dependencies: node_modules/<name>/package.json
//              exists for each                                (install_from_manifest(kNpm))
//   marker     .workspace_configured exists, when the workspace was configured (a template, or a
//              manifest listing dependencies; installs write it) (write it again, once the
//              python/node repairs, if any, succeeded)
// then each template check (HealthCheck: ok when `command` exits 0; repair runs `repair`).
//
// Everything runs through the session's Sandbox (box commands as the session user, files beneath
// the box's root). Threading: coroutines on the caller's executor; the file calls inside are small
// blocking Sandbox calls.

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "sandbox/sandbox.h"

namespace agentbox::sandbox {

namespace asio = boost::asio;

// A template-defined check (template YAML `health: [{name, command, repair}]`): `command` is a
// shell line run in the box (cwd the workspace), ok when it exits 0; `repair` ("" = none) is a
// shell line run by repair() when the check failed.
struct HealthCheck {
  std::string name;
  std::string command;
  std::string repair;
};

struct CheckResult {
  std::string name;
  bool ok = false;
  std::string detail;
  // Set by repair() on the checks it tried to repair: what the repair step said.
  bool repair_attempted = false;
  std::string repair_detail;
};

struct HealthReport {
  bool healthy = true;
  std::vector<CheckResult> checks;
};

// Percent of the workspace filesystem in use at which the disk check fails.
inline constexpr int kDiskFailPercent = 95;

struct HealthTarget {
  // The session's box; null when it could not be had (the box check fails with `box_error`, the
  // other checks are not run).
  std::shared_ptr<sandbox::Sandbox> box;
  std::string box_error;
  std::vector<HealthCheck> template_checks;
  // The workspace was configured from a template: the marker is required even when no manifest
  // lists dependencies (it is anyway when one does).
  bool configured = false;
  // Per box command (a check or a repair step). Installs have their own, longer one.
  std::chrono::milliseconds check_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds install_timeout{std::chrono::minutes(10)};
};

// Every check, once.
asio::awaitable<HealthReport> check_health(const HealthTarget& target);

// check_health(); then the repair step of each failing check (in check order); then
// check_health() again, its results carrying what each repair said.
asio::awaitable<HealthReport> repair_health(const HealthTarget& target);

// The names of the built-in checks, in order.
const std::vector<std::string>& builtin_check_names();

}  // namespace agentbox::sandbox
