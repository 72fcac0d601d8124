#include "server/json_codec.h"

#include <time.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>

#include "common/validate.h"
#include "session/host_workspace.h"

namespace agentbox::server {
namespace {

// Evaluates a Result-returning expression; returns its error from the enclosing function.
#define AB_ASSIGN_OR_RETURN(lhs, expr)                                    \
  auto AB_CONCAT_(_r_, __LINE__) = (expr);                                \
  if (!AB_CONCAT_(_r_, __LINE__)) {                                       \
    return std::unexpected(std::move(AB_CONCAT_(_r_, __LINE__)).error()); \
  }                                                                       \
  lhs = std::move(*AB_CONCAT_(_r_, __LINE__))
#define AB_CONCAT_(a, b) AB_CONCAT_INNER_(a, b)
#define AB_CONCAT_INNER_(a, b) a##b

std::string name_of(std::string_view prefix, std::string_view key) {
  if (prefix.empty()) return std::string(key);
  return std::string(prefix) + "." + std::string(key);
}

std::unexpected<Error> bad_field(std::string_view field, std::string_view what) {
  return fail(Code::kInvalid, "field '" + std::string(field) + "' " + std::string(what));
}

std::unexpected<Error> missing(std::string_view field) {
  return bad_field(field, "is required");
}

// The value of `key`, or null when absent or JSON null (both mean "not given").
const json* lookup(const json& obj, std::string_view key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

bool has_nul(std::string_view s) {
  return s.find('\0') != std::string_view::npos;
}

Result<std::optional<std::string>> opt_string(const json& obj, std::string_view key,
                                              std::string_view prefix = {}) {
  const json* v = lookup(obj, key);
  if (!v) return std::optional<std::string>{};
  if (!v->is_string()) return bad_field(name_of(prefix, key), "must be a string");
  return std::optional<std::string>(v->get_ref<const std::string&>());
}

Result<std::string> req_string(const json& obj, std::string_view key,
                               std::string_view prefix = {}) {
  AB_ASSIGN_OR_RETURN(auto s, opt_string(obj, key, prefix));
  if (!s) return missing(name_of(prefix, key));
  return std::move(*s);
}

Result<std::optional<double>> opt_number(const json& obj, std::string_view key,
                                         std::string_view prefix = {}) {
  const json* v = lookup(obj, key);
  if (!v) return std::optional<double>{};
  if (!v->is_number()) return bad_field(name_of(prefix, key), "must be a number");
  return std::optional<double>(v->get<double>());
}

// A non-negative integer no larger than `max`.
Result<std::optional<std::uint64_t>> opt_uint(const json& obj, std::string_view key,
                                              std::uint64_t max, std::string_view prefix = {}) {
  const json* v = lookup(obj, key);
  if (!v) return std::optional<std::uint64_t>{};
  std::string field = name_of(prefix, key);
  if (!v->is_number()) return bad_field(field, "must be a number");
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return bad_field(field, "must be an integer");
    if (d < 0) return bad_field(field, "must not be negative");
    if (d > static_cast<double>(max)) {
      return bad_field(field, "must be at most " + std::to_string(max));
    }
    return std::optional<std::uint64_t>(static_cast<std::uint64_t>(d));
  }
  if (v->is_number_integer() && !v->is_number_unsigned() && v->get<std::int64_t>() < 0) {
    return bad_field(field, "must not be negative");
  }
  std::uint64_t u = v->get<std::uint64_t>();
  if (u > max) return bad_field(field, "must be at most " + std::to_string(max));
  return std::optional<std::uint64_t>(u);
}

Result<std::optional<std::map<std::string, std::string>>> opt_string_map(
    const json& obj, std::string_view key, std::string_view prefix = {}) {
  const json* v = lookup(obj, key);
  if (!v) return std::optional<std::map<std::string, std::string>>{};
  std::string field = name_of(prefix, key);
  if (!v->is_object()) return bad_field(field, "must be an object of strings");
  std::map<std::string, std::string> out;
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (!it.value().is_string()) return bad_field(field + "." + it.key(), "must be a string");
    out.emplace(it.key(), it.value().get_ref<const std::string&>());
  }
  return std::optional<std::map<std::string, std::string>>(std::move(out));
}

Result<std::optional<std::vector<std::string>>> opt_string_array(const json& obj,
                                                                 std::string_view key,
                                                                 std::string_view prefix = {}) {
  const json* v = lookup(obj, key);
  if (!v) return std::optional<std::vector<std::string>>{};
  std::string field = name_of(prefix, key);
  if (!v->is_array()) return bad_field(field, "must be an array of strings");
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v->size(); ++i) {
    const json& e = (*v)[i];
    if (!e.is_string()) {
      return bad_field(field + "[" + std::to_string(i) + "]", "must be a string");
    }
    out.push_back(e.get_ref<const std::string&>());
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

std::unexpected<Error> not_supported(std::string_view field, std::string_view what) {
  return fail(Code::kNotSupported, "field '" + std::string(field) + "' " + std::string(what) +
                                       ": not implemented in this version");
}

}  // namespace

Status check_known_fields(const json& obj, std::initializer_list<std::string_view> known,
                          std::string_view where) {
  if (!obj.is_object()) return {};
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) != known.end()) continue;
    std::string takes;
    for (std::string_view k : known) takes += (takes.empty() ? "" : ", ") + std::string(k);
    std::string whose = where.empty() ? std::string("the body") : std::string(where);
    return bad_field(name_of(where, it.key()),
                     "is not known (" + whose +
                         (takes.empty() ? " takes no fields)" : " takes: " + takes + ")"));
  }
  return {};
}

Result<sandbox::Limits> decode_limits(const json& obj, std::string_view key) {
  sandbox::Limits l;
  const json* v = lookup(obj, key);
  if (!v) return l;
  if (!v->is_object()) return bad_field(key, "must be an object");
  AB_TRY(check_known_fields(*v,
                            {"memory_mb", "cpu_percent", "max_pids", "disk_mb", "max_open_files",
                             "cpu_time_sec", "tmp_mb"},
                            key));
  constexpr std::uint64_t k32 = std::numeric_limits<std::uint32_t>::max();
  constexpr std::uint64_t kBig = validate::kMaxMiB;
  AB_ASSIGN_OR_RETURN(l.memory_mb, opt_uint(*v, "memory_mb", kBig, key));
  AB_ASSIGN_OR_RETURN(auto cpu, opt_uint(*v, "cpu_percent", k32, key));
  AB_ASSIGN_OR_RETURN(auto pids, opt_uint(*v, "max_pids", k32, key));
  AB_ASSIGN_OR_RETURN(l.disk_mb, opt_uint(*v, "disk_mb", kBig, key));
  AB_ASSIGN_OR_RETURN(auto files, opt_uint(*v, "max_open_files", k32, key));
  AB_ASSIGN_OR_RETURN(auto cpu_time, opt_uint(*v, "cpu_time_sec", k32, key));
  AB_ASSIGN_OR_RETURN(l.tmp_mb, opt_uint(*v, "tmp_mb", kBig, key));
  if (cpu_time) l.cpu_time_sec = static_cast<std::uint32_t>(*cpu_time);
  if (cpu) l.cpu_percent = static_cast<std::uint32_t>(*cpu);
  if (pids) l.max_pids = static_cast<std::uint32_t>(*pids);
  if (files) l.max_open_files = static_cast<std::uint32_t>(*files);
  // SECURITY: floors, not defaults (0 would lift a cgroup cap): common/validate.h.
  if (auto st = validate::limits(l, key); !st) return std::unexpected(st.error());
  return l;
}

namespace {

// An artifact dir names a place in the box, never on the host: relative (to the workspace) or
// absolute without '.'/'..' components. Whether an absolute one is under the workspace is
// check_artifact_dir's business (it needs the box).
Status check_artifact_dir_syntax(const std::string& dir) {
  if (dir.empty()) return bad_field("artifact_dir", "must not be empty");
  if (has_nul(dir)) return bad_field("artifact_dir", "must not contain NUL");
  std::size_t i = 0;
  while (i <= dir.size()) {
    std::size_t j = dir.find('/', i);
    if (j == std::string::npos) j = dir.size();
    std::string_view comp(dir.data() + i, j - i);
    if (comp == "..") return bad_field("artifact_dir", "must not have a '..' component");
    i = j + 1;
  }
  return {};
}

// `command` (run by /bin/sh -c) or `argv` (run directly), exactly one, into an ExecSpec or a
// ProcessSpec.
template <typename Spec>
Status decode_command(const json& body, Spec* spec) {
  AB_ASSIGN_OR_RETURN(auto command, opt_string(body, "command"));
  AB_ASSIGN_OR_RETURN(auto argv, opt_string_array(body, "argv"));
  if (command && argv) return fail(Code::kInvalid, "give either 'command' or 'argv', not both");
  if (!command && !argv) return fail(Code::kInvalid, "field 'command' (or 'argv') is required");
  if (command) {
    if (command->empty()) return bad_field("command", "must not be empty");
    if (has_nul(*command)) return bad_field("command", "must not contain NUL");
    spec->command = std::move(*command);
  } else {
    if (argv->empty()) return bad_field("argv", "must not be empty");
    for (std::size_t i = 0; i < argv->size(); ++i) {
      if (has_nul((*argv)[i])) {
        return bad_field("argv[" + std::to_string(i) + "]", "must not contain NUL");
      }
    }
    if ((*argv)[0].empty()) return bad_field("argv[0]", "must not be empty");
    spec->argv = std::move(*argv);
  }
  return {};
}

// The exec fields shared by the v1 and seed routes.
Result<sandbox::ExecSpec> decode_exec_fields(const json& body) {
  sandbox::ExecSpec spec;
  AB_TRY(decode_command(body, &spec));
  AB_ASSIGN_OR_RETURN(auto cwd, opt_string(body, "cwd"));
  if (cwd) spec.cwd = std::move(*cwd);
  AB_ASSIGN_OR_RETURN(auto env, opt_string_map(body, "env"));
  if (env) {
    if (auto st = validate::env(*env, "env"); !st) return std::unexpected(st.error());
    spec.env = std::move(*env);
  }
  AB_ASSIGN_OR_RETURN(auto stdin_data, opt_string(body, "stdin"));
  if (stdin_data) spec.stdin_data = std::move(*stdin_data);
  AB_ASSIGN_OR_RETURN(auto timeout, opt_number(body, "timeout_sec"));
  if (timeout) {
    if (!(*timeout > 0) || *timeout > kMaxTimeoutSec) {
      return bad_field("timeout_sec", "must be greater than 0 and at most 86400");
    }
    spec.timeout = std::chrono::milliseconds(
        std::max<std::int64_t>(1, static_cast<std::int64_t>(std::llround(*timeout * 1000))));
  }
  AB_ASSIGN_OR_RETURN(auto max_out, opt_uint(body, "max_output_bytes", kMaxOutputBytesLimit));
  if (max_out) spec.max_output_bytes = *max_out;
  AB_ASSIGN_OR_RETURN(auto artifact_dir, opt_string(body, "artifact_dir"));
  if (artifact_dir) {
    if (auto st = check_artifact_dir_syntax(*artifact_dir); !st) {
      return std::unexpected(st.error());
    }
    spec.artifact_dir = std::move(*artifact_dir);
  }
  return spec;
}

Result<std::string> session_of(const json& body, std::string_view what) {
  AB_ASSIGN_OR_RETURN(auto agent_id, opt_string(body, "agent_id"));
  if (!agent_id) {
    // Seed 001's /exec names the agent in env.AGENT_ID.
    if (const json* env = lookup(body, "env"); env && env->is_object()) {
      if (const json* a = lookup(*env, "AGENT_ID")) {
        if (!a->is_string()) return bad_field("env.AGENT_ID", "must be a string");
        agent_id = a->get<std::string>();
      }
    }
  }
  if (!agent_id) return missing(what);
  if (auto st = session::validate_id(*agent_id); !st) return std::unexpected(st.error());
  return std::move(*agent_id);
}

}  // namespace

Result<json> parse_object(std::string_view body, bool allow_empty) {
  if (allow_empty && body.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return json::object();
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail(Code::kInvalid, "malformed JSON in request body");
  if (!j.is_object()) return fail(Code::kInvalid, "request body must be a JSON object");
  return j;
}

std::string to_wire(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// `variables` of a create: strings or integers ({"launcher_id": 123}). Checked whenever given,
// also when `id` makes them unused.
Result<std::map<std::string, std::string>> decode_variables(const json& body) {
  std::map<std::string, std::string> vars;
  const json* v = lookup(body, "variables");
  if (!v) return vars;
  if (!v->is_object()) return bad_field("variables", "must be an object");
  for (auto it = v->begin(); it != v->end(); ++it) {
    const json& val = it.value();
    if (val.is_string()) {
      vars.emplace(it.key(), val.get<std::string>());
    } else if (val.is_number_integer()) {
      vars.emplace(it.key(), val.dump());
    } else {
      return bad_field("variables." + it.key(), "must be a string or an integer");
    }
  }
  return vars;
}

// One list of mounts ("mounts" or seed 002's "extra_mounts", which means the same).
Status decode_mount_list(const json& body, std::string_view key,
                         std::vector<session::MountSpec>* out) {
  const json* mounts = lookup(body, key);
  if (!mounts) return {};
  if (!mounts->is_array()) return bad_field(key, "must be an array");
  for (std::size_t i = 0; i < mounts->size(); ++i) {
    const json& m = (*mounts)[i];
    std::string field = std::string(key) + "[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad_field(field, "must be an object");
    AB_TRY(check_known_fields(m, {"host_path", "mount_path", "mode"}, field));
    session::MountSpec ms;
    AB_ASSIGN_OR_RETURN(ms.host_path, req_string(m, "host_path", field));
    AB_ASSIGN_OR_RETURN(ms.mount_path, req_string(m, "mount_path", field));
    AB_ASSIGN_OR_RETURN(auto mode, opt_string(m, "mode", field));
    if (mode) {
      if (*mode != "rw" && *mode != "ro" && *mode != "none") {
        return bad_field(field + ".mode", "must be one of rw, ro, none");
      }
      ms.mode = std::move(*mode);
    }
    out->push_back(std::move(ms));
  }
  return {};
}

// Seed 002's primary mount: top-level host_path / mount_path (default /workspace) /
// host_path_mode (rw|ro|none), kept as given in spec->primary (the session object shows it).
// Over /workspace it is the workspace itself (session/host_workspace.h); elsewhere it is also one
// more mount; mode none mounts nothing.
Status decode_primary_mount(const json& body, session::SessionSpec* spec) {
  AB_ASSIGN_OR_RETURN(auto host_path, opt_string(body, "host_path"));
  AB_ASSIGN_OR_RETURN(auto mount_path, opt_string(body, "mount_path"));
  AB_ASSIGN_OR_RETURN(auto mode, opt_string(body, "host_path_mode"));
  if (mode && *mode != "rw" && *mode != "ro" && *mode != "none") {
    return bad_field("host_path_mode", "must be one of rw, ro, none");
  }
  if (!host_path) {
    if (mount_path) return bad_field("mount_path", "needs 'host_path'");
    if (mode) return bad_field("host_path_mode", "needs 'host_path'");
    return {};
  }
  if (host_path->empty()) return bad_field("host_path", "must not be empty");
  session::set_primary_mount(
      spec,
      {std::move(*host_path), mount_path ? std::move(*mount_path) : std::string(kWorkspacePath),
       mode ? std::move(*mode) : std::string("rw")});
  return {};
}

// `skills` (name -> host dir) and `skill_mode` (rw|ro, for all of them; default rw as in seed
// 002).
Status decode_skills(const json& body, session::SessionSpec* spec) {
  AB_ASSIGN_OR_RETURN(auto skills, opt_string_map(body, "skills"));
  AB_ASSIGN_OR_RETURN(auto mode, opt_string(body, "skill_mode"));
  if (mode && *mode != "rw" && *mode != "ro") return bad_field("skill_mode", "must be rw or ro");
  if (!skills) return {};
  for (const auto& [name, dir] : *skills) {
    spec->skills[name] = dir;
    if (mode && *mode == "ro") spec->read_only_skills.insert(name);
  }
  return {};
}

}  // namespace

Result<session::SessionSpec> decode_add_mounts(const json& body) {
  AB_TRY(check_known_fields(body, {"mounts", "extra_mounts", "skills", "skill_mode"}));
  session::SessionSpec add;
  if (auto st = decode_mount_list(body, "mounts", &add.mounts); !st) {
    return std::unexpected(st.error());
  }
  if (auto st = decode_mount_list(body, "extra_mounts", &add.mounts); !st) {
    return std::unexpected(st.error());
  }
  if (auto st = decode_skills(body, &add); !st) return std::unexpected(st.error());
  if (add.mounts.empty() && add.skills.empty()) {
    return fail(Code::kInvalid, "field 'mounts' or 'skills' is required (nothing to add)");
  }
  return add;
}

Status decode_network(const json& body, session::NetworkSpec* out) {
  const json* net = lookup(body, "network");
  if (!net) return {};
  if (!net->is_object()) return bad_field("network", "must be an object");
  AB_TRY(check_known_fields(*net, {"mode", "allow"}, "network"));
  AB_ASSIGN_OR_RETURN(auto mode, opt_string(*net, "mode", "network"));
  AB_ASSIGN_OR_RETURN(auto allow, opt_string_array(*net, "allow", "network"));
  if (mode) {
    if (*mode != "none" && *mode != "allowlist" && *mode != "open") {
      return bad_field("network.mode", "must be one of none, allowlist, open");
    }
    if (!network_mode_built(*mode)) {
      return not_supported("network.mode", "\"" + *mode + "\"");
    }
    out->mode = std::move(*mode);
  }
  if (allow && !allow->empty() && out->mode != "allowlist") {
    return bad_field("network.allow", "needs network.mode \"allowlist\"");
  }
  if (allow && out->mode == "allowlist") {
    // 400 naming the malformed entry, before anything is made (nothing half-applied).
    if (auto p = net::Policy::parse(*allow); !p) {
      return bad_field("network.allow", p.error().message);
    }
  }
  if (allow) out->allow = std::move(*allow);
  return {};
}

bool network_mode_built(std::string_view mode) {
  for (std::string_view m : kNetworkModesBuilt) {
    if (m == mode) return true;
  }
  return false;
}

Result<CreateSessionRequest> decode_create_session(const json& body,
                                                   std::string_view default_scope) {
  // API.md's fields of features not built yet (the cluster): 501 naming them, not the
  // unknown-field 400 (they are the contract, just not done).
  for (const char* later : {"node"}) {
    if (lookup(body, later) != nullptr) {
      return fail(Code::kNotSupported,
                  std::string("field '") + later + "' is not built in this version");
    }
  }
  AB_TRY(check_known_fields(
      body, {"id", "scope", "variables", "backend", "runner", "template", "mounts", "extra_mounts",
             "host_path", "mount_path", "host_path_mode", "skills", "skill_mode", "limits",
             "network", "env", "ttl_sec", "labels", "image", "read_only_rootfs"}));
  CreateSessionRequest req;
  AB_ASSIGN_OR_RETURN(auto id, opt_string(body, "id"));
  AB_ASSIGN_OR_RETURN(auto scope, opt_string(body, "scope"));
  AB_ASSIGN_OR_RETURN(auto vars, decode_variables(body));
  if (id && scope) return fail(Code::kInvalid, "give either 'id' or 'scope', not both");
  if (!id && !scope && !default_scope.empty() && lookup(body, "variables") != nullptr) {
    scope = std::string(default_scope);
  }
  if (id) {
    if (auto st = session::validate_id(*id); !st) return std::unexpected(st.error());
    req.id = std::move(*id);
  } else if (scope) {
    AB_ASSIGN_OR_RETURN(req.id, session::render_scope(*scope, vars));
  } else {
    return fail(Code::kInvalid, "field 'id' (or 'scope') is required");
  }

  session::SessionSpec& spec = req.spec;
  AB_ASSIGN_OR_RETURN(auto backend, opt_string(body, "backend"));
  if (backend) spec.backend = std::move(*backend);
  AB_ASSIGN_OR_RETURN(auto runner, opt_string(body, "runner"));
  if (runner) {
    if (runner->empty()) return bad_field("runner", "must not be empty");
    if (spec.backend.empty()) spec.backend = "remote";
    if (spec.backend != "remote") return bad_field("runner", "is for backend \"remote\" only");
    spec.runner = std::move(*runner);
  } else if (spec.backend == "remote") {
    return bad_field("runner", "is required with backend \"remote\" (the runner user)");
  }
  AB_ASSIGN_OR_RETURN(auto tmpl, opt_string(body, "template"));
  if (tmpl) spec.template_name = std::move(*tmpl);  // resolved by the session manager

  if (auto st = decode_mount_list(body, "mounts", &spec.mounts); !st) {
    return std::unexpected(st.error());
  }
  if (auto st = decode_mount_list(body, "extra_mounts", &spec.mounts); !st) {
    return std::unexpected(st.error());
  }
  if (auto st = decode_primary_mount(body, &spec); !st) {
    return std::unexpected(st.error());
  }
  if (auto st = decode_skills(body, &spec); !st) return std::unexpected(st.error());
  AB_ASSIGN_OR_RETURN(spec.limits, decode_limits(body, "limits"));
  if (auto st = decode_network(body, &spec.network); !st) {
    return std::unexpected(st.error());
  }
  AB_ASSIGN_OR_RETURN(auto env, opt_string_map(body, "env"));
  if (env) {
    if (auto st = validate::env(*env, "env"); !st) return std::unexpected(st.error());
    spec.env = std::move(*env);
  }
  AB_ASSIGN_OR_RETURN(auto ttl, opt_uint(body, "ttl_sec", std::uint64_t{1} << 40));
  if (ttl) spec.ttl_sec = static_cast<std::int64_t>(*ttl);
  AB_ASSIGN_OR_RETURN(auto labels, opt_string_map(body, "labels"));
  if (labels) spec.labels = std::move(*labels);
  // API.md "Images": a reference or digest (the session manager checks it and the backend).
  AB_ASSIGN_OR_RETURN(auto image, opt_string(body, "image"));
  if (image && image->empty()) return bad_field("image", "must be an image reference or digest");
  if (image) spec.image_ref = std::move(*image);
  if (const json* ro = lookup(body, "read_only_rootfs")) {
    if (!ro->is_boolean()) return bad_field("read_only_rootfs", "must be true or false");
    spec.read_only_rootfs = ro->get<bool>();
  }
  if (spec.backend == "remote" && (!spec.mounts.empty() || !spec.skills.empty())) {
    return not_supported(spec.mounts.empty() ? "skills" : "mounts",
                         "on a remote runner (the runner's machine has no daemon host paths)");
  }
  return req;
}

Result<sandbox::ExecSpec> decode_exec(const json& body) {
  AB_TRY(check_known_fields(body, {"command", "argv", "cwd", "env", "stdin", "timeout_sec",
                                   "max_output_bytes", "artifact_dir"}));
  return decode_exec_fields(body);
}

Result<session::SessionManager::Update> decode_session_patch(const json& body) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& key = it.key();
    if (key != "limits" && key != "ttl_sec" && key != "labels") {
      return bad_field(key, "is not a field of a session change (limits, ttl_sec, labels)");
    }
  }
  session::SessionManager::Update u;
  if (lookup(body, "limits")) {
    AB_ASSIGN_OR_RETURN(u.limits, decode_limits(body, "limits"));
  }
  AB_ASSIGN_OR_RETURN(auto ttl, opt_uint(body, "ttl_sec", std::uint64_t{1} << 40));
  if (ttl) u.ttl_sec = static_cast<std::int64_t>(*ttl);
  AB_ASSIGN_OR_RETURN(u.labels, opt_string_map(body, "labels"));
  if (!u.limits && !u.ttl_sec && !u.labels) {
    return fail(Code::kInvalid, "give 'limits', 'ttl_sec' or 'labels' to change");
  }
  return u;
}

Result<std::string> decode_seed_agent(const json& body) { return session_of(body, "agent_id"); }

Result<SeedExecRequest> decode_seed_exec(const json& body) {
  SeedExecRequest req;
  AB_ASSIGN_OR_RETURN(req.spec, decode_exec_fields(body));
  AB_ASSIGN_OR_RETURN(req.session_id, session_of(body, "agent_id' (or 'env.AGENT_ID"));
  AB_ASSIGN_OR_RETURN(req.limits, decode_limits(body, "cgroup"));
  // Seed 001: commands run in the agent's workspace.
  if (req.spec.cwd.empty()) req.spec.cwd = "/workspace";
  return req;
}

Result<SeedFileRequest> decode_seed_read(const json& body) {
  SeedFileRequest req;
  AB_ASSIGN_OR_RETURN(req.session_id, session_of(body, "agent_id"));
  AB_ASSIGN_OR_RETURN(req.path, req_string(body, "path"));
  if (req.path.empty()) return bad_field("path", "must not be empty");
  return req;
}

Result<SeedFileRequest> decode_seed_write(const json& body) {
  AB_ASSIGN_OR_RETURN(auto req, decode_seed_read(body));
  AB_ASSIGN_OR_RETURN(req.content, req_string(body, "content"));
  return req;
}

Result<std::string> decode_mkdir(const json& body) {
  AB_TRY(check_known_fields(body, {"path"}));
  AB_ASSIGN_OR_RETURN(auto path, req_string(body, "path"));
  if (path.empty()) return bad_field("path", "must not be empty");
  return path;
}

Result<RenameRequest> decode_rename(const json& body) {
  AB_TRY(check_known_fields(body, {"from", "to"}));
  RenameRequest r;
  AB_ASSIGN_OR_RETURN(r.from, req_string(body, "from"));
  AB_ASSIGN_OR_RETURN(r.to, req_string(body, "to"));
  if (r.from.empty()) return bad_field("from", "must not be empty");
  if (r.to.empty()) return bad_field("to", "must not be empty");
  return r;
}

std::string rfc3339(std::chrono::system_clock::time_point t) {
  return rfc3339_ns(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

std::string rfc3339_ns(std::int64_t ns) {
  // Floor division, so times before 1970 still name the right second.
  std::int64_t secs = ns / 1'000'000'000;
  if (ns % 1'000'000'000 < 0) --secs;
  time_t tt = static_cast<time_t>(secs);
  struct tm tm {};
  gmtime_r(&tt, &tm);
  char buf[64];
  std::size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return std::string(buf, n);
}

namespace {
std::string& node_name_storage() {
  static std::string name;
  return name;
}
}  // namespace

void set_node_name(std::string name) {
  node_name_storage() = std::move(name);
}
const std::string& node_name() {
  return node_name_storage();
}

json encode_session(const session::SessionInfo& s) {
  json limits = json::object();
  const sandbox::Limits& l = s.spec.limits;
  if (l.memory_mb) limits["memory_mb"] = *l.memory_mb;
  if (l.cpu_percent) limits["cpu_percent"] = *l.cpu_percent;
  if (l.max_pids) limits["max_pids"] = *l.max_pids;
  if (l.disk_mb) limits["disk_mb"] = *l.disk_mb;
  if (l.max_open_files) limits["max_open_files"] = *l.max_open_files;
  if (l.cpu_time_sec) limits["cpu_time_sec"] = *l.cpu_time_sec;
  if (l.tmp_mb) limits["tmp_mb"] = *l.tmp_mb;
  json j = {
      {"id", s.id},
      {"state", session::state_name(s.state)},
      {"backend", s.backend},
      {"workspace", s.workspace},
      {"created_at", rfc3339(s.created_at)},
      {"last_used_at", rfc3339(s.last_used_at)},
      {"limits", std::move(limits)},
      {"network", {{"mode", s.spec.network.mode}, {"allow", s.spec.network.allow}}},
      {"labels", s.spec.labels},
      {"uid", s.uid ? json(*s.uid) : json(nullptr)},
  };
  // What the box binds of the client's: its mounts and skills as given (host paths are the
  // client's own), with each skill's mode.
  json mounts = json::array();
  for (const session::MountSpec& m : s.spec.mounts) {
    mounts.push_back({{"host_path", m.host_path}, {"mount_path", m.mount_path}, {"mode", m.mode}});
  }
  j["mounts"] = std::move(mounts);
  // Seed 002's primary mount as given (null without one); mount_path /workspace: the workspace is
  // that host dir.
  const session::MountSpec& p = s.spec.primary;
  const bool primary = !p.host_path.empty();
  j["host_path"] = primary ? json(p.host_path) : json(nullptr);
  j["host_path_mode"] = primary ? json(p.mode) : json(nullptr);
  j["mount_path"] = primary ? json(p.mount_path) : json(nullptr);
  j["skills"] = s.spec.skills;
  json skill_modes = json::object();
  for (const auto& [name, dir] : s.spec.skills) {
    skill_modes[name] = s.spec.read_only_skills.count(name) > 0 ? "ro" : "rw";
  }
  j["skill_modes"] = std::move(skill_modes);
  j["node"] = node_name();  // the node that holds it (API.md "Cluster")
  if (!s.tenant.empty()) j["tenant"] = s.tenant;
  if (!s.spec.template_name.empty()) j["template"] = s.spec.template_name;
  if (!s.spec.snapshot.empty()) {
    j["snapshot"] = {{"id", s.spec.snapshot}, {"version", s.spec.template_version}};
  }
  if (!s.spec.runner.empty()) j["runner"] = s.spec.runner;
  if (s.spec.ttl_sec) j["ttl_sec"] = *s.spec.ttl_sec;
  j["image"] = s.spec.image_digest.empty()
                   ? json(nullptr)
                   : json{{"ref", s.spec.image_ref}, {"digest", s.spec.image_digest}};
  j["read_only_rootfs"] = s.spec.read_only_rootfs;
  return j;
}

json encode_artifacts(const std::vector<sandbox::Artifact>& artifacts) {
  json out = json::array();
  for (const auto& a : artifacts) {
    out.push_back({{"path", a.path}, {"size", a.size}, {"mime_type", a.mime_type}});
  }
  return out;
}

json encode_exec_result(const sandbox::ExecResult& r) {
  return {
      {"stdout", r.stdout_data},
      {"stderr", r.stderr_data},
      {"exit_code", r.exit_code},
      {"signal", r.signal ? json(*r.signal) : json(nullptr)},
      {"timed_out", r.timed_out},
      {"killed_by", encode_killed_by(r.killed_by)},
      {"stdout_truncated", r.stdout_truncated},
      {"stderr_truncated", r.stderr_truncated},
      {"duration_ms", r.duration.count()},
      {"artifacts", encode_artifacts(r.artifacts)},
  };
}

json encode_killed_by(sandbox::KilledBy k) {
  if (k == sandbox::KilledBy::kNone) return nullptr;
  return std::string(sandbox::killed_by_name(k));
}

json encode_seed_exec_result(const sandbox::ExecResult& r) {
  return {
      {"stdout", r.stdout_data},
      {"stderr", r.stderr_data},
      {"exit_code", r.exit_code},
      {"duration_ms", r.duration.count()},
      {"artifacts", encode_artifacts(r.artifacts)},
  };
}

json encode_file_info(const sandbox::FileInfo& f) {
  return {
      {"name", f.name},
      {"path", f.path},
      {"size", f.size},
      {"mode", f.mode},
      {"mod_time", rfc3339_ns(f.mod_time_ns)},
      {"is_dir", f.is_dir},
      {"is_symlink", f.is_symlink},
  };
}

json encode_dir(const std::vector<sandbox::DirEntry>& entries) {
  json out = json::array();
  for (const auto& e : entries) {
    out.push_back({
        {"name", e.name},
        {"is_dir", e.is_dir},
        {"is_symlink", e.is_symlink},
        {"size", e.size},
        {"mode", e.mode},
        {"mod_time", rfc3339_ns(e.mod_time_ns)},
    });
  }
  return {{"entries", std::move(out)}};
}

std::size_t utf8_incomplete_tail(std::string_view s) {
  // Look back at most 3 bytes for the lead byte of a sequence that needs more bytes than remain.
  std::size_t n = s.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    std::size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace agentbox::server

// Processes and terminals.
namespace agentbox::server {

Result<sandbox::PtySize> decode_pty_size(const json& body, std::string_view prefix) {
  sandbox::PtySize size;
  for (auto [key, out] : {std::pair<std::string_view, std::uint16_t*>{"cols", &size.cols},
                          std::pair<std::string_view, std::uint16_t*>{"rows", &size.rows}}) {
    AB_ASSIGN_OR_RETURN(auto v, opt_uint(body, key, 1000, prefix));
    if (!v) return missing(name_of(prefix, key));
    if (*v == 0) return bad_field(name_of(prefix, key), "must be at least 1");
    *out = static_cast<std::uint16_t>(*v);
  }
  return size;
}

Result<sandbox::ProcessSpec> decode_process_start(const json& body) {
  AB_TRY(check_known_fields(body,
                            {"command", "argv", "cwd", "env", "tag", "stdin", "pty", "restart"}));
  sandbox::ProcessSpec spec;
  AB_TRY(decode_command(body, &spec));
  AB_ASSIGN_OR_RETURN(auto cwd, opt_string(body, "cwd"));
  if (cwd) {
    if (has_nul(*cwd)) return bad_field("cwd", "must not contain NUL");
    spec.cwd = std::move(*cwd);
  }
  AB_ASSIGN_OR_RETURN(auto env, opt_string_map(body, "env"));
  if (env) {
    if (auto st = validate::env(*env, "env"); !st) return std::unexpected(st.error());
    spec.env = std::move(*env);
  }
  AB_ASSIGN_OR_RETURN(auto tag, opt_string(body, "tag"));
  if (tag) {
    bool digits = !tag->empty();
    bool ok = !tag->empty() && tag->size() <= 64;
    for (char c : *tag) {
      if (c < '0' || c > '9') digits = false;
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
        ok = false;
      }
    }
    if (!ok || digits) {
      return bad_field("tag", "must be 1 to 64 of [A-Za-z0-9._-] and not all digits");
    }
    spec.tag = std::move(*tag);
  }
  if (const json* s = lookup(body, "stdin")) {
    if (!s->is_boolean()) return bad_field("stdin", "must be true or false");
    spec.stdin_open = s->get<bool>();
  }
  if (const json* p = lookup(body, "pty")) {
    if (!p->is_object()) return bad_field("pty", "must be an object {cols, rows}");
    AB_TRY(check_known_fields(*p, {"cols", "rows"}, "pty"));
    AB_ASSIGN_OR_RETURN(auto size, decode_pty_size(*p, "pty"));
    spec.pty = size;
    spec.stdin_open = true;  // a terminal is typed into
  }
  AB_ASSIGN_OR_RETURN(auto restart, opt_string(body, "restart"));
  if (restart) {
    if (*restart == "on-failure") {
      spec.restart = sandbox::ProcessSpec::Restart::kOnFailure;
    } else if (*restart == "always") {
      spec.restart = sandbox::ProcessSpec::Restart::kAlways;
    } else if (*restart != "never") {
      return bad_field("restart", "must be one of never, on-failure, always");
    }
  }
  return spec;
}

Result<int> decode_signal(const json& body) {
  AB_TRY(check_known_fields(body, {"signal"}));
  const json* v = lookup(body, "signal");
  if (!v) return missing("signal");
  std::optional<int> signo;
  if (v->is_string()) {
    signo = sandbox::parse_signal(v->get_ref<const std::string&>());
  } else if (v->is_number_integer()) {
    signo = sandbox::parse_signal(std::to_string(v->get<std::int64_t>()));
  } else {
    return bad_field("signal", "must be a signal name or number");
  }
  if (!signo) {
    return bad_field("signal", "must be one of SIGINT, SIGTERM, SIGKILL, SIGHUP, SIGUSR1, SIGUSR2");
  }
  return *signo;
}

json encode_process(const sandbox::ProcessInfo& p) {
  json j = json::object();
  j["pid"] = p.pid;
  j["tag"] = p.tag.empty() ? json(nullptr) : json(p.tag);
  if (!p.argv.empty()) {
    j["argv"] = p.argv;
  } else {
    j["command"] = p.command;
  }
  j["cwd"] = p.cwd;
  j["state"] = std::string(sandbox::state_name(p.state));
  j["exit_code"] = p.exit_code ? json(*p.exit_code) : json(nullptr);
  j["signal"] = p.signal ? json(*p.signal) : json(nullptr);
  j["started_at"] = rfc3339(p.started_at);
  j["ended_at"] = p.ended_at ? json(rfc3339(*p.ended_at)) : json(nullptr);
  j["restarts"] = p.restarts;
  j["managed"] = p.managed;
  if (p.pty) {
    j["pty"] = {{"cols", p.pty->cols}, {"rows", p.pty->rows}};
  } else {
    j["pty"] = nullptr;
  }
  j["stdin"] = p.stdin_open;
  return j;
}

Result<sandbox::InstallRequest> decode_install(const json& body) {
  AB_TRY(check_known_fields(body, {"manager", "packages", "persist", "no_index", "index_url",
                                   "find_links", "timeout_sec"}));
  sandbox::InstallRequest req;
  AB_ASSIGN_OR_RETURN(auto manager, req_string(body, "manager"));
  AB_ASSIGN_OR_RETURN(req.manager, sandbox::parse_manager(manager));
  AB_ASSIGN_OR_RETURN(auto packages, opt_string_array(body, "packages"));
  if (!packages) return missing("packages");
  req.packages = std::move(*packages);
  for (auto [key, field] :
       {std::pair{"persist", &req.persist}, std::pair{"no_index", &req.python.no_index}}) {
    const json* v = lookup(body, key);
    if (v && !v->is_boolean()) return bad_field(key, "must be true or false");
    if (v) *field = v->get<bool>();
  }
  AB_ASSIGN_OR_RETURN(auto index_url, opt_string(body, "index_url"));
  if (index_url) req.python.index_url = std::move(*index_url);
  AB_ASSIGN_OR_RETURN(auto find_links, opt_string_array(body, "find_links"));
  if (find_links) req.python.find_links = std::move(*find_links);
  AB_ASSIGN_OR_RETURN(auto timeout, opt_number(body, "timeout_sec"));
  if (timeout) {
    if (!(*timeout > 0) || *timeout > kMaxTimeoutSec) {
      return bad_field("timeout_sec", "must be greater than 0 and at most 86400");
    }
    req.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(*timeout * 1000));
  }
  if (auto st = sandbox::validate_install(req); !st) return std::unexpected(st.error());
  return req;
}

}  // namespace agentbox::server
