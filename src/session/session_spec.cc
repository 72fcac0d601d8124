// The session manager: the checks of a spec (internal/manager.h).

#include "session/internal/manager.h"

namespace agentbox::session {

namespace manager_detail {

// A skill name becomes one path component under /workspace/.skills/.
Status check_skill_name(const std::string& name) {
  if (auto st = validate_id(name); !st) {
    return fail(Code::kInvalid,
                "skills: invalid skill name (same rules as a session id): " + st.error().message);
  }
  return {};
}

// SECURITY: a client may only bind host paths under a configured root. The path is checked
// twice: as written (lexically normalised), before the filesystem is asked anything, so a client
// cannot probe which paths exist elsewhere on the host; and resolved (symlinks included), so a
// link under a root cannot lead out of it. Both on a '/' boundary (/srv/skills2 does not pass
// for /srv/skills). The resolved path is what the backend mounts. A missing path under a root
// is ENOENT (API.md "Sessions": 404 for a missing host dir).
Result<std::string> resolve_host_path(const std::string& host_path, const std::string& field,
                                      const std::vector<std::string>& roots) {
  if (host_path.empty() || host_path[0] != '/') {
    return fail(Code::kInvalid, field + ": host path must be absolute");
  }
  if (host_path.find('\0') != std::string::npos) {
    return fail(Code::kInvalid, field + ": host path contains NUL");
  }
  // As written, normalised lexically ("//", "." and ".." folded).
  std::string lexical = std::filesystem::path(host_path).lexically_normal().string();
  while (lexical.size() > 1 && lexical.back() == '/') lexical.pop_back();
  auto allowed = [&roots](const std::string& path, bool resolve_roots) {
    for (const std::string& root : roots) {
      if (!resolve_roots && paths::at_or_under(path, root)) return true;
      char rbuf[PATH_MAX];
      if (::realpath(root.c_str(), rbuf) == nullptr) continue;  // a missing root allows nothing
      if (paths::at_or_under(path, rbuf)) return true;
    }
    return false;
  };
  auto denied = [&] {
    return fail(Code::kAccess,
                field + ": mount of " + host_path + " denied: not under an allowed mount root");
  };
  if (!allowed(lexical, false) && !allowed(lexical, true)) return denied();
  char buf[PATH_MAX];
  if (::realpath(host_path.c_str(), buf) == nullptr) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return std::unexpected(
          Error{Code::kNotFound, err, field + ": no such host dir: " + host_path});
    }
    // A bad field of the request (400), not a missing file of the session.
    Error e = Error::from_errno(err, field + ": realpath(" + host_path + ")");
    e.code = Code::kInvalid;
    return std::unexpected(std::move(e));
  }
  std::string resolved(buf);
  if (!allowed(resolved, true)) return denied();
  return resolved;
}

// Cheap checks of a client spec (no filesystem access), before any state is touched.
Status validate_spec(const SessionSpec& spec) {
  for (std::size_t i = 0; i < spec.mounts.size(); ++i) {
    const MountSpec& m = spec.mounts[i];
    std::string field = "mounts[" + std::to_string(i) + "]";
    if (m.mode != "rw" && m.mode != "ro" && m.mode != "none") {
      return fail(Code::kInvalid, field + ".mode: must be rw, ro or none, not \"" + m.mode + "\"");
    }
    if (auto st = validate::mount_target(m.mount_path, field + ".mount_path"); !st) return st;
  }
  for (const auto& [name, dir] : spec.skills) {
    if (auto st = check_skill_name(name); !st) return st;
  }
  for (const std::string& name : spec.read_only_skills) {
    if (spec.skills.count(name) == 0) {
      return fail(Code::kInvalid, "skill_mode: names no skill \"" + name + "\"");
    }
  }
  const std::string& mode = spec.network.mode;
  if (mode != "none" && mode != "allowlist" && mode != "open") {
    return fail(Code::kInvalid,
                "network.mode: must be none, allowlist or open, not \"" + mode + "\"");
  }
  if (mode == "allowlist") {
    if (auto p = net::Policy::parse(spec.network.allow); !p) {
      return fail(Code::kInvalid, "network.allow: " + p.error().message);
    }
  } else if (!spec.network.allow.empty()) {
    return fail(Code::kInvalid, "network.allow: needs network.mode \"allowlist\"");
  }
  if (auto st = validate::env(spec.env, "env"); !st) return st;
  if (spec.ttl_sec && *spec.ttl_sec < 0) return fail(Code::kInvalid, "ttl_sec: must be >= 0");
  const std::string& pm = spec.primary.mode;
  if (!spec.primary.host_path.empty() && pm != "rw" && pm != "ro" && pm != "none") {
    return fail(Code::kInvalid, "host_path_mode: must be rw, ro or none, not \"" + pm + "\"");
  }
  if (auto st = check_host_workspace(spec); !st) return st;
  return {};
}

// A re-create must not silently drop what it asks for: every field the request sets, except
// labels and ttl_sec (which may change), must equal the session's; else 409 EEXIST naming the
// first field that differs.
Status check_same_spec(const std::string& id, const SessionSpec& have, const SessionSpec& want) {
  auto differs = [&](const std::string& field) -> Status {
    return fail(Code::kExists, "session " + id + " already exists with a different " + field +
                                   "; leave " + field + " out, or delete the session first");
  };
  if (!want.backend.empty() && want.backend != have.backend) return differs("backend");
  if (!want.template_name.empty() && want.template_name != have.template_name) {
    return differs("template");
  }
  // Mounts and skills: each one asked for must be the session's (it may have more, added
  // through POST .../mounts since, so that a client re-creating with its first list still gets
  // the session).
  for (const MountSpec& w : want.mounts) {
    bool found = false;
    for (const MountSpec& h : have.mounts) {
      found =
          found || (w.host_path == h.host_path && w.mount_path == h.mount_path && w.mode == h.mode);
    }
    if (!found) return differs("mounts");
  }
  if (!want.primary.host_path.empty() && (want.primary.host_path != have.primary.host_path ||
                                          want.primary.mount_path != have.primary.mount_path ||
                                          want.primary.mode != have.primary.mode)) {
    return differs("host_path");
  }
  for (const auto& [name, dir] : want.skills) {
    auto it = have.skills.find(name);
    if (it == have.skills.end() || it->second != dir ||
        want.read_only_skills.count(name) != have.read_only_skills.count(name)) {
      return differs("skills");
    }
  }
  if (!want.env.empty() && want.env != have.env) return differs("env");
  const sandbox::Limits& wl = want.limits;
  const sandbox::Limits& hl = have.limits;
  if (wl.memory_mb && wl.memory_mb != hl.memory_mb) return differs("limits.memory_mb");
  if (wl.cpu_percent && wl.cpu_percent != hl.cpu_percent) return differs("limits.cpu_percent");
  if (wl.max_pids && wl.max_pids != hl.max_pids) return differs("limits.max_pids");
  if (wl.disk_mb && wl.disk_mb != hl.disk_mb) return differs("limits.disk_mb");
  if (wl.max_open_files && wl.max_open_files != hl.max_open_files) {
    return differs("limits.max_open_files");
  }
  if (wl.cpu_time_sec && wl.cpu_time_sec != hl.cpu_time_sec) return differs("limits.cpu_time_sec");
  if (wl.tmp_mb && wl.tmp_mb != hl.tmp_mb) return differs("limits.tmp_mb");
  const bool network_given = want.network.mode != "none" || !want.network.allow.empty();
  if (network_given &&
      (want.network.mode != have.network.mode || want.network.allow != have.network.allow)) {
    return differs("network");
  }
  return {};
}

}  // namespace manager_detail

}  // namespace agentbox::session
