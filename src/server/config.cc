#include "server/config.h"

#include <arpa/inet.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <ostream>

#include "cluster/config_yaml.h"
#include "common/validate.h"
#include "server/json_codec.h"

namespace agentbox::server {
namespace {

void split_append(std::string_view s, char sep, std::vector<std::string>* out) {
  while (!s.empty()) {
    auto pos = s.find(sep);
    std::string_view part = s.substr(0, pos);
    if (!part.empty()) out->emplace_back(part);
    if (pos == std::string_view::npos) break;
    s.remove_prefix(pos + 1);
  }
}

// `default_limits:` — the keys of a request's `limits`, checked by the same decoder (floors,
// ceilings; disk_mb and cpu_time_sec 0 = none) and tmp_mb against memory_mb; an unknown key is
// an error here (a typo in a config file must not pass as "no limit").
// `network:` — hosts (name: address, validated by net::parse_hosts), allow_private, and
// open_subnet (the IPv4 pool of mode "open" box veths, "a.b.c.d/n").
Status load_network(const YAML::Node& nw, const std::string& file, DaemonConfig* c) {
  const std::string where = "config " + file + ": network";
  if (!nw.IsMap())
    return fail(Code::kInvalid, where + " must be a mapping {hosts, allow_private, open_subnet}");
  for (const auto& kv : nw) {
    const std::string key = kv.first.as<std::string>();
    if (key != "hosts" && key != "allow_private" && key != "open_subnet") {
      return fail(Code::kInvalid, where + ": unknown key '" + key + "'");
    }
  }
  if (const YAML::Node& h = nw["hosts"]; h) {
    if (!h.IsMap()) return fail(Code::kInvalid, where + ".hosts must be a mapping name: address");
    std::vector<std::pair<std::string, std::string>> hosts;
    for (const auto& kv : h) {
      if (!kv.second.IsScalar()) {
        return fail(Code::kInvalid,
                    where + ".hosts." + kv.first.as<std::string>() + " must be an address");
      }
      hosts.emplace_back(kv.first.as<std::string>(), kv.second.as<std::string>());
    }
    auto parsed = net::parse_hosts(hosts);
    if (!parsed) return fail(Code::kInvalid, where + ".hosts: " + parsed.error().message);
    c->network.hosts = std::move(*parsed);
  }
  if (const YAML::Node& ap = nw["allow_private"]; ap) c->network.allow_private = ap.as<bool>();
  if (const YAML::Node& os = nw["open_subnet"]; os) {
    if (!os.IsScalar()) return fail(Code::kInvalid, where + ".open_subnet must be a.b.c.d/n");
    auto sub = net::parse_open_subnet(os.as<std::string>());
    if (!sub) return fail(Code::kInvalid, where + ": " + sub.error().message);
    c->network.open_subnet = sub->first;
    c->network.open_prefix = sub->second;
  }
  return {};
}

Status load_default_limits(const YAML::Node& dl, const std::string& file, DaemonConfig* c) {
  std::string where = "config " + file + ": default_limits";
  if (!dl.IsMap()) return fail(Code::kInvalid, where + " must be a mapping");
  nlohmann::json limits = nlohmann::json::object();
  for (const auto& kv : dl) {
    std::string key = kv.first.as<std::string>();
    if (key != "memory_mb" && key != "cpu_percent" && key != "max_pids" && key != "disk_mb" &&
        key != "max_open_files" && key != "cpu_time_sec" && key != "tmp_mb") {
      return fail(Code::kInvalid, where + ": unknown key '" + key + "'");
    }
    const YAML::Node& v = kv.second;
    std::int64_t n = 0;
    if (v.IsScalar() && YAML::convert<std::int64_t>::decode(v, n)) {
      // 0 = none for the limits that have no built-in default: no workspace disk cap, no CPU
      // time limit (the others take their floors: 0 would lift a cgroup cap).
      if (n == 0 && (key == "disk_mb" || key == "cpu_time_sec")) continue;
      limits[key] = n;
    } else {
      limits[key] = v.IsScalar() ? nlohmann::json(v.as<std::string>()) : nlohmann::json::object();
    }
  }
  auto decoded =
      decode_limits(nlohmann::json{{"default_limits", std::move(limits)}}, "default_limits");
  if (!decoded) {
    Error e = decoded.error();
    e.message = "config " + file + ": " + e.message;
    return std::unexpected(std::move(e));
  }
  sandbox::merge_unset_limits(&*decoded, c->default_limits);
  if (auto st = sandbox::check_limits_together(*decoded, "default_limits"); !st) {
    return fail(Code::kInvalid, "config " + file + ": " + st.error().message);
  }
  c->default_limits = *decoded;
  return {};
}

// `readonly_dirs: [/opt, ...]`: absolute, normalised host dirs, each mounted read-only at the
// same path in every isolated box ([] = none).
Status load_readonly_dirs(const YAML::Node& ro, const std::string& file, DaemonConfig* c) {
  std::string where = "config " + file + ": readonly_dirs";
  if (!ro.IsSequence()) return fail(Code::kInvalid, where + " must be a list of host dirs");
  std::vector<std::string> dirs;
  for (std::size_t i = 0; i < ro.size(); ++i) {
    std::string d = ro[i].as<std::string>();
    std::string at = where + "[" + std::to_string(i) + "] '" + d + "'";
    if (d.empty() || d.front() != '/') return fail(Code::kInvalid, at + ": must be absolute");
    if (std::filesystem::path(d).lexically_normal().string() != d || d.back() == '/') {
      return fail(Code::kInvalid, at + ": must be normalised (no '.', '..', '//' or trailing '/')");
    }
    std::error_code ec;
    if (!std::filesystem::is_directory(d, ec)) {
      return fail(Code::kInvalid, at + ": not a directory on this host");
    }
    dirs.push_back(std::move(d));
  }
  c->readonly_dirs = std::move(dirs);
  return {};
}

// Reads the YAML file into `c`, skipping keys whose flag was given (flags win).
Status load_yaml(const std::string& file, DaemonConfig* c,
                 const std::vector<std::string>& given_on_cli) {
  auto given = [&](std::string_view key) {
    for (const auto& g : given_on_cli) {
      if (g == key) return true;
    }
    return false;
  };
  try {
    YAML::Node root = YAML::LoadFile(file);
    if (!root.IsMap() && !root.IsNull()) {
      return fail(Code::kInvalid, "config " + file + ": top level must be a mapping");
    }
    if (root["listen"] && !given("listen")) c->listen = root["listen"].as<std::string>();
    if (root["data_dir"] && !given("data_dir")) c->data_dir = root["data_dir"].as<std::string>();
    if (root["backend"] && !given("backend")) c->backend = root["backend"].as<std::string>();
    if (root["default_runner"] && !given("default_runner")) {
      c->default_runner = root["default_runner"].as<std::string>();
    }
    if (root["shell"] && !given("shell")) {  // as --shell
      c->seed.shell = root["shell"].as<std::string>();
      c->seed.shell_given = true;
    }
    if (root["log_level"] && !given("log_level")) {
      c->log_level = root["log_level"].as<std::string>();
    }
    if (root["max_file_mb"] && !given("max_file_mb")) {
      c->max_file_mb = root["max_file_mb"].as<std::uint64_t>();
    }
    if (root["tokens"] && !given("tokens")) {
      c->tokens.clear();
      if (root["tokens"].IsSequence()) {
        for (const auto& t : root["tokens"]) c->tokens.push_back(t.as<std::string>());
      } else {
        c->tokens.push_back(root["tokens"].as<std::string>());
      }
    }
    if (root["max_running_boxes"] && !given("max_running_boxes")) {
      c->max_running_boxes = root["max_running_boxes"].as<std::size_t>();
    }
    if (root["evict_idle"] && !given("evict_idle")) c->evict_idle = root["evict_idle"].as<bool>();
    if (root["ui"] && !given("ui")) c->ui = root["ui"].as<bool>();
    if (root["auto_repair"] && !given("auto_repair")) {
      c->auto_repair = root["auto_repair"].as<bool>();
    }
    if (root["cache_mb"] && !given("cache_mb")) c->cache_mb = root["cache_mb"].as<std::uint64_t>();
    if (root["pool"] && !given("pool")) c->pool = root["pool"].as<std::size_t>();
    if (root["ttl_sec"] && !given("ttl_sec")) c->ttl_sec = root["ttl_sec"].as<std::int64_t>();
    if (root["ttl_action"] && !given("ttl_action")) {
      c->ttl_action = root["ttl_action"].as<std::string>();
    }
    if (root["persist"] && !given("persist")) c->persist = root["persist"].as<bool>();
    if (root["default_scope"] && !given("default_scope")) {
      c->default_scope = root["default_scope"].as<std::string>();
    }
    if (root["allowed_backends"] && !given("allowed_backends")) {
      c->allowed_backends.clear();
      for (const auto& b : root["allowed_backends"]) {
        c->allowed_backends.push_back(b.as<std::string>());
      }
    }
    if (root["audit_max_mb"] && !given("audit_max_mb")) {
      c->audit_max_mb = root["audit_max_mb"].as<std::uint64_t>();
    }
    if (root["ws_ping_sec"] && !given("ws_ping_sec")) {
      c->ws_ping_sec = root["ws_ping_sec"].as<std::uint32_t>();
    }
    if (const YAML::Node& cl = root["cluster"]; cl) {
      if (auto st = cluster::load_cluster_yaml(cl, file, &c->cluster, given); !st) return st;
    }
    if (const YAML::Node& nw = root["network"]; nw) {
      if (auto st = load_network(nw, file, c); !st) return st;
    }
    if (const YAML::Node& dl = root["default_limits"]; dl) {
      if (auto st = load_default_limits(dl, file, c); !st) return st;
    }
    if (const YAML::Node& tn = root["tenants"]; tn) {
      if (!tn.IsSequence()) {
        return fail(Code::kInvalid, "config " + file +
                                        ": tenants must be a list of "
                                        "{name, tokens, admin, max_sessions}");
      }
      c->tenants.clear();
      for (std::size_t i = 0; i < tn.size(); ++i) {
        const YAML::Node& t = tn[i];
        std::string where = "config " + file + ": tenants[" + std::to_string(i) + "]";
        if (!t.IsMap()) return fail(Code::kInvalid, where + " must be a mapping");
        for (const auto& kv : t) {
          std::string key = kv.first.as<std::string>();
          if (key != "name" && key != "tokens" && key != "admin" && key != "max_sessions" &&
              key != "default_scope") {
            return fail(Code::kInvalid, where + ": unknown key '" + key + "'");
          }
        }
        TenantConfig tc;
        if (!t["name"]) return fail(Code::kInvalid, where + ": name is required");
        tc.name = t["name"].as<std::string>();
        if (t["tokens"]) {
          if (t["tokens"].IsSequence()) {
            for (const auto& tok : t["tokens"]) tc.tokens.push_back(tok.as<std::string>());
          } else {
            tc.tokens.push_back(t["tokens"].as<std::string>());
          }
        }
        if (t["admin"]) tc.admin = t["admin"].as<bool>();
        if (t["max_sessions"]) tc.max_sessions = t["max_sessions"].as<std::size_t>();
        if (t["default_scope"]) tc.default_scope = t["default_scope"].as<std::string>();
        c->tenants.push_back(std::move(tc));
      }
    }
    if (const YAML::Node& lb = root["langbot"]; lb) {
      if (!lb.IsMap()) {
        return fail(Code::kInvalid, "config " + file +
                                        ": langbot must be a mapping {control_token, tenant, "
                                        "trusted_instance}");
      }
      for (const auto& kv : lb) {
        std::string key = kv.first.as<std::string>();
        std::string* field = key == "control_token"      ? &c->langbot.control_token
                             : key == "tenant"           ? &c->langbot.tenant
                             : key == "trusted_instance" ? &c->langbot.trusted_instance
                                                         : nullptr;
        if (field == nullptr) {
          return fail(Code::kInvalid, "config " + file + ": langbot: unknown key '" + key + "'");
        }
        if (!given("langbot." + key)) *field = kv.second.as<std::string>();
      }
    }
    if (const YAML::Node& rn = root["runners"]; rn) {
      if (!rn.IsSequence()) {
        return fail(Code::kInvalid, "config " + file +
                                        ": runners must be a list of "
                                        "{user, token, tenant}");
      }
      for (std::size_t i = 0; i < rn.size(); ++i) {
        const YAML::Node& r = rn[i];
        std::string where = "config " + file + ": runners[" + std::to_string(i) + "]";
        if (!r.IsMap()) return fail(Code::kInvalid, where + " must be a mapping");
        for (const auto& kv : r) {
          std::string key = kv.first.as<std::string>();
          if (key != "user" && key != "token" && key != "tenant") {
            return fail(Code::kInvalid, where + ": unknown key '" + key + "'");
          }
        }
        if (!r["user"] || !r["token"]) {
          return fail(Code::kInvalid, where + ": user and token are required");
        }
        RunnerConfig rc;
        rc.user = r["user"].as<std::string>();
        rc.token = r["token"].as<std::string>();
        if (r["tenant"]) rc.tenant = r["tenant"].as<std::string>();
        c->runners.push_back(std::move(rc));
      }
    }
    if (const YAML::Node& rg = root["registries"]; rg) {
      if (auto st = detail::load_registries(&rg, file, c); !st) return st;
    }
    if (const YAML::Node& al = root["image_aliases"]; al) {
      if (auto st = detail::load_image_aliases(&al, file, c); !st) return st;
    }
    if (const YAML::Node& di = root["default_image"]; di) {
      if (auto st = detail::load_default_image(&di, file, c); !st) return st;
    }
    if (const YAML::Node& ro = root["readonly_dirs"]; ro) {
      if (auto st = load_readonly_dirs(ro, file, c); !st) return st;
    }
    for (auto [key, field] : {std::pair{"global_skills_dir", &c->global_skills_dir},
                              std::pair{"agents_dir", &c->agents_dir}}) {
      if (root[key] && !given(key)) *field = root[key].as<std::string>();
    }
    if (root["allowed_mount_roots"] && !given("allowed_mount_roots")) {
      c->allowed_mount_roots.clear();
      for (const auto& r : root["allowed_mount_roots"]) {
        c->allowed_mount_roots.push_back(r.as<std::string>());
      }
    }
    if (const YAML::Node& ao = root["allowed_origins"]; ao && !given("allowed_origins")) {
      c->allowed_origins.clear();
      if (ao.IsSequence()) {
        for (const auto& o : ao) c->allowed_origins.push_back(o.as<std::string>());
      } else {
        c->allowed_origins.push_back(ao.as<std::string>());
      }
    }
    if (root["shared_dirs"] && !given("shared_dirs")) {
      const YAML::Node& sd = root["shared_dirs"];
      c->shared_dirs.clear();
      if (sd.IsMap()) {  // {prefix: path, ...}
        std::string joined;
        for (const auto& kv : sd) {
          if (!joined.empty()) joined += ',';
          joined += kv.first.as<std::string>() + ":" + kv.second.as<std::string>();
        }
        auto parsed = parse_shared_dirs(joined);
        if (!parsed) return std::unexpected(parsed.error());
        c->shared_dirs = std::move(*parsed);
      } else {  // ["prefix:path", ...] or "prefix:path,..."
        std::string joined;
        if (sd.IsSequence()) {
          for (const auto& e : sd) joined += e.as<std::string>() + ",";
        } else {
          joined = sd.as<std::string>();
        }
        auto parsed = parse_shared_dirs(joined);
        if (!parsed) return std::unexpected(parsed.error());
        c->shared_dirs = std::move(*parsed);
      }
    }
  } catch (const YAML::Exception& e) {
    return fail(Code::kInvalid, "config " + file + ": " + e.what());
  }
  return {};
}

// Seed 001's flags (SeedFlags). --shared-dirs is a regular flag (parse_daemon_args).
void add_seed_flags(CLI::App& app, SeedFlags* s) {
  auto take_last = CLI::MultiOptionPolicy::TakeLast;
  app.add_option("--port", s->port,
                 "Seed 001: listen on all interfaces (0.0.0.0) at this port; with --multi-agent "
                 "no token is required (the toolbox-server's trust model)")
      ->multi_option_policy(take_last);
  app.add_option("--shell", s->shell,
                 "Seed 001: shell for the `command` of POST /exec and /exec-stream")
      ->capture_default_str()
      ->multi_option_policy(take_last);
  app.add_option("--workdir", s->workdir,
                 "Seed 001: workspace root, workspaces at WORKDIR/<agent_id> (default: "
                 "DATA_DIR/workspaces)")
      ->multi_option_policy(take_last);
  app.add_flag("--multi-agent", s->multi_agent,
               "Seed 001: isolate every agent (the ns backend); without it the seed's unisolated "
               "mode needs an explicit --backend host");
  // Old command lines pass it a path ("--shared-readonly /mnt/shared-readonly" or "=..."):
  // accepted with or without one, and ignored.
  app.add_option("--shared-readonly", s->shared_readonly_value,
                 "Seed 001: deprecated, accepted (with or without a path) and ignored")
      ->expected(0, 1)
      ->multi_option_policy(take_last);
  app.add_option("--toolchain-path", s->toolchain_path,
                 "Seed 001: dirs prefixed to PATH in every box (env TOOLCHAIN_PATH)")
      ->multi_option_policy(take_last);
}

// TOOLCHAIN_PATH when --toolchain-path was not given (SHARED_DIRS is --shared-dirs' envname).
Status load_seed_env(const CLI::App& app, SeedFlags* s) {
  s->shell_given = s->shell_given || app.get_option("--shell")->count() > 0;
  s->shared_readonly = app.get_option("--shared-readonly")->count() > 0;
  if (app.get_option("--toolchain-path")->count() == 0) {
    if (const char* t = std::getenv("TOOLCHAIN_PATH"); t != nullptr) s->toolchain_path = t;
  }
  return {};
}

}  // namespace

Status apply_seed_flags(DaemonConfig* c, bool backend_given) {
  SeedFlags& s = c->seed;
  if (s.shared_readonly) {
    s.warnings.push_back(
        "--shared-readonly" +
        (s.shared_readonly_value.empty() ? std::string() : " " + s.shared_readonly_value) +
        " is deprecated and has no effect (shared dirs are read through "
        "/workspace/read and mounted read-only at /shared; "
        "/mnt/shared-readonly, when the host has it, is seen read-only)");
  }
  // --shell: an absolute, executable file (the default falls back to /bin/sh when there is no
  // bash on this host; a --shell that is not there is an error).
  if (s.shell.empty() || s.shell.front() != '/') {
    return fail(Code::kInvalid, "--shell '" + s.shell + "' must be an absolute path");
  }
  if (::access(s.shell.c_str(), X_OK) != 0) {
    if (s.shell_given) {
      return fail(Code::kInvalid, "--shell '" + s.shell + "' is not an executable file here");
    }
    s.shell = "/bin/sh";
  }
  if (!s.workdir.empty()) {
    std::error_code ec;
    std::filesystem::path w = std::filesystem::absolute(s.workdir, ec).lexically_normal();
    if (ec) return fail(Code::kInvalid, "--workdir '" + s.workdir + "': " + ec.message());
    std::string ws = w.string();
    while (ws.size() > 1 && ws.back() == '/') ws.pop_back();
    if (ws == "/") return fail(Code::kInvalid, "--workdir must not be / itself");
    if (std::filesystem::exists(ws, ec) && !std::filesystem::is_directory(ws, ec)) {
      return fail(Code::kInvalid, "--workdir '" + s.workdir + "' is not a directory");
    }
    s.workdir = ws;
  }
  if (!s.toolchain_path.empty()) {
    std::vector<std::string> dirs;
    split_append(s.toolchain_path, ':', &dirs);
    for (const auto& d : dirs) {
      if (d.front() != '/' || d.find_first_of(std::string_view("\0\n=", 3)) != std::string::npos) {
        return fail(Code::kInvalid, "--toolchain-path '" + d +
                                        "' must be absolute dirs joined by ':' (no '=', no "
                                        "newline)");
      }
    }
    std::string joined;
    for (const auto& d : dirs) joined += (joined.empty() ? "" : ":") + d;
    s.toolchain_path = joined;
  }
  if (s.multi_agent) {
    if (backend_given && c->backend != "ns") {
      return fail(Code::kInvalid,
                  "--multi-agent isolates every agent (backend ns); it cannot "
                  "go with --backend " +
                      c->backend);
    }
    c->backend = "ns";
  }
  if (s.port) {
    c->listen = "0.0.0.0:" + std::to_string(*s.port);
    if (!s.multi_agent && !(backend_given && c->backend == "host")) {
      return fail(Code::kInvalid,
                  "--port without --multi-agent is the toolbox-server's unisolated mode: pass "
                  "--multi-agent to isolate every agent (recommended), or --backend host to run "
                  "commands WITHOUT isolation as the toolbox-server did");
    }
    if (s.multi_agent && c->tokens.empty() && c->tenants.empty()) {
      s.open_without_token = true;
      s.warnings.push_back(
          "WARNING: listening on ALL interfaces (0.0.0.0:" + std::to_string(*s.port) +
          ") WITHOUT a token (seed 001's --port --multi-agent trust model): anyone who can "
          "reach this port can run commands in any agent's box and read its files. Keep the "
          "port inside the pod/container network, or pass --token.");
    }
  }
  return {};
}

ParseOutcome parse_daemon_args(int argc, const char* const* argv, std::ostream& out,
                               std::ostream& err) {
  DaemonConfig c;
  CLI::App app{"agentboxd: isolated, persistent workspaces for AI agents, over HTTP", "agentboxd"};
  std::string config_file;
  std::vector<std::string> shared_dirs;
  auto take_last = CLI::MultiOptionPolicy::TakeLast;
  auto* o_listen = app.add_option("--listen", c.listen, "ADDR:PORT to listen on (port 0: any)")
                       ->capture_default_str()
                       ->multi_option_policy(take_last);
  auto* o_data = app.add_option("--data-dir", c.data_dir, "State and workspaces (created)")
                     ->capture_default_str()
                     ->multi_option_policy(take_last);
  auto* o_backend =
      app.add_option("--backend", c.backend, "Default backend: ns (isolated) | host (no isolation)")
          ->capture_default_str()
          ->multi_option_policy(take_last);
  auto* o_token = app.add_option("--token", c.tokens,
                                 "API token (repeatable); when set every route but /healthz "
                                 "needs 'Authorization: Bearer <token>'")
                      ->envname("AGENTBOX_TOKEN");
  std::vector<std::string> runner_tokens;
  app.add_option("--runner-token", runner_tokens,
                 "USER=TOKEN: a remote runner may register at /ws/USER with TOKEN (repeatable; "
                 "tenant default)");
  auto* o_default_runner =
      app.add_option("--default-runner", c.default_runner,
                     "USER: sessions created without a backend run on this runner (remote)")
          ->multi_option_policy(take_last);
  app.add_option("--config", config_file, "YAML file with the same keys; flags override it")
      ->multi_option_policy(take_last);
  auto* o_shared = app.add_option("--shared-dirs", shared_dirs,
                                  "Read-only shared dirs for /workspace/read: prefix:path,...")
                       ->envname("SHARED_DIRS");
  auto* o_roots = app.add_option("--allow-mount-root", c.allowed_mount_roots,
                                 "Host dir under which sessions may request mounts and skills "
                                 "(repeatable; none: refused)");
  auto* o_origins = app.add_option("--allow-origin", c.allowed_origins,
                                   "Browser origin (scheme://host[:port]) whose pages may open "
                                   "WebSocket routes (repeatable); none: every browser origin is "
                                   "refused");
  auto* o_skills = app.add_option("--global-skills-dir", c.global_skills_dir,
                                  "Seed 000: every DIR/<name>/ holding a SKILL.md is read-only "
                                  "in every box at /workspace/.skills/<name>")
                       ->multi_option_policy(take_last);
  auto* o_agents = app.add_option("--agents-dir", c.agents_dir,
                                  "Seed 000: read-only in every box at /workspace/.agents")
                       ->multi_option_policy(take_last);
  auto* o_max = app.add_option("--max-file-mb", c.max_file_mb, "Largest file upload, MiB")
                    ->capture_default_str()
                    ->multi_option_policy(take_last);
  auto* o_boxes = app.add_option("--max-running-boxes", c.max_running_boxes,
                                 "Boxes running at once over all tenants (0: no limit)")
                      ->capture_default_str()
                      ->multi_option_policy(take_last);
  auto* o_audit = app.add_option("--audit-max-mb", c.audit_max_mb,
                                 "Rotate data_dir/audit.log at this size, MiB (3 old kept)")
                      ->capture_default_str()
                      ->multi_option_policy(take_last);
  auto* o_ws_ping = app.add_option("--ws-ping-sec", c.ws_ping_sec,
                                   "WebSocket peers (runners, attach) quiet this long are pinged; "
                                   "closed after twice as long without an answer")
                        ->capture_default_str()
                        ->multi_option_policy(take_last);
  auto* o_evict = app.add_flag("--evict-idle", c.evict_idle,
                               "At --max-running-boxes, suspend the least recently used idle box "
                               "instead of answering 429");
  bool no_ui_flag = false;  // a plain flag: "{false}" in the help would read as "off by default"
  auto* o_no_ui = app.add_flag("--no-ui", no_ui_flag, "Do not serve the web dashboard (GET /ui/)");
  auto* o_auto_repair = app.add_flag("--auto-repair", c.auto_repair,
                                     "Run a session's health checks and repairs when it resumes");
  auto* o_cache = app.add_option("--cache-mb", c.cache_mb,
                                 "MiB of each box's /cache tmpfs for package caches (0: none)")
                      ->capture_default_str()
                      ->multi_option_policy(take_last);
  auto* o_pool =
      app.add_option("--pool", c.pool, "ns boxes kept started ahead for new sessions (0: none)")
          ->capture_default_str()
          ->multi_option_policy(take_last);
  auto* o_allow_be = app.add_option("--allow-backend", c.allowed_backends,
                                    "Backend a session may ask for besides the default "
                                    "(repeatable); e.g. host (NO isolation)");
  auto* o_ttl = app.add_option("--ttl-sec", c.ttl_sec,
                               "Idle seconds before a session is suspended (0: never)")
                    ->capture_default_str()
                    ->multi_option_policy(take_last);
  auto* o_ttl_action = app.add_option("--ttl-action", c.ttl_action,
                                      "What the reaper does to idle sessions: suspend|destroy")
                           ->capture_default_str()
                           ->multi_option_policy(take_last);
  // Two plain flags, not "--persist,!--no-persist": CLI11 prints that pair with the negated
  // flag's value ("--persist,--no-persist{false}"), which reads as "off by default".
  bool persist_flag = false;
  bool no_persist_flag = false;
  auto* o_persist = app.add_flag("--persist", persist_flag,
                                 "Keep sessions in data_dir/state.db over restarts (on by "
                                 "default)");
  auto* o_no_persist = app.add_flag("--no-persist", no_persist_flag,
                                    "Keep sessions in memory only, lost at a restart (default: "
                                    "kept, see --persist)")
                           ->excludes(o_persist);
  auto* o_scope = app.add_option("--default-scope", c.default_scope,
                                 "Scope template for creates with variables but no id/scope")
                      ->multi_option_policy(take_last);
  auto* o_log = app.add_option("--log-level", c.log_level, "trace|debug|info|warn|error")
                    ->capture_default_str()
                    ->multi_option_policy(take_last);
  app.add_option("--ready-file", c.ready_file,
                 "Write HOST:PORT to this file (atomically) once listening")
      ->multi_option_policy(take_last);
  app.add_option("--check-backend", c.check_backend,
                 "Print whether this backend can run here (what is missing if not) and exit")
      ->multi_option_policy(take_last);
  auto* o_lb_token = app.add_option("--langbot-control-token", c.langbot.control_token,
                                    "LangBot Box runtime: the X-LangBot-Box-Control-Token "
                                    "(32+ characters)")
                         ->envname("LANGBOT_BOX_CONTROL_TOKEN")
                         ->multi_option_policy(take_last);
  auto* o_lb_tenant = app.add_option("--langbot-tenant", c.langbot.tenant,
                                     "LangBot Box runtime: the tenant its sessions belong to")
                          ->multi_option_policy(take_last);
  auto* o_lb_instance =
      app.add_option("--langbot-trusted-instance", c.langbot.trusted_instance,
                     "LangBot Box runtime: the only X-LangBot-Instance-Id accepted (default: "
                     "the first /rpc/ws connection binds it)")
          ->envname("LANGBOT_BOX_TRUSTED_INSTANCE_UUID")
          ->multi_option_policy(take_last);
  add_seed_flags(app, &c.seed);
  std::vector<CLI::Option*> cluster_opts;
  std::vector<std::string> cluster_keys =
      cluster::add_cluster_flags(app, &c.cluster, &cluster_opts);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help is 0; every bad flag or value is 2 (a bad configuration, like the checks below).
    int rc = app.exit(e, out, err);
    return ParseOutcome{std::nullopt, rc == 0 ? 0 : 2};
  }

  std::vector<std::string> given;
  if (o_listen->count()) given.push_back("listen");
  if (o_data->count()) given.push_back("data_dir");
  if (o_backend->count()) given.push_back("backend");
  if (o_default_runner->count()) given.push_back("default_runner");
  if (o_token->count()) given.push_back("tokens");
  if (o_shared->count()) given.push_back("shared_dirs");
  if (o_roots->count()) given.push_back("allowed_mount_roots");
  if (o_origins->count()) given.push_back("allowed_origins");
  if (o_skills->count()) given.push_back("global_skills_dir");
  if (o_agents->count()) given.push_back("agents_dir");
  if (o_max->count()) given.push_back("max_file_mb");
  if (o_log->count()) given.push_back("log_level");
  if (app.get_option("--shell")->count()) given.push_back("shell");
  if (o_boxes->count()) given.push_back("max_running_boxes");
  if (o_audit->count()) given.push_back("audit_max_mb");
  if (o_ws_ping->count()) given.push_back("ws_ping_sec");
  if (o_evict->count()) given.push_back("evict_idle");
  if (o_no_ui->count()) {
    given.push_back("ui");
    c.ui = false;
  }
  if (o_auto_repair->count()) given.push_back("auto_repair");
  if (o_cache->count()) given.push_back("cache_mb");
  if (o_pool->count()) given.push_back("pool");
  if (o_allow_be->count()) given.push_back("allowed_backends");
  if (o_ttl->count()) given.push_back("ttl_sec");
  if (o_ttl_action->count()) given.push_back("ttl_action");
  if (o_persist->count() || o_no_persist->count()) {
    given.push_back("persist");
    c.persist = o_persist->count() > 0;
  }
  if (o_scope->count()) given.push_back("default_scope");
  if (o_lb_token->count()) given.push_back("langbot.control_token");
  if (o_lb_tenant->count()) given.push_back("langbot.tenant");
  if (o_lb_instance->count()) given.push_back("langbot.trusted_instance");
  for (std::size_t i = 0; i < cluster_opts.size(); ++i)
    if (cluster_opts[i]->count()) given.push_back(cluster_keys[i]);

  if (o_shared->count()) {
    std::string joined;
    for (const auto& s : shared_dirs) joined += s + ",";
    auto parsed = parse_shared_dirs(joined);
    if (!parsed) {
      err << "agentboxd: --shared-dirs: " << parsed.error().message << "\n";
      return ParseOutcome{std::nullopt, 2};
    }
    c.shared_dirs = std::move(*parsed);
  }
  if (!config_file.empty()) {
    if (auto st = load_yaml(config_file, &c, given); !st) {
      err << "agentboxd: " << st.error().message << "\n";
      return ParseOutcome{std::nullopt, 2};
    }
  }
  for (const std::string& rt : runner_tokens) {
    auto eq = rt.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == rt.size()) {
      err << "agentboxd: --runner-token must be USER=TOKEN (both non-empty)\n";
      return ParseOutcome{std::nullopt, 2};
    }
    c.runners.push_back(RunnerConfig{rt.substr(0, eq), rt.substr(eq + 1), kDefaultTenant});
  }
  for (auto [key, dir] : {std::pair{"global_skills_dir", &c.global_skills_dir},
                          std::pair{"agents_dir", &c.agents_dir}}) {
    std::error_code ec;
    if (dir->empty()) continue;
    if (dir->front() != '/' || !std::filesystem::is_directory(*dir, ec)) {
      err << "agentboxd: " << key << " '" << *dir << "' must be an existing directory, given "
          << "as an absolute path\n";
      return ParseOutcome{std::nullopt, 2};
    }
  }
  if (auto st = load_seed_env(app, &c.seed); !st) {
    err << "agentboxd: " << st.error().message << "\n";
    return ParseOutcome{std::nullopt, 2};
  }
  if (auto st = detail::load_default_image(nullptr, "", &c); !st) {
    err << "agentboxd: " << st.error().message << "\n";
    return ParseOutcome{std::nullopt, 2};
  }
  bool backend_given = o_backend->count() > 0 || (!config_file.empty() && c.backend != "ns");
  if (auto st = apply_seed_flags(&c, backend_given); !st) {
    err << "agentboxd: " << st.error().message << "\n";
    return ParseOutcome{std::nullopt, 2};
  }
  return ParseOutcome{std::move(c), 0};
}

Result<std::vector<SharedDir>> parse_shared_dirs(std::string_view spec) {
  std::vector<std::string> parts;
  split_append(spec, ',', &parts);
  std::vector<SharedDir> out;
  for (const auto& part : parts) {
    auto colon = part.find(':');
    if (colon == std::string::npos) {
      return fail(Code::kInvalid, "shared dir '" + part + "' must look like prefix:/host/path");
    }
    SharedDir d{part.substr(0, colon), part.substr(colon + 1)};
    while (!d.prefix.empty() && d.prefix.front() == '/') d.prefix.erase(0, 1);
    while (!d.prefix.empty() && d.prefix.back() == '/') d.prefix.pop_back();
    if (d.prefix.empty()) return fail(Code::kInvalid, "shared dir '" + part + "' has no prefix");
    if (d.prefix.find("..") != std::string::npos) {
      return fail(Code::kInvalid, "shared dir prefix '" + d.prefix + "' must not contain '..'");
    }
    if (d.host_path.empty() || d.host_path.front() != '/') {
      return fail(Code::kInvalid, "shared dir '" + part + "': the host path must be absolute");
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<TenantConfig> effective_tenants(const DaemonConfig& c) {
  std::vector<TenantConfig> out = c.tenants;
  if (!c.tokens.empty()) out.push_back(TenantConfig{kDefaultTenant, c.tokens, false, 0});
  return out;
}

namespace {

// langbot: the token as LangBot's runtime requires it, a tenant that exists, an instance id of
// LangBot's form. Never echoes the token.
Status check_langbot(const DaemonConfig& c) {
  const LangbotConfig& lb = c.langbot;
  if (!lb.control_token.empty()) {
    bool space = false;
    for (char ch : lb.control_token) space = space || std::isspace(static_cast<unsigned char>(ch));
    if (lb.control_token.size() < 32 || space) {
      return fail(Code::kInvalid,
                  "langbot.control_token must be at least 32 characters with no whitespace");
    }
  }
  if (!lb.tenant.empty() && lb.tenant != kDefaultTenant) {
    bool found = false;
    for (const auto& t : c.tenants) found = found || t.name == lb.tenant;
    if (!found) {
      return fail(Code::kInvalid, "langbot.tenant '" + lb.tenant + "' is not a configured tenant");
    }
  }
  const std::string& id = lb.trusted_instance;
  bool ok = id.size() <= 128;
  for (std::size_t i = 0; ok && i < id.size(); ++i) {
    char ch = id[i];
    ok = std::isalnum(static_cast<unsigned char>(ch)) ||
         (i > 0 && (ch == '.' || ch == '_' || ch == ':' || ch == '-'));
  }
  if (!ok) {
    return fail(Code::kInvalid,
                "langbot.trusted_instance must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$");
  }
  return {};
}

}  // namespace

Status validate_config(const DaemonConfig& c) {
  auto listen = parse_listen(c.listen);
  if (!listen) return std::unexpected(listen.error());
  if (c.ttl_sec < 0) return fail(Code::kInvalid, "ttl_sec must be >= 0 (0: never)");
  if (c.ttl_action != "suspend" && c.ttl_action != "destroy") {
    return fail(Code::kInvalid,
                "ttl_action must be suspend or destroy, not '" + c.ttl_action + "'");
  }
  for (const auto& t : c.tokens) {
    if (t.empty()) return fail(Code::kInvalid, "a --token must not be empty");
  }
  for (const RunnerConfig& r : c.runners) {
    bool ok = !r.user.empty() && r.user.size() <= 128 && r.user != "." && r.user != "..";
    for (char ch : r.user)
      ok = ok &&
           (std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-');
    if (!ok) {
      return fail(Code::kInvalid, "runner user '" + r.user + "' must be [A-Za-z0-9._-]{1,128}");
    }
    if (r.token.empty()) return fail(Code::kInvalid, "runner " + r.user + ": empty token");
  }
  if (!c.default_runner.empty() &&
      std::none_of(c.runners.begin(), c.runners.end(),
                   [&](const RunnerConfig& r) { return r.user == c.default_runner; })) {
    return fail(Code::kInvalid, "default_runner '" + c.default_runner +
                                    "' is not a runner user (give --runner-token " +
                                    c.default_runner + "=TOKEN or config runners:)");
  }
  std::vector<std::string> names;
  std::vector<const std::string*> all_tokens;
  for (const auto& t : c.tokens) all_tokens.push_back(&t);
  for (const auto& t : c.tenants) {
    bool ok_name = !t.name.empty() && t.name.size() <= 64 &&
                   t.name.find_first_not_of(
                       "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                       "0123456789._-") == std::string::npos;
    if (!ok_name) {
      return fail(Code::kInvalid, "tenant name '" + t.name + "' must be 1-64 of [A-Za-z0-9._-]");
    }
    if (std::find(names.begin(), names.end(), t.name) != names.end()) {
      return fail(Code::kInvalid, "tenant '" + t.name + "' is configured twice");
    }
    if (t.name == kDefaultTenant && !c.tokens.empty()) {
      return fail(Code::kInvalid,
                  "tenant name 'default' is taken by the --token/tokens tokens; "
                  "rename the tenant or move those tokens into it");
    }
    names.push_back(t.name);
    if (t.tokens.empty()) {
      return fail(Code::kInvalid, "tenant '" + t.name + "' has no tokens");
    }
    for (const auto& tok : t.tokens) {
      // Never echo a token in an error: it ends up in logs.
      if (tok.empty()) return fail(Code::kInvalid, "tenant '" + t.name + "' has an empty token");
      all_tokens.push_back(&tok);
    }
  }
  for (std::size_t i = 0; i < all_tokens.size(); ++i) {
    for (std::size_t j = i + 1; j < all_tokens.size(); ++j) {
      if (*all_tokens[i] == *all_tokens[j]) {
        return fail(Code::kInvalid,
                    "a token is configured twice (tokens must be unique "
                    "across tenants: a token names exactly one tenant)");
      }
    }
  }
  if (c.pool > 1024) return fail(Code::kInvalid, "--pool must be at most 1024");
  if (c.cache_mb > (std::uint64_t{1} << 20)) {
    return fail(Code::kInvalid, "--cache-mb must be at most 1048576");
  }
  if (c.ws_ping_sec < 1 || c.ws_ping_sec > 3600) {
    return fail(Code::kInvalid, "--ws-ping-sec must be between 1 and 3600");
  }
  if (c.audit_max_mb < 1 || c.audit_max_mb > (std::uint64_t{1} << 20)) {
    return fail(Code::kInvalid, "--audit-max-mb must be between 1 and 1048576");
  }
  // SECURITY: anyone who can reach the port can run commands; only loopback may be open.
  if (!is_loopback_address(listen->first) && all_tokens.empty() && !c.seed.open_without_token) {
    return fail(Code::kInvalid, "refusing to listen on non-loopback address " + c.listen +
                                    " without a token: anyone who can reach it could run "
                                    "commands. Pass --token (or listen on 127.0.0.1).");
  }
  if (c.backend.empty()) return fail(Code::kInvalid, "--backend must not be empty");
  if (c.max_file_mb < 1 || c.max_file_mb > (std::uint64_t{1} << 30)) {
    return fail(Code::kInvalid, "--max-file-mb must be between 1 and 1073741824");
  }
  if (c.data_dir.empty()) return fail(Code::kInvalid, "--data-dir must not be empty");
  for (const auto& o : c.allowed_origins) {
    if (auto st = check_origin(o); !st) return st;
  }
  if (auto st = check_langbot(c); !st) return st;
  if (auto st = cluster::check_cluster(c.cluster); !st) return st;
  return {};
}

}  // namespace agentbox::server
