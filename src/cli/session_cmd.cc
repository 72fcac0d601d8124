// agentbox session create | ls | show | rm | restore | suspend | resume | keepalive |
// mounts add, and agentbox health | repair

#include <algorithm>
#include <fstream>
#include <iterator>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/cli.h"

namespace agentbox::cli {
namespace {

using json = nlohmann::json;

bool ok(const client::Response& r) {
  return r.status >= 200 && r.status < 300;
}

std::string dump(const json& j) {
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}

// A reply body that should be JSON: the object, or an error already reported.
std::optional<json> parse_reply(const client::Response& r) {
  json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    report(Error::make(Code::kInternal,
                       "server reply is not JSON (HTTP " + std::to_string(r.status) + ")"));
    return std::nullopt;
  }
  return j;
}

std::string field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "-";
  if (it->is_string()) return it->get<std::string>();
  return it->dump();
}

json mount_json(const MountSpec& m) {
  return {{"host_path", m.host_path}, {"mount_path", m.mount_path}, {"mode", m.mode}};
}

// --mount and --skill arguments as the body's "mounts" and "skills"; EINVAL naming the bad one.
Status add_mounts_and_skills(const std::vector<std::string>& mounts,
                             const std::vector<std::string>& skills, json& body) {
  if (!mounts.empty()) {
    json out = json::array();
    for (const std::string& m : mounts) {
      auto parsed = parse_mount(m);
      if (!parsed) return std::unexpected(parsed.error());
      out.push_back(mount_json(*parsed));
    }
    body["mounts"] = std::move(out);
  }
  auto pairs = parse_pairs(skills, "--skill");
  if (!pairs) return std::unexpected(pairs.error());
  if (!pairs->empty()) body["skills"] = *pairs;
  return {};
}

// "2026-11-21T22:00:00Z" -> seconds since the epoch, or -1.
std::int64_t parse_utc(const std::string& s) {
  std::tm tm{};
  if (s.size() < 19 || ::strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return -1;
  return static_cast<std::int64_t>(::timegm(&tm));
}

// Seconds as "45s", "12m", "3h", "2d".
std::string human_duration(std::int64_t secs) {
  if (secs < 0) return "-";
  if (secs < 120) return std::to_string(secs) + "s";
  if (secs < 7200) return std::to_string(secs / 60) + "m";
  if (secs < 172800) return std::to_string(secs / 3600) + "h";
  return std::to_string(secs / 86400) + "d";
}

std::string since(const json& j, const char* key, std::int64_t now) {
  std::string t = field(j, key);
  std::int64_t at = parse_utc(t);
  return at < 0 ? "-" : human_duration(std::max<std::int64_t>(0, now - at));
}

std::string labels_of(const json& j) {
  auto it = j.find("labels");
  if (it == j.end() || !it->is_object() || it->empty()) return "-";
  std::string out;
  for (auto& [k, v] : it->items()) {
    if (!out.empty()) out += ',';
    out += k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  }
  return out;
}

}  // namespace

int session_create(const Globals& g, const SessionCreateArgs& a) {
  if (a.id.empty() == a.scope.empty()) {
    return usage("session create: give either an ID or --scope TEMPLATE");
  }
  if (!a.vars.empty() && a.scope.empty()) return usage("session create: --var needs --scope");
  auto vars = parse_pairs(a.vars, "--var");
  auto env = parse_pairs(a.env, "--env");
  auto labels = parse_pairs(a.labels, "--label");
  for (const auto* r : {&vars, &env, &labels}) {
    if (!*r) return usage(r->error().message);
  }

  json body = json::object();
  if (!a.id.empty()) {
    body["id"] = a.id;
  } else {
    body["scope"] = a.scope;
    body["variables"] = *vars;
  }
  if (!a.backend.empty()) body["backend"] = a.backend;
  if (!a.template_ref.empty()) body["template"] = a.template_ref;
  if (!a.image.empty()) body["image"] = a.image;
  if (a.writable_root) body["read_only_rootfs"] = false;
  if (!a.runner.empty()) body["runner"] = a.runner;
  if (!env->empty()) body["env"] = *env;
  if (!labels->empty()) body["labels"] = *labels;
  json limits = json::object();
  if (a.memory_mb) limits["memory_mb"] = *a.memory_mb;
  if (a.cpu_percent) limits["cpu_percent"] = *a.cpu_percent;
  if (a.max_pids) limits["max_pids"] = *a.max_pids;
  if (a.disk_mb) limits["disk_mb"] = *a.disk_mb;
  if (a.cpu_time_sec) limits["cpu_time_sec"] = *a.cpu_time_sec;
  if (a.tmp_mb) limits["tmp_mb"] = *a.tmp_mb;
  if (a.max_open_files) limits["max_open_files"] = *a.max_open_files;
  if (!limits.empty()) body["limits"] = limits;
  // --allow alone means an allowlist; with another mode it is a mistake the server would refuse.
  const std::string mode = a.network.empty() && !a.allow.empty() ? "allowlist" : a.network;
  if (!a.allow.empty() && mode != "allowlist") {
    return usage("session create: --allow needs --network allowlist");
  }
  if (!mode.empty()) {
    json net = {{"mode", mode}};
    if (!a.allow.empty()) net["allow"] = a.allow;
    body["network"] = std::move(net);
  }
  if (a.ttl_sec) {
    if (*a.ttl_sec < 0) return usage("--ttl: must be >= 0 (0: never)");
    body["ttl_sec"] = *a.ttl_sec;
  }
  if (auto st = add_mounts_and_skills(a.mounts, a.skills, body); !st) {
    return usage(st.error().message);
  }
  if (!a.host_path.empty()) {
    auto hp = parse_host_path(a.host_path);
    if (!hp) return usage(hp.error().message);
    body["host_path"] = hp->host_path;
    body["host_path_mode"] = hp->mode;
  }

  client::Client c(g.options());
  auto r =
      c.request("POST", "/v1/sessions", body.dump(-1, ' ', false, json::error_handler_t::replace));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  if (a.quiet) {
    std::cout << field(*j, "id") << '\n';
  } else {
    std::cout << dump(*j) << '\n';
  }
  return kExitOk;
}

namespace {

// GET `target`; with as_json prints the reply and returns nullopt (rc 0). nullopt with *rc set:
// an error (reported). Else the reply, for a table.
std::optional<json> get_listing(const Globals& g, const char* target, bool as_json, int* rc) {
  client::Client c(g.options());
  auto r = c.request("GET", target);
  if (!r) {
    *rc = report(r.error());
    return std::nullopt;
  }
  if (!ok(*r)) {
    *rc = report(*r);
    return std::nullopt;
  }
  auto j = parse_reply(*r);
  if (!j) {
    *rc = kExitServerError;
    return std::nullopt;
  }
  if (as_json) {
    std::cout << dump(*j) << '\n';
    *rc = kExitOk;
    return std::nullopt;
  }
  return j;
}

}  // namespace

int session_ls(const Globals& g, bool as_json) {
  int rc = kExitOk;
  auto j = get_listing(g, "/v1/sessions", as_json, &rc);
  if (!j) return rc;
  auto sessions = j->find("sessions");
  if (sessions == j->end() || !sessions->is_array()) {
    return report(Error::make(Code::kInternal, "server reply has no \"sessions\" array"));
  }
  std::vector<std::vector<std::string>> rows{
      {"ID", "STATE", "BACKEND", "UID", "AGE", "IDLE", "TTL", "LABELS"}};
  const std::int64_t now = static_cast<std::int64_t>(::time(nullptr));
  for (const json& s : *sessions) {
    if (!s.is_object()) continue;
    rows.push_back({field(s, "id"), field(s, "state"), field(s, "backend"), field(s, "uid"),
                    since(s, "created_at", now), since(s, "last_used_at", now), field(s, "ttl_sec"),
                    labels_of(s)});
  }
  print_table(rows);
  return kExitOk;
}

int runners_ls(const Globals& g, bool as_json) {
  int rc = kExitOk;
  auto j = get_listing(g, "/v1/runners", as_json, &rc);
  if (!j) return rc;
  auto runners = j->find("runners");
  if (runners == j->end() || !runners->is_array()) {
    return report(Error::make(Code::kInternal, "server reply has no \"runners\" array"));
  }
  std::vector<std::vector<std::string>> rows{
      {"USER", "CONNECTED", "WORKSPACE", "VERSION", "CONNECTED_AT", "LAST_SEEN"}};
  for (const json& x : *runners) {
    if (!x.is_object()) continue;
    rows.push_back({field(x, "user"), x.value("connected", false) ? "yes" : "no",
                    field(x, "workspace"), field(x, "version"), field(x, "connected_at"),
                    field(x, "last_seen")});
  }
  print_table(rows);
  return kExitOk;
}

int session_show(const Globals& g, const std::string& id) {
  client::Client c(g.options());
  auto r = c.request("GET", session_target(id));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  std::cout << dump(*j) << '\n';
  return kExitOk;
}

int session_rm(const Globals& g, const std::string& id, bool archive) {
  client::Client c(g.options());
  auto r = c.request("DELETE", session_target(id) + (archive ? "?archive=true" : ""));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  if (archive) {
    auto j = parse_reply(*r);
    if (!j) return kExitServerError;
    std::cout << field(*j, "archive") << '\n';
  }
  return kExitOk;
}

int session_lifecycle(const Globals& g, const std::string& id, const std::string& action) {
  client::Client c(g.options());
  auto r = c.request("POST", session_target(id) + "/" + action, "{}");
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  std::cout << field(*j, "id") << ' ' << field(*j, "state") << '\n';
  return kExitOk;
}

int session_restore(const Globals& g, const std::string& id, const std::string& archive) {
  // The archive is a path on the server (under its data_dir/archives), as `session rm
  // --archive` printed it; it is sent as given, never read here.
  json body = {{"archive", archive}};
  client::Client c(g.options());
  auto r = c.request("POST", session_target(id) + "/restore",
                     body.dump(-1, ' ', false, json::error_handler_t::replace));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  std::cout << dump(*j) << '\n';
  return kExitOk;
}

int session_check(const Globals& g, const std::string& id, const std::string& action,
                  bool as_json) {
  client::Client c(g.options());
  auto r = c.request("POST", session_target(id) + "/" + action, "{}");
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  auto healthy = j->find("healthy");
  auto checks = j->find("checks");
  if (!j->is_object() || healthy == j->end() || !healthy->is_boolean() || checks == j->end() ||
      !checks->is_array()) {
    return report(
        Error::make(Code::kInternal, action + " reply has no \"healthy\" and \"checks\""));
  }
  if (as_json) {
    std::cout << dump(*j) << '\n';
  } else {
    std::vector<std::vector<std::string>> rows{{"CHECK", "OK", "DETAIL"}};
    for (const json& ch : *checks) {
      if (!ch.is_object()) continue;
      auto okv = ch.find("ok");
      bool passed = okv != ch.end() && okv->is_boolean() && okv->get<bool>();
      rows.push_back({field(ch, "name"), passed ? "ok" : "FAIL", field(ch, "detail")});
    }
    print_table(rows);
    std::cout << id << ": " << (healthy->get<bool>() ? "healthy" : "unhealthy") << '\n';
  }
  return healthy->get<bool>() ? kExitOk : kExitUnhealthy;
}

int install(const Globals& g, const InstallArgs& a) {
  if (a.manager != "pip" && a.manager != "npm") {
    return usage("install: unknown package manager '" + a.manager + "' (pip or npm)");
  }
  if (a.packages.empty()) return usage("install: give at least one package");
  json body = {{"manager", a.manager}, {"packages", a.packages}, {"persist", !a.no_persist}};
  if (!a.index_url.empty()) body["index_url"] = a.index_url;
  if (!a.find_links.empty()) body["find_links"] = a.find_links;
  if (a.no_index) body["no_index"] = true;
  client::Client c(g.options());
  auto r = c.request("POST", session_target(a.id) + "/packages",
                     body.dump(-1, ' ', false, json::error_handler_t::replace));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  auto code = j->find("exit_code");
  if (!j->is_object() || code == j->end() || !code->is_number_integer()) {
    return report(Error::make(Code::kInternal, "packages reply has no \"exit_code\""));
  }
  if (a.json) {
    std::cout << dump(*j) << '\n';
  } else {
    auto text = [&](const char* key) {
      auto it = j->find(key);
      return it != j->end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    std::cout << text("stdout");
    std::cerr << text("stderr");
    if (auto rec = j->find("recorded"); rec != j->end() && rec->is_array() && !rec->empty()) {
      std::cout << "recorded in the workspace manifest:";
      for (const json& p : *rec) {
        if (p.is_string()) std::cout << ' ' << p.get<std::string>();
      }
      std::cout << '\n';
    }
    if (std::string err = text("error"); !err.empty()) std::cerr << "agentbox: " << err << '\n';
  }
  int rc = code->get<int>();
  return rc < 0 ? kExitTimedOut : rc;
}

int session_mounts_add(const Globals& g, const MountsAddArgs& a) {
  if (a.mounts.empty() && a.skills.empty()) {
    return usage("session mounts add: give at least one --mount or --skill");
  }
  json body = json::object();
  if (auto st = add_mounts_and_skills(a.mounts, a.skills, body); !st) {
    return usage(st.error().message);
  }
  if (!a.skill_mode.empty()) {
    if (a.skills.empty()) return usage("session mounts add: --skill-mode needs a --skill");
    body["skill_mode"] = a.skill_mode;
  }
  client::Client c(g.options());
  auto r = c.request("POST", session_target(a.id) + "/mounts",
                     body.dump(-1, ' ', false, json::error_handler_t::replace));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  if (a.json) {
    std::cout << dump(*j) << '\n';
    return kExitOk;
  }
  std::string applied = j->is_object() ? field(*j, "applied") : "-";
  std::cout << a.id << ": added, " << applied
            << (applied == "live"         ? " (visible to the next exec)"
                : applied == "next_start" ? " (in the box from its next start)"
                                          : "")
            << '\n';
  return kExitOk;
}

// ---- templates ----

int template_push(const Globals& g, const std::string& file) {
  std::string yaml;
  if (file == "-") {
    yaml.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    std::ifstream in(file, std::ios::binary);
    if (!in) return report(Error::make(Code::kNotFound, "cannot read " + file));
    yaml.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  client::Client c(g.options());
  auto r = c.request("POST", "/v1/templates", yaml, "application/yaml");
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  if (auto w = j->find("warnings"); w != j->end() && w->is_array()) {
    for (const json& line : *w) {
      if (line.is_string()) std::cerr << "agentbox: warning: " << line.get<std::string>() << '\n';
    }
  }
  std::cout << field(*j, "name") << ' ' << (r->status == 201 ? "created" : "replaced") << '\n';
  return kExitOk;
}

int template_ls(const Globals& g, bool as_json) {
  client::Client c(g.options());
  auto r = c.request("GET", "/v1/templates");
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  if (as_json) {
    std::cout << dump(*j) << '\n';
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows{{"NAME", "CURRENT", "SNAPSHOTS", "DESCRIPTION"}};
  auto list = j->find("templates");
  if (list == j->end() || !list->is_array()) {
    return report(Error::make(Code::kInternal, "server reply has no \"templates\" array"));
  }
  for (const json& t : *list) {
    if (!t.is_object()) continue;
    auto snaps = t.find("snapshots");
    std::size_t n = snaps != t.end() && snaps->is_array() ? snaps->size() : 0;
    rows.push_back({field(t, "name"), field(t, "current_version"), std::to_string(n),
                    field(t, "description")});
  }
  print_table(rows);
  return kExitOk;
}

int template_build(const Globals& g, const std::string& name) {
  const std::string base = "/v1/templates/" + client::url_encode(name);
  client::Client c(g.options());
  auto r = c.request("POST", base + "/build", "{}");
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  std::string id = field(*j, "build_id");
  std::cerr << "agentbox: build " << id << '\n';
  // The log as it is written; its last line says how the build ended.
  std::string pending;
  std::string state;
  std::string error;
  auto on_chunk = [&](std::string_view data) {
    pending.append(data);
    std::size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      json line = json::parse(pending.substr(0, nl), nullptr, false);
      pending.erase(0, nl + 1);
      if (!line.is_object()) continue;
      if (line.contains("line")) {
        std::cout << line["line"].get<std::string>() << '\n' << std::flush;
      } else if (line.value("type", "") == "end") {
        state = line.value("state", "");
        error = line.value("error", "");
        if (line.contains("snapshot")) std::cout << dump(line["snapshot"]) << '\n';
      }
    }
    return true;
  };
  auto lr = c.request_stream("GET", base + "/builds/" + id + "/log?follow=true", {}, on_chunk);
  if (!lr) return report(lr.error());
  if (!ok(*lr)) return report(*lr);
  if (state == "succeeded") return kExitOk;
  std::cerr << "agentbox: build " << id << " failed: " << error << '\n';
  return kExitError;
}

int template_rollback(const Globals& g, const std::string& name, std::uint64_t version) {
  client::Client c(g.options());
  json body = {{"version", version}};
  auto r = c.request("POST", "/v1/templates/" + client::url_encode(name) + "/rollback",
                     body.dump());
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  std::cout << name << " current version " << version << '\n';
  return kExitOk;
}

int template_rm(const Globals& g, const std::string& name) {
  client::Client c(g.options());
  auto r = c.request("DELETE", "/v1/templates/" + client::url_encode(name));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  return kExitOk;
}

}  // namespace agentbox::cli
