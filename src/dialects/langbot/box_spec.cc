// LangBot's Box runtime: BoxSpec and BoxManagedProcessSpec (models.py), validated as pydantic
// would with its messages, and a BoxSpec's mapping onto an agentbox session spec. The BoxSpec
// fields a session was made with are kept in its labels, so a later action can tell a conflict
// and show them back (BoxSessionInfo).

#include <cmath>
#include <string>
#include <utility>

#include "common/paths.h"
#include "common/validate.h"
#include "dialects/langbot/internal.h"
#include "server/json_codec.h"
#include "session/host_workspace.h"

namespace agentbox::server::detail::langbot {
namespace {

// A field of a pydantic model: absent -> fallback; `nullable` fields take null.
struct Fields {
  const json& data;
  std::string_view model;

  const json* find(const char* k) const {
    auto it = data.find(k);
    return it == data.end() ? nullptr : &*it;
  }
  LbResult<std::string> str(const char* k, std::string fallback) const {
    const json* v = find(k);
    if (v == nullptr) return fallback;
    if (!v->is_string())
      return std::unexpected(validation(model, k, "Input should be a valid string"));
    return v->get<std::string>();
  }
  LbResult<std::optional<std::string>> opt_str(const char* k) const {
    const json* v = find(k);
    if (v == nullptr || v->is_null()) return std::optional<std::string>{};
    if (!v->is_string())
      return std::unexpected(validation(model, k, "Input should be a valid string"));
    return std::optional<std::string>(v->get<std::string>());
  }
  LbResult<std::int64_t> integer(const char* k, std::int64_t fallback, std::int64_t min,
                                 std::string_view bound) const {
    const json* v = find(k);
    std::int64_t n = fallback;
    if (v != nullptr) {
      if (v->is_number_integer()) {
        n = v->get<std::int64_t>();
      } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
                 std::floor(v->get<double>()) == v->get<double>() &&
                 std::fabs(v->get<double>()) < 9e15) {
        n = static_cast<std::int64_t>(v->get<double>());
      } else {
        return std::unexpected(validation(model, k, "Input should be a valid integer"));
      }
    }
    if (n < min)
      return std::unexpected(validation(model, k, "Input should be " + std::string(bound)));
    return n;
  }
  LbResult<bool> boolean(const char* k, bool fallback) const {
    const json* v = find(k);
    if (v == nullptr) return fallback;
    if (!v->is_boolean())
      return std::unexpected(validation(model, k, "Input should be a valid boolean"));
    return v->get<bool>();
  }
  // {str: str}, values coerced to str (numbers and booleans as Python prints them).
  LbResult<std::map<std::string, std::string>> str_map(const char* k) const {
    std::map<std::string, std::string> out;
    const json* v = find(k);
    if (v == nullptr) return out;
    if (!v->is_object())
      return std::unexpected(validation(model, k, "Input should be a valid dictionary"));
    for (auto it = v->begin(); it != v->end(); ++it) {
      const json& x = it.value();
      if (x.is_string()) {
        out[it.key()] = x.get<std::string>();
      } else if (x.is_boolean()) {
        out[it.key()] = x.get<bool>() ? "True" : "False";
      } else if (x.is_number()) {
        out[it.key()] = x.dump();
      } else {
        return std::unexpected(
            validation(model, std::string(k) + "." + it.key(), "Input should be a valid string"));
      }
    }
    return out;
  }
};

bool absolute(std::string_view p) {
  return !p.empty() && p.front() == '/';
}

LbResult<std::string> mount_mode(const Fields& f, const char* k) {
  auto m = f.str(k, "rw");
  if (!m) return std::unexpected(m.error());
  if (*m != "rw" && *m != "ro" && *m != "none") {
    return std::unexpected(validation(f.model, k, "Input should be 'rw', 'ro' or 'none'"));
  }
  return m;
}

#define LB_TRY(var, expr)                                \
  auto var##_r = (expr);                                 \
  if (!var##_r) return std::unexpected(var##_r.error()); \
  auto var = std::move(*var##_r)

}  // namespace

LbResult<BoxSpec> decode_box_spec(const json& data, bool need_cmd) {
  Fields f{data, "BoxSpec"};
  BoxSpec s;
  LB_TRY(cmd, f.str("cmd", ""));
  s.cmd = py_strip(cmd);
  if (need_cmd && s.cmd.empty())
    return std::unexpected(validation("BoxSpec", "cmd", "cmd must not be empty"));
  LB_TRY(mount_path, f.str("mount_path", "/workspace"));
  if (!absolute(mount_path))
    return std::unexpected(
        validation("BoxSpec", "mount_path", "mount_path must be an absolute path"));
  const json* wd = f.find("workdir");
  if (wd == nullptr) {
    s.workdir = "/workspace";
  } else if (wd->is_null() || (wd->is_string() && wd->get<std::string>().empty())) {
    s.workdir = mount_path;  // empty or null takes mount_path
  } else if (!wd->is_string()) {
    return std::unexpected(validation("BoxSpec", "workdir", "Input should be a valid string"));
  } else {
    s.workdir = wd->get<std::string>();
  }
  if (!absolute(s.workdir))
    return std::unexpected(validation("BoxSpec", "workdir", "workdir must be an absolute path"));
  LB_TRY(timeout, f.integer("timeout_sec", 30, 1, "greater than 0"));
  if (timeout > static_cast<std::int64_t>(kMaxTimeoutSec)) {
    return std::unexpected(
        validation("BoxSpec", "timeout_sec", "agentbox runs a command for at most 86400 s"));
  }
  s.timeout_sec = timeout;
  LB_TRY(network, f.str("network", "off"));
  if (network != "off" && network != "on")
    return std::unexpected(validation("BoxSpec", "network", "Input should be 'off' or 'on'"));
  if (f.find("session_id") == nullptr)
    return std::unexpected(validation("BoxSpec", "session_id", "Field required"));
  LB_TRY(sid, f.str("session_id", ""));
  s.session_id = py_strip(sid);
  if (s.session_id.empty())
    return std::unexpected(validation("BoxSpec", "session_id", "session_id must not be empty"));
  LB_TRY(env, f.str_map("env"));
  s.env = std::move(env);
  LB_TRY(image, f.str("image", kDefaultImage));
  LB_TRY(host_path, f.opt_str("host_path"));
  if (host_path && !absolute(*host_path))
    return std::unexpected(
        validation("BoxSpec", "host_path", "host_path must be an absolute path"));
  LB_TRY(host_mode, mount_mode(f, "host_path_mode"));
  if (host_path && host_mode != "none" && !paths::at_or_under(s.workdir, mount_path)) {
    return std::unexpected(
        validation("BoxSpec", "workdir",
                   "workdir must be mount_path or lie under it when host_path is mounted"));
  }
  json mounts = json::array();
  if (const json* em = f.find("extra_mounts"); em != nullptr) {
    if (!em->is_array())
      return std::unexpected(validation("BoxSpec", "extra_mounts", "Input should be a valid list"));
    for (std::size_t i = 0; i < em->size(); ++i) {
      const json& m = (*em)[i];
      std::string where = "BoxSpec.extra_mounts." + std::to_string(i);
      if (!m.is_object())
        return std::unexpected(validation(where, "", "Input should be a valid dictionary"));
      Fields mf{m, where};
      LB_TRY(hp, mf.str("host_path", ""));
      LB_TRY(mp, mf.str("mount_path", ""));
      if (!absolute(hp))
        return std::unexpected(
            validation(where, "host_path", "host_path must be an absolute path"));
      if (!absolute(mp))
        return std::unexpected(
            validation(where, "mount_path", "mount_path must be an absolute path"));
      LB_TRY(mode, mount_mode(mf, "mode"));
      mounts.push_back({{"host_path", hp}, {"mount_path", mp}, {"mode", mode}});
    }
  }
  LB_TRY(skill, f.opt_str("skill_name"));
  if (skill) {
    bool ok = !skill->empty() && skill->size() <= 64;
    for (char c : *skill)
      ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
    if (!ok)
      return std::unexpected(validation(
          "BoxSpec", "skill_name", "skill_name must be at most 64 characters of [A-Za-z0-9_-]"));
  }
  LB_TRY(persistent, f.boolean("persistent", false));
  double cpus = 1.0;
  if (const json* c = f.find("cpus"); c != nullptr) {
    if (!c->is_number())
      return std::unexpected(validation("BoxSpec", "cpus", "Input should be a valid number"));
    cpus = c->get<double>();
    if (!(cpus > 0) || !std::isfinite(cpus))
      return std::unexpected(validation("BoxSpec", "cpus", "Input should be greater than 0"));
  }
  LB_TRY(memory, f.integer("memory_mb", 512, 32, "greater than or equal to 32"));
  LB_TRY(pids, f.integer("pids_limit", 128, 1, "greater than or equal to 1"));
  LB_TRY(ro_root, f.boolean("read_only_rootfs", true));
  LB_TRY(quota, f.integer("workspace_quota_mb", 0, 0, "greater than or equal to 0"));

  // Valid; now what agentbox does not do (never accepted and ignored).
  if (skill) {
    return lb_fail("BoxError",
                   "skill_name is not supported: agentbox has no skill store; mount "
                   "the skill with extra_mounts");
  }
  if (!ro_root && image == kDefaultImage) {
    return lb_fail("BoxError",
                   "read_only_rootfs=false needs an image: the default image is the host's "
                   "read-only system (name an OCI image in 'image' for a writable root of the "
                   "session's own)");
  }
  ojson& sh = s.shape;
  sh["image"] = image;
  sh["network"] = network;
  sh["host_path"] = host_path ? json(*host_path) : json(nullptr);
  sh["host_path_mode"] = host_mode;
  sh["mount_path"] = mount_path;
  sh["persistent"] = persistent;
  sh["cpus"] = cpus;
  sh["memory_mb"] = memory;
  sh["pids_limit"] = pids;
  sh["read_only_rootfs"] = ro_root;
  sh["workspace_quota_mb"] = quota;
  sh["extra_mounts"] = mounts;
  return s;
}

// The spec of the session that holds a BoxSpec's fields: cpus, memory_mb, pids_limit and
// workspace_quota_mb as its limits (checked as any create's: common/validate.h), network "on" as
// open, the primary and extra mounts (checked against the allowed roots when the box starts), a
// persistent session never idles out, and the fields themselves in its labels.
LbResult<session::SessionSpec> session_spec(const ojson& sh) {
  session::SessionSpec spec;
  // In 64 bits first: a value past a field's ceiling is refused, never cut down to it.
  const double pct = std::round(sh["cpus"].get<double>() * 100);
  const auto cpu = pct < 1e18 ? static_cast<std::uint64_t>(pct) : std::uint64_t{1} << 62;
  const auto pids = sh["pids_limit"].get<std::uint64_t>();
  for (auto [bounds, v] : {std::pair{validate::kCpuPercent, cpu}, {validate::kMaxPids, pids}}) {
    if (auto st = validate::limit(bounds, v, "limits"); !st) {
      return std::unexpected(lb_error(st.error(), About::kSession));
    }
  }
  sandbox::Limits& l = spec.limits;
  l.cpu_percent = static_cast<std::uint32_t>(cpu);
  l.max_pids = static_cast<std::uint32_t>(pids);
  l.memory_mb = sh["memory_mb"].get<std::uint64_t>();
  if (sh["workspace_quota_mb"].get<std::int64_t>() > 0) {
    l.disk_mb = sh["workspace_quota_mb"].get<std::uint64_t>();
  }
  if (auto st = validate::limits(l, "limits"); !st) {
    return std::unexpected(lb_error(st.error(), About::kSession));
  }
  spec.network.mode = sh["network"] == "on" ? "open" : "none";
  for (const auto& m : sh["extra_mounts"]) {
    spec.mounts.push_back({m["host_path"].get<std::string>(), m["mount_path"].get<std::string>(),
                           m["mode"].get<std::string>()});
  }
  if (!sh["host_path"].is_null()) {
    session::set_primary_mount(
        &spec, {sh["host_path"].get<std::string>(), sh["mount_path"].get<std::string>(),
                sh["host_path_mode"].get<std::string>()});
  }
  if (sh["persistent"].get<bool>()) spec.ttl_sec = 0;
  // The default image is the host's read-only system; any other is an OCI image (API.md
  // "Images"), pulled on first use by the create.
  if (const std::string image = sh["image"].get<std::string>(); image != kDefaultImage) {
    spec.image_ref = image;
    spec.read_only_rootfs = sh["read_only_rootfs"].get<bool>();
  }
  spec.labels[kSpecLabel] = sh.dump();
  return spec;
}

ojson stored_shape(const session::SessionInfo& s) {
  auto it = s.spec.labels.find(kSpecLabel);
  if (it == s.spec.labels.end()) return ojson::object();
  ojson j = ojson::parse(it->second, nullptr, false);
  return j.is_object() ? j : ojson::object();
}

ojson session_info(const Placement& p, const session::SessionInfo& s) {
  ojson sh = stored_shape(s);
  auto field = [&](const char* k) { return sh.contains(k) ? sh[k] : ojson(nullptr); };
  ojson j = ojson::object();
  j["session_id"] = logical_id(p, s.id);
  j["backend_name"] = "agentbox-" + s.backend;
  j["backend_session_id"] = s.id;
  for (const char* k :
       {"image", "network", "host_path", "host_path_mode", "mount_path", "persistent", "cpus",
        "memory_mb", "pids_limit", "read_only_rootfs", "workspace_quota_mb"}) {
    j[k] = field(k);
  }
  j["created_at"] = rfc3339(s.created_at);
  j["last_used_at"] = rfc3339(s.last_used_at);
  return j;
}
LbResult<std::string> process_id_of(const json& v) {
  if (!v.is_string())
    return std::unexpected(
        validation("BoxManagedProcessSpec", "process_id", "Input should be a valid string"));
  std::string id = v.get<std::string>();
  if (!validate::is_process_tag(id)) {
    return lb_fail("BoxValidationError",
                   "process_id '" + id +
                       "': agentbox names a process by at "
                       "most 64 characters of [A-Za-z0-9._-], not all digits");
  }
  return id;
}

LbResult<ProcSpec> decode_proc_spec(const json& v) {
  if (!v.is_object())
    return std::unexpected(
        validation("BoxManagedProcessSpec", "spec", "Input should be a valid dictionary"));
  Fields f{v, "BoxManagedProcessSpec"};
  ProcSpec p;
  json pid = v.contains("process_id") ? v["process_id"] : json("default");
  LB_TRY(process_id, process_id_of(pid));
  p.process_id = std::move(process_id);
  if (!f.find("command")) return std::unexpected(validation(f.model, "command", "Field required"));
  LB_TRY(command, f.str("command", ""));
  if (py_strip(command).empty())
    return std::unexpected(validation(f.model, "command", "command must not be empty"));
  p.argv.push_back(command);
  if (const json* args = f.find("args"); args != nullptr) {
    if (!args->is_array())
      return std::unexpected(validation(f.model, "args", "Input should be a valid list"));
    for (std::size_t i = 0; i < args->size(); ++i) {
      if (!(*args)[i].is_string())
        return std::unexpected(
            validation(f.model, "args." + std::to_string(i), "Input should be a valid string"));
      p.argv.push_back((*args)[i].get<std::string>());
    }
  }
  LB_TRY(env, f.str_map("env"));
  p.env = std::move(env);
  LB_TRY(cwd, f.str("cwd", "/workspace"));
  if (!absolute(cwd))
    return std::unexpected(validation(f.model, "cwd", "cwd must be an absolute path"));
  p.cwd = cwd;
  LB_TRY(memory, f.integer("memory_mb", 0, 0, "greater than or equal to 0"));
  if (memory != 0) {
    return lb_fail("BoxError",
                   "spec.memory_mb is not supported: a managed process shares its "
                   "box's memory limit (send 0)");
  }
  return p;
}

}  // namespace agentbox::server::detail::langbot
