#pragma once
// Workspace templates (API.md "Templates, snapshots, health, packages"; seed 004's YAML shape,
// extended): what a build puts into a workspace before it is frozen as a snapshot. This file
// only parses and validates; session/template_manager.h stores and builds them.
//
// Validation errors are kInvalid and name the YAML line and the field ("line 7: field
// 'python.dependencies[2]' must be a string"). Keys agentbox does not know are not an error
// but a warning returned with the template (never silence): a client sees what is not applied.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"

namespace agentbox::workspace {

struct TemplatePython {
  bool present = false;
  std::string version;  // "3.12": the build checks the box's python3 has it
  std::vector<std::string> dependencies;
  std::string index_url;
  std::vector<std::string> find_links;
};

struct TemplateNode {
  bool present = false;
  std::string version;  // "20": the build checks the box's node has this major version
  std::string runtime = "npm";  // npm | bun
  std::vector<std::pair<std::string, std::string>> dependencies;  // name -> version range
};

struct TemplateHealthCheck {
  std::string name;
  std::string command;
  std::string repair;
};

struct TemplateLimits {
  std::optional<std::uint64_t> memory_mb, cpu_percent, max_pids, disk_mb, max_open_files,
      cpu_time_sec, tmp_mb;
};

struct Template {
  std::string name;     // [A-Za-z0-9._-]{1,64}, no '@'
  std::string version;  // the author's label (seed 004: "1.0"); snapshots have their own numbers
  std::string description;
  // `image:` (API.md "Images"): the reference or digest of the image the build runs on and the
  // template's sessions get as their root; "" = the host's root. Checked (and pulled) by the
  // template manager, not here.
  std::string image;
  // Workspace-relative path -> content, in YAML order. Paths are normalised, relative, without
  // "." or ".." components (a path that would leave the workspace is refused at upload).
  std::vector<std::pair<std::string, std::string>> files;
  TemplatePython python;
  TemplateNode nodejs;
  std::vector<std::string> setup;  // shell lines, run in order in the build box
  std::map<std::string, std::string> env;  // for the build and for the template's sessions
  std::string shell = "/bin/sh";           // system.shell: runs each setup line
  std::string network = "none";            // security.network: none | allowlist | open
  std::vector<std::string> allow;          // security.allow (allowlist)
  TemplateLimits limits;                   // the build box's limits
  std::vector<TemplateHealthCheck> health;
  std::string source;  // the YAML as uploaded
};

struct ParsedTemplate {
  Template tmpl;
  std::vector<std::string> warnings;  // "line 3: unknown key 'foo' (ignored)"
};

// Parses and validates a template upload.
[[nodiscard]] Result<ParsedTemplate> parse_template(std::string_view yaml);

// The host paths template `t` hands its build box (python.find_links, local
// nodejs.dependencies, PIP_FIND_LINKS in env): one that exists on this host but an isolated box
// does not see (linux::host_path_seen_in_box with the daemon's `readonly_dirs`) is EINVAL
// naming the field and the readonly_dirs entry to add. A path this host does not have is the
// box's own (/workspace/wheels, /shared/...): not checked.
[[nodiscard]] Status check_host_paths(const Template& t,
                                      const std::vector<std::string>& readonly_dirs);

// Template names: 1..64 of [A-Za-z0-9._-], not "." or "..".
[[nodiscard]] Status validate_template_name(std::string_view name);

// "name" or "name@version" (version a positive integer) as a session's "template" field.
struct TemplateRef {
  std::string name;
  std::optional<std::uint64_t> version;
};
[[nodiscard]] Result<TemplateRef> parse_template_ref(std::string_view ref);

}  // namespace agentbox::workspace
