// agentbox's extensions of the runner protocol that are not xbot's frames (protocol.h): the
// limits a request carries to a runner that enforces them, and seed 003's flat frame form.

#include "runner/protocol.h"

namespace agentbox::runner::proto {

void add_box_limits(Json& body, const BoxLimits& b) {
  if (!b.box.empty()) body["box"] = b.box;
  if (b.limits.empty()) return;
  Json l = Json::object();
  for (const auto& [name, value] : b.limits) l[name] = value;
  body["limits"] = std::move(l);
}

namespace {

bool box_name_ok(std::string_view s) {
  if (s.empty() || s.size() > 128 || s == "." || s == "..") return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

Status from_json(const std::optional<Json>& body, BoxLimits& out) {
  out = {};
  if (!body || !body->is_object()) return {};
  if (auto it = body->find("box"); it != body->end() && !it->is_null()) {
    if (!it->is_string() || !box_name_ok(it->get<std::string>())) {
      return fail(Code::kInvalid, "body field 'box' must be a name of [A-Za-z0-9._-]{1,128}");
    }
    out.box = it->get<std::string>();
  }
  auto it = body->find("limits");
  if (it == body->end() || it->is_null()) return {};
  if (!it->is_object()) return fail(Code::kInvalid, "body field 'limits' must be an object");
  for (const auto& [name, v] : it->items()) {
    if (!v.is_number_unsigned() || v.get<std::uint64_t>() == 0) {
      return fail(Code::kInvalid, "body field 'limits." + name + "' must be a positive integer");
    }
    out.limits[name] = v.get<std::uint64_t>();
  }
  return {};
}

Result<Envelope> decode_flat_or_envelope(std::string_view text) {
  auto e = AB_TRY(decode(text));
  if (e.body) return e;
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  Json body = Json::object();
  for (auto& [key, value] : j.items()) {
    if (key == "id" || key == "type") continue;
    body[key] = std::move(value);
  }
  // Only user_id (or nothing) beside id and type: an envelope without a body.
  if (body.empty() || (body.size() == 1 && body.contains("user_id"))) return e;
  e.body = std::move(body);
  return e;
}

}  // namespace agentbox::runner::proto
