#pragma once
// Package installs into a workspace (issue 13, seed 004): Python packages into the workspace's
// venv (/workspace/.venv; `python3 -m venv`, then uv when it is on the box's PATH, else pip) and
// Node packages into /workspace/node_modules (bun when on PATH, else npm), each recorded in the
// workspace manifest (pyproject.toml [project] dependencies / package.json dependencies) so a
// repair or a template rebuild installs the same again (install_from_manifest).
//
// Everything runs through the session's Sandbox: the installer commands are box commands (so they
// run as the session user, under the session's limits and network policy: the egress proxy's
// variables are in the box's environment), and the manifests are read and written with the
// Sandbox file API (beneath the box's root, owned by the session user; never through a host path
// a box user could have replaced with a symlink).
//
// Bad input is EINVAL naming the field and the package. A failed install is an InstallResult with
// a non-zero exit_code and `error` naming the packages; then the manifest is untouched and a venv
// this call created is removed again (nothing half-written).
//
// Threading: the coroutines run on the caller's executor; the manifest reads and writes inside
// them are small blocking file calls (as the Sandbox file API is everywhere).

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"
#include "sandbox/sandbox.h"

namespace agentbox::sandbox {

namespace asio = boost::asio;

// In-box names, relative to the workspace.
inline constexpr char kPyproject[] = "pyproject.toml";
inline constexpr char kPackageJson[] = "package.json";
inline constexpr char kVenvDir[] = ".venv";
inline constexpr char kNodeModulesDir[] = "node_modules";
inline constexpr char kConfiguredMarker[] = ".workspace_configured";

enum class PackageManager { kPip, kNpm };
// "pip" | "npm".
std::string_view manager_name(PackageManager m);
// "pip" -> kPip, "npm" -> kNpm; else EINVAL naming field `field` and the value.
Result<PackageManager> parse_manager(std::string_view name, std::string_view field = "manager");

// Where pip finds packages (seed 004's python.index_url / find_links). Recorded in pyproject.toml
// under [tool.agentbox] with persist, so a reinstall looks in the same places.
struct PythonSource {
  std::string index_url;                // "" = the tool's default
  std::vector<std::string> find_links;  // dirs (in-box paths) or URLs
  bool no_index = false;                // only find_links: never an index
  bool empty() const { return index_url.empty() && find_links.empty() && !no_index; }
};

struct InstallRequest {
  PackageManager manager = PackageManager::kPip;
  // Requirement specs as the tool takes them: "requests==2.31", "tiny", "left-pad@1.3.0",
  // "/workspace/pkgs/tiny-1.0.0.tgz". None may be empty, start with '-' or hold control chars.
  std::vector<std::string> packages;
  bool persist = true;  // record in the manifest
  PythonSource python;  // pip only (EINVAL for npm when set)
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  std::map<std::string, std::string> env;  // added to the box's environment for the install
};

struct InstallResult {
  int exit_code = 0;
  bool timed_out = false;
  std::string stdout_data;
  std::string stderr_data;
  // The manifest entries this install wrote: pip requirement specs as given; npm "name@spec"
  // as npm (or bun) saved them. Empty without persist or when the install failed.
  std::vector<std::string> recorded;
  // "" on success; else one line naming what failed ("pip install of nosuchpkg failed (exit 1):
  // ERROR: No matching distribution found for nosuchpkg").
  std::string error;
};

// EINVAL naming the bad field ("packages[2]", "manager", "find_links[0]") or OK.
Status validate_install(const InstallRequest& req);

// Installs req.packages in `box` (see the top of the file). An Error only when the box could not
// run the installer or a manifest could not be read/written; a failed install is a result.
asio::awaitable<Result<InstallResult>> install_packages(sandbox::Sandbox& box, InstallRequest req);

// Installs what the manifest lists: pip: the venv is created if missing and the dependencies of
// pyproject.toml installed (with its [tool.agentbox] source); npm: `npm install` (or `bun
// install`) from package.json. No manifest or no dependencies: nothing runs, exit_code 0.
asio::awaitable<Result<InstallResult>> install_from_manifest(
    sandbox::Sandbox& box, PackageManager manager,
    std::chrono::milliseconds timeout = std::chrono::minutes(10));

// ---- Manifests ----

struct PythonManifest {
  std::vector<std::string> dependencies;  // [project] dependencies
  PythonSource source;                    // [tool.agentbox]
};

// Reads the parts of pyproject.toml above (a small TOML subset: tables, key = string | array of
// strings | bool | other values skipped). Malformed: EINVAL naming the line.
Result<PythonManifest> parse_pyproject(std::string_view text);
// `old_text` ("" = none) with [project] dependencies and [tool.agentbox] replaced by `m` (the
// rest of the file, comments included, kept as it was; a new file gets name and version).
Result<std::string> render_pyproject(std::string_view old_text, const PythonManifest& m);
// `deps` with each of `add` merged in: an entry for the same project (PEP 503 normalised name)
// is replaced in place, a new one appended.
std::vector<std::string> merge_requirements(std::vector<std::string> deps,
                                            const std::vector<std::string>& add);
// The normalised project name of a requirement ("Foo_Bar>=1" -> "foo-bar"; a wheel path ->
// its distribution name; "" when none can be told).
std::string requirement_name(std::string_view req);

// package.json "dependencies" (name -> spec, in file order). Malformed: EINVAL.
Result<std::vector<std::pair<std::string, std::string>>> parse_package_json(std::string_view text);
// `old_text` ("" = a new {"name": "workspace", ...}) with "dependencies" set to `deps` (other
// fields kept, in order).
Result<std::string> render_package_json(
    std::string_view old_text, const std::vector<std::pair<std::string, std::string>>& deps);

// The manifests of the box's workspace ("" / empty when the file is missing).
Result<PythonManifest> read_python_manifest(sandbox::Sandbox& box);
Status write_python_manifest(sandbox::Sandbox& box, const PythonManifest& m);
Result<std::vector<std::pair<std::string, std::string>>> read_node_manifest(sandbox::Sandbox& box);
Status write_node_manifest(sandbox::Sandbox& box,
                           const std::vector<std::pair<std::string, std::string>>& deps);

// The in-box path of `name` (relative) in the box's workspace: "/workspace/" + name on ns.
std::string workspace_path(const sandbox::Sandbox& box, std::string_view name);

// Writes the `.workspace_configured` marker (its content: the UTC time).
Status write_configured_marker(sandbox::Sandbox& box);

}  // namespace agentbox::sandbox
