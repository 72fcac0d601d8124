// The config's `registries:` (API.md "Images"): per registry host, how the image store
// authenticates (basic auth from a password file, or a bearer token from a token file), which CA
// verifies its TLS, and whether it is plain HTTP (`insecure`, for loopback registries); and
// `image_aliases:`, short names for image references (E2B's templateID); `default_image:`, or
// seed 003's docker mode (xbot's SANDBOX_MODE=docker, SANDBOX_DOCKER_IMAGE=REF).

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>

#include "server/config.h"

namespace agentbox::server::detail {

Status load_registries(const void* yaml_node, const std::string& file, DaemonConfig* c) {
  const YAML::Node& rg = *static_cast<const YAML::Node*>(yaml_node);
  const std::string where = "config " + file + ": registries";
  if (!rg.IsMap()) {
    return fail(Code::kInvalid, where +
                                    " must be a mapping host: {username, password_file, "
                                    "token_file, ca_file, insecure}");
  }
  c->registries.clear();
  for (const auto& kv : rg) {
    const std::string host = kv.first.as<std::string>();
    const std::string at = where + "." + host;
    if (host.empty() || host.find('/') != std::string::npos) {
      return fail(Code::kInvalid, at + ": a registry is named by its host[:port]");
    }
    image::RegistryAuth r;
    const YAML::Node& v = kv.second;
    if (!v.IsMap() && !v.IsNull()) return fail(Code::kInvalid, at + " must be a mapping");
    if (v.IsMap()) {
      for (const auto& f : v) {
        const std::string key = f.first.as<std::string>();
        std::string* field = key == "username"        ? &r.username
                             : key == "password_file" ? &r.password_file
                             : key == "token_file"    ? &r.token_file
                             : key == "ca_file"       ? &r.ca_file
                                                      : nullptr;
        if (key == "insecure") {
          r.insecure = f.second.as<bool>();
        } else if (field != nullptr) {
          *field = f.second.as<std::string>();
        } else {
          return fail(Code::kInvalid, at + ": unknown key '" + key + "'");
        }
      }
    }
    if (!r.password_file.empty() && !r.token_file.empty()) {
      return fail(Code::kInvalid, at + ": give password_file or token_file, not both");
    }
    if (!r.password_file.empty() && r.username.empty()) {
      return fail(Code::kInvalid, at + ": password_file needs username");
    }
    for (const std::string* p : {&r.password_file, &r.token_file, &r.ca_file}) {
      if (p->empty()) continue;
      if (p->front() != '/') return fail(Code::kInvalid, at + ": " + *p + " must be absolute");
      std::error_code ec;
      if (!std::filesystem::is_regular_file(*p, ec)) {
        return fail(Code::kInvalid, at + ": " + *p + " is not a readable file");
      }
    }
    c->registries[host] = std::move(r);
  }
  return {};
}

Status load_image_aliases(const void* yaml_node, const std::string& file, DaemonConfig* c) {
  const YAML::Node& al = *static_cast<const YAML::Node*>(yaml_node);
  const std::string where = "config " + file + ": image_aliases";
  if (!al.IsMap()) return fail(Code::kInvalid, where + " must be a mapping name: image reference");
  c->image_aliases.clear();
  for (const auto& kv : al) {
    const std::string name = kv.first.as<std::string>();
    if (!kv.second.IsScalar()) {
      return fail(Code::kInvalid, where + "." + name + " must be an image reference");
    }
    const std::string ref = kv.second.as<std::string>();
    if (name.empty() || !image::registry_host(ref)) {
      return fail(Code::kInvalid, where + "." + name + ": '" + ref + "' is not an image reference");
    }
    c->image_aliases[name] = ref;
  }
  return {};
}

Status load_default_image(const void* yaml_node, const std::string& file, DaemonConfig* c) {
  if (yaml_node != nullptr) {
    const YAML::Node& di = *static_cast<const YAML::Node*>(yaml_node);
    const std::string where = "config " + file + ": default_image";
    if (!di.IsScalar()) return fail(Code::kInvalid, where + " must be an image reference");
    c->default_image = di.as<std::string>();
    if (!image::registry_host(c->default_image)) {
      return fail(Code::kInvalid, where + ": '" + c->default_image + "' is not an image reference");
    }
    return {};
  }
  // Seed 003: xbot's server in docker mode runs every user's sandbox in a container of
  // SANDBOX_DOCKER_IMAGE; here each session gets that image as its root. The YAML wins.
  const char* mode = std::getenv("SANDBOX_MODE");
  if (!c->default_image.empty() || mode == nullptr || std::string(mode) != "docker") return {};
  const char* ref = std::getenv("SANDBOX_DOCKER_IMAGE");
  if (ref == nullptr || *ref == '\0') {
    return fail(Code::kInvalid,
                "SANDBOX_MODE=docker (seed 003's docker mode) needs SANDBOX_DOCKER_IMAGE, the "
                "image of the sessions (no default image is assumed)");
  }
  if (!image::registry_host(ref)) {
    return fail(Code::kInvalid,
                "SANDBOX_DOCKER_IMAGE '" + std::string(ref) + "' is not an image reference");
  }
  c->default_image = ref;
  return {};
}

}  // namespace agentbox::server::detail
