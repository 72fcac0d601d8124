#include "sandbox/health_checks.h"

#include <algorithm>
#include <cstdio>
#include <functional>

#include "sandbox/installers.h"

namespace agentbox::sandbox {
namespace {

using sandbox::ExecResult;
using sandbox::ExecSpec;
using sandbox::Sandbox;

// Prints the names (argv[1:]) whose distribution is not installed in the venv.
constexpr char kMissingDistributions[] = R"py(import sys
import importlib.metadata as md
missing = []
for name in sys.argv[1:]:
    try:
        md.version(name)
    except md.PackageNotFoundError:
        missing.append(name)
print(" ".join(missing))
sys.exit(1 if missing else 0)
)py";

std::string last_line(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) {
    s.remove_suffix(1);
  }
  std::size_t nl = s.rfind('\n');
  std::string line(nl == std::string_view::npos ? s : s.substr(nl + 1));
  if (line.size() > 300) line = line.substr(0, 300) + "...";
  return line;
}

// "exit N: <last line of stderr or stdout>" for a failed command.
std::string failure_detail(const ExecResult& r) {
  std::string why = r.timed_out ? "timed out" : "exit " + std::to_string(r.exit_code);
  std::string line = last_line(r.stderr_data);
  if (line.empty()) line = last_line(r.stdout_data);
  return line.empty() ? why : why + ": " + line;
}

// A check's box command: argv when given, else the shell line.
ExecSpec check_spec(std::vector<std::string> argv, std::string command,
                    std::chrono::milliseconds timeout) {
  ExecSpec spec;
  spec.argv = std::move(argv);
  spec.command = std::move(command);
  spec.timeout = timeout;
  spec.max_output_bytes = 16 << 10;
  return spec;
}

struct Repaired {
  bool ok = false;
  std::string detail;
};

// One check with its repair. The checks after "box" need a box.
struct Check {
  std::string name;
  std::function<asio::awaitable<CheckResult>(Sandbox&)> check;
  // Null: nothing to repair with.
  std::function<asio::awaitable<Repaired>(Sandbox&)> repair;
};

CheckResult result(const std::string& name, bool ok, std::string detail) {
  CheckResult r;
  r.name = name;
  r.ok = ok;
  r.detail = std::move(detail);
  return r;
}

asio::awaitable<CheckResult> check_workspace(Sandbox& box) {
  auto st = box.stat(box.workspace());
  if (!st) co_return result("workspace", false, st.error().message);
  co_return result("workspace", st->is_dir,
                   st->is_dir ? box.workspace() + " is a directory"
                              : box.workspace() + " is not a directory");
}

// `required`: the workspace was configured (a template, or manifests listing dependencies); a
// workspace nothing configured needs no marker.
asio::awaitable<CheckResult> check_marker(Sandbox& box, bool required) {
  const std::string path = workspace_path(box, kConfiguredMarker);
  auto st = box.stat(path);
  if (!st && st.error().code == Code::kNotFound && !required) {
    co_return result("marker", true, "no template and no dependencies: nothing to configure");
  }
  if (!st) {
    co_return result("marker", false,
                     st.error().code == Code::kNotFound ? path + " is missing"
                                                        : st.error().message);
  }
  co_return result("marker", !st->is_dir, st->is_dir ? path + " is a directory" : path + " exists");
}

asio::awaitable<Repaired> repair_marker(Sandbox& box) {
  auto st = write_configured_marker(box);
  co_return Repaired{st.has_value(),
                     st ? "wrote " + workspace_path(box, kConfiguredMarker) : st.error().message};
}

asio::awaitable<CheckResult> check_disk(Sandbox& box, std::chrono::milliseconds timeout) {
  ExecSpec spec = check_spec({"stat", "-f", "-c", "%b %f %a %S", box.workspace()}, "", timeout);
  auto r = co_await box.exec(std::move(spec), nullptr);
  if (!r) co_return result("disk", false, r.error().message);
  if (r->exit_code != 0) co_return result("disk", false, "stat -f: " + failure_detail(*r));
  unsigned long long blocks = 0, free_blocks = 0, avail = 0, bsize = 0;
  if (std::sscanf(r->stdout_data.c_str(), "%llu %llu %llu %llu", &blocks, &free_blocks, &avail,
                  &bsize) != 4 ||
      blocks == 0 || bsize == 0) {
    co_return result("disk", false, "stat -f said: " + last_line(r->stdout_data));
  }
  // As df computes Use%: used / (used + available to users), rounded up.
  unsigned long long used = blocks - free_blocks;
  unsigned long long base = used + avail;
  unsigned long long pct = base == 0 ? 100 : (used * 100 + base - 1) / base;
  unsigned long long total_mib = (blocks * bsize) >> 20;
  unsigned long long used_mib = (used * bsize) >> 20;
  bool ok = pct < static_cast<unsigned long long>(kDiskFailPercent);
  co_return result("disk", ok,
                   std::to_string(pct) + "% used (" + std::to_string(used_mib) + " of " +
                       std::to_string(total_mib) + " MiB)" +
                       (ok ? "" : "; at " + std::to_string(kDiskFailPercent) +
                                      "% or more: delete files or raise limits.disk_mb"));
}

asio::awaitable<CheckResult> check_python(Sandbox& box, std::vector<std::string> deps,
                                          std::chrono::milliseconds timeout) {
  const std::string python = workspace_path(box, std::string(kVenvDir) + "/bin/python");
  if (auto st = box.stat(python); !st) {
    co_return result("python", false,
                     workspace_path(box, kVenvDir) + " has no bin/python (" + std::to_string(deps.size()) +
                         " dependencies in pyproject.toml)");
  }
  std::vector<std::string> argv = {python, "-c", kMissingDistributions};
  for (const auto& d : deps) {
    std::string name = requirement_name(d);
    if (!name.empty()) argv.push_back(name);
  }
  ExecSpec spec = check_spec(std::move(argv), "", timeout);
  auto r = co_await box.exec(std::move(spec), nullptr);
  if (!r) co_return result("python", false, r.error().message);
  if (r->exit_code == 1 && !last_line(r->stdout_data).empty()) {
    co_return result("python", false, "not installed: " + last_line(r->stdout_data));
  }
  if (r->exit_code != 0) co_return result("python", false, python + ": " + failure_detail(*r));
  co_return result("python", true,
                   python + " runs; the " + std::to_string(deps.size()) +
                       " dependencies of pyproject.toml are installed");
}

asio::awaitable<CheckResult> check_node(Sandbox& box,
                                        std::vector<std::pair<std::string, std::string>> deps) {
  std::string missing;
  for (const auto& [name, spec] : deps) {
    (void)spec;
    std::string pj = workspace_path(box, std::string(kNodeModulesDir) + "/" + name + "/package.json");
    if (!box.stat(pj)) missing += (missing.empty() ? "" : " ") + name;
  }
  if (!missing.empty()) {
    co_return result("node", false, "not in " + workspace_path(box, kNodeModulesDir) + ": " + missing);
  }
  co_return result("node", true,
                   "the " + std::to_string(deps.size()) +
                       " dependencies of package.json are in node_modules");
}

asio::awaitable<Repaired> repair_install(Sandbox& box, PackageManager m,
                                         std::chrono::milliseconds timeout) {
  auto r = co_await install_from_manifest(box, m, timeout);
  if (!r) co_return Repaired{false, r.error().message};
  if (r->exit_code != 0) co_return Repaired{false, r->error};
  co_return Repaired{true, m == PackageManager::kPip ? "reinstalled from pyproject.toml"
                                                     : "reinstalled from package.json"};
}

asio::awaitable<CheckResult> check_template(Sandbox& box, HealthCheck hc,
                                            std::chrono::milliseconds timeout) {
  ExecSpec spec = check_spec({}, hc.command, timeout);
  auto r = co_await box.exec(std::move(spec), nullptr);
  if (!r) co_return result(hc.name, false, r.error().message);
  if (r->exit_code != 0) co_return result(hc.name, false, failure_detail(*r));
  std::string line = last_line(r->stdout_data);
  co_return result(hc.name, true, line.empty() ? "ok" : line);
}

asio::awaitable<Repaired> repair_template(Sandbox& box, HealthCheck hc,
                                          std::chrono::milliseconds timeout) {
  ExecSpec spec = check_spec({}, hc.repair, timeout);
  auto r = co_await box.exec(std::move(spec), nullptr);
  if (!r) co_return Repaired{false, r.error().message};
  if (r->exit_code != 0) co_return Repaired{false, "repair failed, " + failure_detail(*r)};
  co_return Repaired{true, "repair ran"};
}

// The checks that apply to this box now (python/node only when their manifest lists
// dependencies; a manifest that cannot be read is itself a failing check).
std::vector<Check> plan(Sandbox& box, const HealthTarget& t, std::vector<CheckResult>* fixed) {
  std::vector<Check> out;
  auto timeout = t.check_timeout;
  auto install_timeout = t.install_timeout;
  out.push_back({"workspace", [](Sandbox& b) { return check_workspace(b); }, nullptr});
  out.push_back({"disk", [timeout](Sandbox& b) { return check_disk(b, timeout); }, nullptr});
  bool configured = t.configured;
  auto py = read_python_manifest(box);
  if (!py) {
    fixed->push_back(result("python", false, py.error().message));
  } else if (!py->dependencies.empty()) {
    configured = true;
    out.push_back({"python",
                   [deps = py->dependencies, timeout](Sandbox& b) {
                     return check_python(b, deps, timeout);
                   },
                   [install_timeout](Sandbox& b) {
                     return repair_install(b, PackageManager::kPip, install_timeout);
                   }});
  }
  auto node = read_node_manifest(box);
  if (!node) {
    fixed->push_back(result("node", false, node.error().message));
  } else if (!node->empty()) {
    configured = true;
    out.push_back({"node", [deps = *node](Sandbox& b) { return check_node(b, deps); },
                   [install_timeout](Sandbox& b) {
                     return repair_install(b, PackageManager::kNpm, install_timeout);
                   }});
  }
  // After the installs: repair() writes the marker only once they are back.
  out.push_back({"marker", [configured](Sandbox& b) { return check_marker(b, configured); },
                 [](Sandbox& b) { return repair_marker(b); }});
  for (const HealthCheck& hc : t.template_checks) {
    Check c{hc.name, [hc, timeout](Sandbox& b) { return check_template(b, hc, timeout); },
            nullptr};
    if (!hc.repair.empty()) {
      c.repair = [hc, timeout](Sandbox& b) { return repair_template(b, hc, timeout); };
    }
    out.push_back(std::move(c));
  }
  return out;
}

struct Run {
  HealthReport report;
  std::vector<Check> checks;  // parallel to report.checks after the first ("box") entry
};

asio::awaitable<Run> run_checks(const HealthTarget& t) {
  Run out;
  auto add = [&out](CheckResult r) {
    out.report.healthy = out.report.healthy && r.ok;
    out.report.checks.push_back(std::move(r));
  };
  if (!t.box) {
    add(result("box", false, t.box_error.empty() ? "the box is not up" : t.box_error));
    co_return out;
  }
  Sandbox& box = *t.box;
  add(result("box", true, "backend " + std::string(box.name()) + " is up"));
  std::vector<CheckResult> unreadable;
  out.checks = plan(box, t, &unreadable);
  for (Check& c : out.checks) {
    CheckResult r = co_await c.check(box);
    r.name = c.name;
    add(std::move(r));
  }
  for (CheckResult& r : unreadable) add(std::move(r));
  co_return out;
}

}  // namespace

const std::vector<std::string>& builtin_check_names() {
  static const std::vector<std::string> names = {"box",    "workspace", "disk",
                                                 "python", "node",      "marker"};
  return names;
}

asio::awaitable<HealthReport> check_health(const HealthTarget& target) {
  Run r = co_await run_checks(target);
  co_return std::move(r.report);
}

asio::awaitable<HealthReport> repair_health(const HealthTarget& target) {
  Run first = co_await run_checks(target);
  if (first.report.healthy || !target.box) co_return std::move(first.report);
  std::vector<std::pair<std::string, std::string>> repaired;  // name -> what the repair said
  std::string install_failed;  // the python/node repair that failed: no marker then
  for (Check& c : first.checks) {
    auto failed = std::find_if(first.report.checks.begin(), first.report.checks.end(),
                               [&](const CheckResult& r) { return r.name == c.name && !r.ok; });
    if (failed == first.report.checks.end()) continue;
    if (!c.repair) {
      repaired.emplace_back(c.name, "no repair step for this check");
      continue;
    }
    if (c.name == "marker" && !install_failed.empty()) {
      repaired.emplace_back(c.name, "not written: the " + install_failed + " repair failed");
      continue;
    }
    Repaired said = co_await c.repair(*target.box);
    if (!said.ok && (c.name == "python" || c.name == "node")) install_failed = c.name;
    repaired.emplace_back(c.name, std::move(said.detail));
  }
  Run second = co_await run_checks(target);
  for (CheckResult& r : second.report.checks) {
    for (const auto& [name, said] : repaired) {
      if (name == r.name) {
        r.repair_attempted = true;
        r.repair_detail = said;
      }
    }
  }
  co_return std::move(second.report);
}

}  // namespace agentbox::sandbox
