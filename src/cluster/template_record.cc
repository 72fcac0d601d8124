#include "cluster/template_record.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace agentbox::cluster {
namespace {

using json = nlohmann::json;

// A version's key in "versions" ("3"), 0 when it is not one.
std::uint64_t version_key(const std::string& k) {
  std::uint64_t v = 0;
  if (k.empty() || k.size() > 18) return 0;
  for (char c : k) {
    if (c < '0' || c > '9') return 0;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}

std::uint64_t u64(const json& j, const char* f) {
  auto it = j.find(f);
  return it != j.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
}

std::string str(const json& j, const char* f) {
  auto it = j.find(f);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::uint64_t TemplateRecord::highest() const {
  std::uint64_t v = last_version;
  if (!versions.empty()) v = std::max(v, versions.rbegin()->first);
  return v;
}

const TemplateVersion* TemplateRecord::built(std::uint64_t v) const {
  auto it = versions.find(v);
  return it != versions.end() && it->second.built ? &it->second : nullptr;
}

TemplateRecord parse_template_record(const std::string& raw) {
  TemplateRecord r;
  if (raw.empty()) return r;
  json j = json::parse(raw, nullptr, false);
  if (!j.is_object()) return r;
  r.stored = true;
  r.deleted = j.value("deleted", false);
  r.yaml = str(j, "yaml");
  r.current = u64(j, "current");
  r.last_version = u64(j, "last_version");
  auto vs = j.find("versions");
  if (vs == j.end() || !vs->is_object()) return r;
  for (const auto& [k, x] : vs->items()) {
    const std::uint64_t v = version_key(k);
    if (v == 0 || !x.is_object()) continue;
    TemplateVersion tv;
    tv.built = str(x, "state") == "built";
    tv.node = str(x, "node");
    tv.build_id = str(x, "build_id");
    tv.yaml = str(x, "yaml");
    tv.snapshot = str(x, "snapshot");
    tv.bytes = u64(x, "bytes");
    tv.files = u64(x, "files");
    auto c = x.find("created_ms");
    if (c != x.end() && c->is_number_integer()) tv.created_ms = c->get<std::int64_t>();
    r.versions[v] = std::move(tv);
  }
  return r;
}

std::string encode_template_record(const TemplateRecord& r) {
  json vs = json::object();
  for (const auto& [v, x] : r.versions) {
    json o = {{"state", x.built ? "built" : "building"},
              {"node", x.node},
              {"build_id", x.build_id},
              {"yaml", x.yaml}};
    if (x.built) {
      o["snapshot"] = x.snapshot;
      o["bytes"] = x.bytes;
      o["files"] = x.files;
      o["created_ms"] = x.created_ms;
    }
    vs[std::to_string(v)] = std::move(o);
  }
  json j = {{"last_version", r.highest()}, {"versions", std::move(vs)}};
  if (r.deleted) {
    j["deleted"] = true;
  } else {
    j["yaml"] = r.yaml;
    j["current"] = r.current;
  }
  return j.dump();
}

std::string parse_build_node(const std::string& raw) {
  json j = json::parse(raw, nullptr, false);
  return j.is_object() ? str(j, "node") : std::string();
}

std::string encode_build_record(const std::string& node, const std::string& template_name) {
  return json{{"node", node}, {"template", template_name}}.dump();
}

}  // namespace agentbox::cluster
