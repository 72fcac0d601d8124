#include "workspace/templates.h"

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <set>

#include "common/validate.h"
#include "linux/mounts.h"

namespace agentbox::workspace {
namespace {

// Collects the first error and every warning while walking the document.
struct Walker {
  std::vector<std::string> warnings;

  static std::string at(const YAML::Node& n) {
    int line = n.Mark().line;
    return line >= 0 ? "line " + std::to_string(line + 1) + ": " : "";
  }
  static Error bad(const YAML::Node& n, const std::string& field, const std::string& what) {
    return Error::make(Code::kInvalid, at(n) + "field '" + field + "' " + what);
  }
  // Warns about every key of map `n` not in `known`.
  void unknown_keys(const YAML::Node& n, const std::string& prefix,
                    std::initializer_list<std::string_view> known) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      std::string key = it->first.Scalar();
      bool ok = false;
      for (std::string_view k : known) ok = ok || k == key;
      if (!ok) {
        warnings.push_back(at(it->first) + "unknown key '" + prefix + key +
                           "' (ignored: not applied to the workspace)");
      }
    }
  }
};

Result<std::string> scalar(const YAML::Node& n, const std::string& field) {
  if (!n.IsScalar()) return std::unexpected(Walker::bad(n, field, "must be a string"));
  std::string s = n.Scalar();
  if (s.find('\0') != std::string::npos) {
    return std::unexpected(Walker::bad(n, field, "must not contain NUL"));
  }
  return s;
}

Result<std::vector<std::string>> string_list(const YAML::Node& n, const std::string& field) {
  if (!n.IsSequence()) return std::unexpected(Walker::bad(n, field, "must be a list of strings"));
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n.size(); ++i) {
    out.push_back(AB_TRY(scalar(n[i], field + "[" + std::to_string(i) + "]")));
  }
  return out;
}

Result<std::vector<std::pair<std::string, std::string>>> string_map(const YAML::Node& n,
                                                                    const std::string& field) {
  if (!n.IsMap()) return std::unexpected(Walker::bad(n, field, "must be a mapping"));
  std::vector<std::pair<std::string, std::string>> out;
  for (auto it = n.begin(); it != n.end(); ++it) {
    std::string key = AB_TRY(scalar(it->first, field + " key"));
    out.emplace_back(key, AB_TRY(scalar(it->second, field + "." + key)));
  }
  return out;
}

Result<std::uint64_t> number(const YAML::Node& n, const std::string& field,
                             const validate::LimitBounds& b) {
  std::string s = AB_TRY(scalar(n, field));
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) {
    return std::unexpected(Walker::bad(n, field, "must be a whole number, not \"" + s + "\""));
  }
  if (v < b.min || v > b.max) {
    return std::unexpected(Walker::bad(n, field,
                                       "must be between " + std::to_string(b.min) + " and " +
                                           std::to_string(b.max)));
  }
  return v;
}

// A files key: relative, normalised, confined to the workspace.
Status file_path(const YAML::Node& n, const std::string& path) {
  std::string field = "files." + path;
  if (path.empty() || path.size() > 4096) return std::unexpected(Walker::bad(n, field, "bad path"));
  if (path.front() == '/') {
    return std::unexpected(
        Walker::bad(n, field, "must be relative to the workspace, not an absolute path"));
  }
  std::size_t start = 0;
  for (;;) {
    std::size_t slash = path.find('/', start);
    std::string_view comp = std::string_view(path).substr(
        start, slash == std::string::npos ? std::string::npos : slash - start);
    if (comp.empty() || comp == "." || comp == "..") {
      return std::unexpected(Walker::bad(
          n, field, "must be a normalised path inside the workspace (no '', '.' or '..' parts)"));
    }
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return {};
}

Status parse_python(Walker& w, const YAML::Node& n, TemplatePython* py) {
  if (!n.IsMap()) return std::unexpected(Walker::bad(n, "python", "must be a mapping"));
  w.unknown_keys(n, "python.", {"version", "dependencies", "index_url", "find_links"});
  py->present = true;
  if (n["version"]) py->version = AB_TRY(scalar(n["version"], "python.version"));
  if (n["dependencies"]) {
    py->dependencies = AB_TRY(string_list(n["dependencies"], "python.dependencies"));
  }
  for (std::size_t i = 0; i < py->dependencies.size(); ++i) {
    const std::string& d = py->dependencies[i];
    if (d.empty() || d.front() == '-') {
      return std::unexpected(Walker::bad(n["dependencies"][i],
                                         "python.dependencies[" + std::to_string(i) + "]",
                                         "must be a requirement, not an option"));
    }
  }
  if (n["index_url"]) py->index_url = AB_TRY(scalar(n["index_url"], "python.index_url"));
  if (n["find_links"]) {
    const YAML::Node& f = n["find_links"];
    if (f.IsScalar()) {
      py->find_links.push_back(f.Scalar());
    } else {
      py->find_links = AB_TRY(string_list(f, "python.find_links"));
    }
  }
  return {};
}

Status parse_node(Walker& w, const YAML::Node& n, TemplateNode* node) {
  if (!n.IsMap()) return std::unexpected(Walker::bad(n, "nodejs", "must be a mapping"));
  w.unknown_keys(n, "nodejs.", {"version", "runtime", "dependencies"});
  node->present = true;
  if (n["version"]) node->version = AB_TRY(scalar(n["version"], "nodejs.version"));
  if (n["runtime"]) {
    node->runtime = AB_TRY(scalar(n["runtime"], "nodejs.runtime"));
    if (node->runtime != "npm" && node->runtime != "bun") {
      return std::unexpected(
          Walker::bad(n["runtime"], "nodejs.runtime", "must be npm or bun, not \"" +
                                                          node->runtime + "\""));
    }
  }
  if (n["dependencies"]) {
    node->dependencies = AB_TRY(string_map(n["dependencies"], "nodejs.dependencies"));
  }
  for (const auto& [name, range] : node->dependencies) {
    if (name.empty() || name.front() == '-') {
      return std::unexpected(Walker::bad(n["dependencies"], "nodejs.dependencies." + name,
                                         "must be a package name, not an option"));
    }
  }
  return {};
}

Status parse_security(Walker& w, const YAML::Node& n, Template* t) {
  if (!n.IsMap()) return std::unexpected(Walker::bad(n, "security", "must be a mapping"));
  w.unknown_keys(n, "security.", {"network", "network_enabled", "allow"});
  if (n["network"] && n["network_enabled"]) {
    return std::unexpected(Walker::bad(n["network_enabled"], "security.network_enabled",
                                       "conflicts with security.network (give one)"));
  }
  if (n["network_enabled"]) {
    std::string v = AB_TRY(scalar(n["network_enabled"], "security.network_enabled"));
    if (v == "true") {
      t->network = "open";
    } else if (v == "false") {
      t->network = "none";
    } else {
      return std::unexpected(
          Walker::bad(n["network_enabled"], "security.network_enabled", "must be true or false"));
    }
  }
  if (n["network"]) {
    t->network = AB_TRY(scalar(n["network"], "security.network"));
    if (t->network != "none" && t->network != "allowlist" && t->network != "open") {
      return std::unexpected(Walker::bad(n["network"], "security.network",
                                         "must be none, allowlist or open, not \"" + t->network +
                                             "\""));
    }
  }
  if (n["allow"]) t->allow = AB_TRY(string_list(n["allow"], "security.allow"));
  if (!t->allow.empty() && t->network != "allowlist") {
    return std::unexpected(
        Walker::bad(n["allow"], "security.allow", "needs security.network: allowlist"));
  }
  return {};
}

Status parse_limits(Walker& w, const YAML::Node& n, TemplateLimits* l) {
  if (!n.IsMap()) return std::unexpected(Walker::bad(n, "limits", "must be a mapping"));
  w.unknown_keys(n, "limits.", {"memory_mb", "cpu_percent", "max_pids", "disk_mb",
                                "max_open_files", "cpu_time_sec", "tmp_mb"});
  struct Item {
    const char* key;
    const validate::LimitBounds& b;
    std::optional<std::uint64_t>* out;
  };
  for (const Item& i : {Item{"memory_mb", validate::kMemoryMb, &l->memory_mb},
                        Item{"cpu_percent", validate::kCpuPercent, &l->cpu_percent},
                        Item{"max_pids", validate::kMaxPids, &l->max_pids},
                        Item{"disk_mb", validate::kDiskMb, &l->disk_mb},
                        Item{"max_open_files", validate::kMaxOpenFiles, &l->max_open_files},
                        Item{"cpu_time_sec", validate::kCpuTimeSec, &l->cpu_time_sec},
                        Item{"tmp_mb", validate::kTmpMb, &l->tmp_mb}}) {
    if (n[i.key]) *i.out = AB_TRY(number(n[i.key], std::string("limits.") + i.key, i.b));
  }
  return {};
}

Status parse_health(Walker& w, const YAML::Node& n, std::vector<TemplateHealthCheck>* out) {
  if (!n.IsSequence()) return std::unexpected(Walker::bad(n, "health", "must be a list"));
  std::set<std::string> names;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const YAML::Node& c = n[i];
    std::string f = "health[" + std::to_string(i) + "]";
    if (!c.IsMap()) return std::unexpected(Walker::bad(c, f, "must be a mapping"));
    w.unknown_keys(c, f + ".", {"name", "command", "repair"});
    TemplateHealthCheck h;
    if (!c["name"]) return std::unexpected(Walker::bad(c, f + ".name", "is required"));
    if (!c["command"]) return std::unexpected(Walker::bad(c, f + ".command", "is required"));
    h.name = AB_TRY(scalar(c["name"], f + ".name"));
    h.command = AB_TRY(scalar(c["command"], f + ".command"));
    if (c["repair"]) h.repair = AB_TRY(scalar(c["repair"], f + ".repair"));
    if (!names.insert(h.name).second) {
      return std::unexpected(Walker::bad(c["name"], f + ".name", "repeats \"" + h.name + "\""));
    }
    out->push_back(std::move(h));
  }
  return {};
}

Result<ParsedTemplate> parse_doc(const YAML::Node& root, std::string_view yaml) {
  if (!root.IsMap()) {
    return fail(Code::kInvalid, "template: the YAML document must be a mapping (name: ..., ...)");
  }
  Walker w;
  w.unknown_keys(root, "",
                 {"name", "version", "description", "files", "python", "nodejs", "setup", "env",
                  "system", "security", "limits", "health", "image"});
  ParsedTemplate out;
  Template& t = out.tmpl;
  t.source = std::string(yaml);
  if (!root["name"]) return fail(Code::kInvalid, "template: field 'name' is required");
  t.name = AB_TRY(scalar(root["name"], "name"));
  if (auto st = validate_template_name(t.name); !st) {
    return std::unexpected(Walker::bad(root["name"], "name", st.error().message));
  }
  if (root["version"]) t.version = AB_TRY(scalar(root["version"], "version"));
  if (root["description"]) t.description = AB_TRY(scalar(root["description"], "description"));
  if (root["image"]) {
    t.image = AB_TRY(scalar(root["image"], "image"));
    if (t.image.empty() || t.image.size() > 1024) {
      return std::unexpected(
          Walker::bad(root["image"], "image", "must be an image reference or digest"));
    }
  }
  if (const YAML::Node& f = root["files"]) {
    t.files = AB_TRY(string_map(f, "files"));
    std::set<std::string> seen;
    for (auto it = f.begin(); it != f.end(); ++it) {
      AB_TRY(file_path(it->first, it->first.Scalar()));
      if (!seen.insert(it->first.Scalar()).second) {
        return std::unexpected(Walker::bad(it->first, "files." + it->first.Scalar(), "repeats"));
      }
    }
    // A file may not also be a directory of another ("a" and "a/b").
    for (const auto& [p, c] : t.files) {
      for (std::size_t s = p.find('/'); s != std::string::npos; s = p.find('/', s + 1)) {
        if (seen.count(p.substr(0, s))) {
          return fail(Code::kInvalid, "template: field 'files." + p + "' lies under the file '" +
                                          p.substr(0, s) + "'");
        }
      }
    }
  }
  if (root["python"]) AB_TRY(parse_python(w, root["python"], &t.python));
  if (root["nodejs"]) AB_TRY(parse_node(w, root["nodejs"], &t.nodejs));
  if (const YAML::Node& s = root["setup"]) {
    if (s.IsScalar()) {
      t.setup.push_back(AB_TRY(scalar(s, "setup")));
    } else {
      t.setup = AB_TRY(string_list(s, "setup"));
    }
  }
  if (const YAML::Node& e = root["env"]) {
    for (auto& [k, v] : AB_TRY(string_map(e, "env"))) t.env[k] = v;
    if (auto st = validate::env(t.env, "env"); !st) {
      return std::unexpected(Walker::bad(e, "env", st.error().message));
    }
  }
  if (const YAML::Node& s = root["system"]) {
    if (!s.IsMap()) return std::unexpected(Walker::bad(s, "system", "must be a mapping"));
    w.unknown_keys(s, "system.", {"shell"});
    if (s["shell"]) {
      t.shell = AB_TRY(scalar(s["shell"], "system.shell"));
      if (t.shell.empty() || t.shell.front() != '/') {
        return std::unexpected(
            Walker::bad(s["shell"], "system.shell", "must be an absolute path in the box"));
      }
    }
  }
  if (root["security"]) AB_TRY(parse_security(w, root["security"], &t));
  if (root["limits"]) AB_TRY(parse_limits(w, root["limits"], &t.limits));
  if (root["health"]) AB_TRY(parse_health(w, root["health"], &t.health));
  out.warnings = std::move(w.warnings);
  return out;
}

}  // namespace

Status validate_template_name(std::string_view name) {
  if (name.empty() || name.size() > 64 || name == "." || name == "..") {
    return fail(Code::kInvalid, "invalid template name \"" + std::string(name) +
                                    "\" (1 to 64 of A-Z a-z 0-9 . _ -)");
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return fail(Code::kInvalid, "invalid template name \"" + std::string(name) +
                                      "\" (1 to 64 of A-Z a-z 0-9 . _ -)");
    }
  }
  return {};
}

Result<TemplateRef> parse_template_ref(std::string_view ref) {
  TemplateRef out;
  auto at = ref.find('@');
  out.name = std::string(ref.substr(0, at));
  if (auto st = validate_template_name(out.name); !st) {
    return fail(Code::kInvalid, "field 'template': " + st.error().message);
  }
  if (at != std::string_view::npos) {
    std::string_view v = ref.substr(at + 1);
    std::uint64_t n = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || p != v.data() + v.size() || n == 0) {
      return fail(Code::kInvalid, "field 'template': version in \"" + std::string(ref) +
                                      "\" must be a snapshot version number (name@3)");
    }
    out.version = n;
  }
  return out;
}

Result<ParsedTemplate> parse_template(std::string_view yaml) {
  if (yaml.size() > (4u << 20)) return fail(Code::kTooBig, "template: over 4 MiB of YAML");
  try {
    YAML::Node root = YAML::Load(std::string(yaml));
    return parse_doc(root, yaml);
  } catch (const YAML::Exception& e) {
    std::string where = e.mark.is_null() ? std::string()
                                         : "line " + std::to_string(e.mark.line + 1) + ": ";
    return fail(Code::kInvalid, "template: malformed YAML: " + where + e.msg);
  } catch (const std::exception& e) {
    return fail(Code::kInvalid, std::string("template: malformed YAML: ") + e.what());
  }
}

Status check_host_paths(const Template& t, const std::vector<std::string>& readonly_dirs) {
  auto check = [&](std::string path, const std::string& field) -> Status {
    if (path.starts_with("file://")) path.erase(0, 7);
    if (path.empty() || path.front() != '/') return {};  // a URL, a name: not a host path
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return {};  // not on this host: the box's own
    if (linux::host_path_seen_in_box(path, readonly_dirs)) return {};
    const std::string dir = S_ISDIR(st.st_mode) ? path : path.substr(0, path.rfind('/'));
    return fail(Code::kInvalid, "field '" + field + "': host path '" + path +
                                    "' is not seen in the build box: add '" +
                                    (dir.empty() ? "/" : dir) +
                                    "' (or a dir above it) to the daemon config's readonly_dirs");
  };
  for (std::size_t i = 0; i < t.python.find_links.size(); ++i) {
    AB_TRY(check(t.python.find_links[i], "python.find_links[" + std::to_string(i) + "]"));
  }
  AB_TRY(check(t.python.index_url, "python.index_url"));
  for (const auto& [name, spec] : t.nodejs.dependencies) {
    AB_TRY(check(spec, "nodejs.dependencies." + name));
  }
  if (auto it = t.env.find("PIP_FIND_LINKS"); it != t.env.end()) {
    // pip splits it on whitespace.
    std::size_t p = 0;
    while (p < it->second.size()) {
      std::size_t e = it->second.find_first_of(" \t\n", p);
      if (e == std::string::npos) e = it->second.size();
      if (e > p) AB_TRY(check(it->second.substr(p, e - p), "env.PIP_FIND_LINKS"));
      p = e + 1;
    }
  }
  return {};
}

}  // namespace agentbox::workspace
