// `agentbox image pull|ls|inspect|rm` (API.md "Images").

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/cli.h"

namespace agentbox::cli {
namespace {

using json = nlohmann::json;

bool ok(const client::Response& r) {
  return r.status >= 200 && r.status < 300;
}

std::optional<json> parse_reply(const client::Response& r) {
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded()) {
    report(Error::make(Code::kInternal,
                       "server reply is not JSON (HTTP " + std::to_string(r.status) + ")"));
    return std::nullopt;
  }
  return j;
}

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "-";
  if (it->is_string()) return it->get<std::string>();
  return it->dump();
}

}  // namespace

int image_pull(const Globals& g, const std::string& ref) {
  client::Client c(g.options());
  auto r = c.request("POST", "/v1/images", json{{"ref", ref}}.dump());
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  std::cout << text(*j, "ref") << ' ' << text(*j, "digest") << '\n';
  return kExitOk;
}

int image_ls(const Globals& g, bool as_json) {
  client::Client c(g.options());
  auto r = c.request("GET", "/v1/images");
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  if (as_json) {
    std::cout << j->dump(2) << '\n';
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows{{"REF", "DIGEST", "SIZE", "LAYERS", "PULLED"}};
  auto list = j->find("images");
  if (list == j->end() || !list->is_array()) {
    return report(Error::make(Code::kInternal, "server reply has no \"images\" array"));
  }
  for (const json& i : *list) {
    if (!i.is_object()) continue;
    auto layers = i.find("layers");
    rows.push_back({text(i, "ref"), text(i, "digest").substr(0, 19),
                    human_bytes(i.value("size", std::uint64_t{0})),
                    std::to_string(layers != i.end() && layers->is_array() ? layers->size() : 0),
                    text(i, "pulled_at")});
  }
  print_table(rows);
  return kExitOk;
}

int image_inspect(const Globals& g, const std::string& ref) {
  client::Client c(g.options());
  auto r = c.request("GET", "/v1/images/" + client::url_encode(ref));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  std::cout << j->dump(2) << '\n';
  return kExitOk;
}

int image_rm(const Globals& g, const std::string& digest) {
  client::Client c(g.options());
  auto r = c.request("DELETE", "/v1/images/" + client::url_encode(digest));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  return kExitOk;
}

}  // namespace agentbox::cli
