#include "session/internal/template_state.h"

#include <nlohmann/json.hpp>

#include "session/store.h"

namespace agentbox::session {
namespace {

using json = nlohmann::json;

json encode(const TemplateInfo& t) {
  json snaps = json::array();
  for (const SnapshotInfo& s : t.snapshots) {
    json health = json::array();
    for (const auto& h : s.health) {
      health.push_back({{"name", h.name}, {"command", h.command}, {"repair", h.repair}});
    }
    snaps.push_back({{"id", s.id},
                     {"version", s.version},
                     {"created_ms", to_unix_ms(s.created_at)},
                     {"bytes", s.bytes},
                     {"files", s.files},
                     {"build_id", s.build_id},
                     {"health", std::move(health)}});
    snaps.back()["env"] = s.env;
    snaps.back()["image_ref"] = s.image_ref;  // `image:` (session/template_images.cc)
    snaps.back()["image_digest"] = s.image_digest;
    snaps.back()["root_layer"] = s.root_layer;
  }
  return {{"yaml", t.tmpl.source},
          {"created_ms", to_unix_ms(t.created_at)},
          {"updated_ms", to_unix_ms(t.updated_at)},
          {"current", t.current},
          {"snapshots", std::move(snaps)}};
}

Result<TemplateInfo> decode(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return fail(Code::kInternal, "not a JSON object");
  TemplateInfo t;
  try {
    auto parsed = workspace::parse_template(j.at("yaml").get<std::string>());
    if (!parsed) return std::unexpected(parsed.error());
    t.tmpl = std::move(parsed->tmpl);
    t.warnings = std::move(parsed->warnings);
    t.created_at = from_unix_ms(j.at("created_ms").get<std::int64_t>());
    t.updated_at = from_unix_ms(j.at("updated_ms").get<std::int64_t>());
    t.current = j.at("current").get<std::uint64_t>();
    for (const json& s : j.at("snapshots")) {
      SnapshotInfo si;
      si.id = s.at("id").get<std::string>();
      si.version = s.at("version").get<std::uint64_t>();
      si.created_at = from_unix_ms(s.at("created_ms").get<std::int64_t>());
      si.bytes = s.at("bytes").get<std::uint64_t>();
      si.files = s.at("files").get<std::uint64_t>();
      si.build_id = s.value("build_id", "");
      if (s.contains("health")) {
        for (const json& h : s.at("health")) {
          si.health.push_back({h.at("name").get<std::string>(), h.at("command").get<std::string>(),
                               h.at("repair").get<std::string>()});
        }
      } else {
        si.health = t.tmpl.health;  // recorded before snapshots kept their own
      }
      si.env =
          s.contains("env") ? s.at("env").get<std::map<std::string, std::string>>() : t.tmpl.env;
      si.image_ref = s.value("image_ref", "");
      si.image_digest = s.value("image_digest", "");
      si.root_layer = s.value("root_layer", "");
      t.snapshots.push_back(std::move(si));
    }
  } catch (const std::exception& e) {
    return fail(Code::kInternal, std::string("malformed: ") + e.what());
  }
  return t;
}

}  // namespace

std::string encode_template_state(const TemplateInfo& t) {
  return encode(t).dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<TemplateInfo> decode_template_state(const std::string& text) {
  return decode(text);
}

}  // namespace agentbox::session
