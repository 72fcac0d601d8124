// agentbox session limits and agentbox network: live changes to a session (API.md "Live changes
// to a session", "Network").

#include <iostream>
#include <nlohmann/json.hpp>
#include <variant>

#include "cli/cli.h"

namespace agentbox::cli {
namespace {

using json = nlohmann::json;

// Sends `body`; the session object of a 2xx reply, or the exit code of what went wrong.
std::variant<json, int> send(const Globals& g, const std::string& method, const std::string& path,
                             const json& body) {
  client::Client c(g.options());
  auto r = c.request(method, path, body.dump(-1, ' ', false, json::error_handler_t::replace));
  if (!r) return report(r.error());
  if (r->status < 200 || r->status >= 300) return report(*r);
  json j = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return report(Error::make(Code::kInternal, "server reply is not a JSON object (HTTP " +
                                                   std::to_string(r->status) + ")"));
  }
  return j;
}

std::string dump(const json& j) {
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}

}  // namespace

int session_limits(const Globals& g, const SessionLimitsArgs& a) {
  json limits = json::object();
  if (a.memory_mb) limits["memory_mb"] = *a.memory_mb;
  if (a.cpu_percent) limits["cpu_percent"] = *a.cpu_percent;
  if (a.max_pids) limits["max_pids"] = *a.max_pids;
  if (a.cpu_time_sec) limits["cpu_time_sec"] = *a.cpu_time_sec;
  if (a.tmp_mb) limits["tmp_mb"] = *a.tmp_mb;
  if (a.max_open_files) limits["max_open_files"] = *a.max_open_files;
  if (a.disk_mb) limits["disk_mb"] = *a.disk_mb;
  if (limits.empty()) return usage("session limits: give at least one limit, e.g. --memory-mb");
  auto r = send(g, "PATCH", session_target(a.id), {{"limits", limits}});
  if (auto* code = std::get_if<int>(&r)) return *code;
  const json& s = std::get<json>(r);
  if (a.json) {
    std::cout << dump(s) << '\n';
    return kExitOk;
  }
  std::cout << a.id << ':';
  if (auto it = s.find("limits"); it != s.end() && it->is_object()) {
    for (const auto& [k, v] : it->items()) std::cout << ' ' << k << '=' << v.dump();
  }
  std::cout << '\n';
  return kExitOk;
}

int network(const Globals& g, const NetworkArgs& a) {
  json body = {{"mode", a.mode}};
  if (!a.allow.empty()) body["allow"] = a.allow;
  auto r = send(g, "POST", session_target(a.id) + "/network", body);
  if (auto* code = std::get_if<int>(&r)) return *code;
  const json& s = std::get<json>(r);
  if (a.json) {
    std::cout << dump(s) << '\n';
    return kExitOk;
  }
  std::string mode = "-";
  std::string allow;
  if (auto it = s.find("network"); it != s.end() && it->is_object()) {
    mode = it->value("mode", "-");
    if (auto al = it->find("allow"); al != it->end() && al->is_array()) {
      for (const auto& d : *al) {
        if (d.is_string()) allow += (allow.empty() ? "" : ",") + d.get<std::string>();
      }
    }
  }
  std::cout << a.id << ": network " << mode << (allow.empty() ? "" : " " + allow) << '\n';
  return kExitOk;
}

}  // namespace agentbox::cli
