#include "session/session_images.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "image/layer.h"

namespace agentbox::session {
namespace {

namespace fs = std::filesystem;

// Ids mapped through an image root: the image's 0..65535 and every session uid (10000 + ...).
constexpr std::uint32_t kRootIdCount = 1u << 17;

Status make_dir(const std::string& path, uid_t owner, mode_t mode) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return fail(Code::kInternal, "mkdir " + path + ": " + ec.message());
  if (::chown(path.c_str(), owner, owner) != 0) return fail_errno(errno, "chown(" + path + ")");
  if (::chmod(path.c_str(), mode) != 0) return fail_errno(errno, "chmod(" + path + ")");
  return {};
}

}  // namespace

Status check_image_spec(const SessionSpec& spec, const sandbox::Backend& backend,
                        const std::string& backend_name) {
  if (spec.image_ref.empty()) {
    if (!spec.read_only_rootfs) {
      return fail(Code::kNotSupported,
                  "field 'read_only_rootfs': a writable root needs an image (the host's root "
                  "is always read-only)");
    }
    return {};
  }
  if (!backend.supports_image_root()) {
    return fail(Code::kNotSupported, "field 'image' (" + spec.image_ref +
                                         ") is not supported on the " + backend_name +
                                         " backend (an image root needs the ns backend)");
  }
  return {};
}

namespace {

// The backend `spec` will get: its own, the default runner's, the daemon's default.
std::string backend_of(const ManagerConfig& config, const SessionSpec& spec) {
  return !spec.backend.empty()            ? spec.backend
         : !config.default_runner.empty() ? std::string("remote")
                                          : config.default_backend;
}

}  // namespace

Status check_image_backend(const ManagerConfig& config, const SessionSpec& spec) {
  const std::string name = backend_of(config, spec);
  auto it = config.backends.find(name);
  if (it == config.backends.end()) return {};  // the create names the unknown backend
  return check_image_spec(spec, *it->second, name);
}

void default_image(const ManagerConfig& config, SessionSpec* spec) {
  if (config.default_image.empty() || !spec->image_ref.empty() || !spec->template_name.empty()) {
    return;
  }
  auto it = config.backends.find(backend_of(config, *spec));
  if (it != config.backends.end() && it->second->supports_image_root()) {
    spec->image_ref = config.default_image;
  }
}

Status template_image(TemplateManager* templates, SessionSpec* spec) {
  if (spec->template_name.empty() || templates == nullptr) return {};
  auto r = templates->resolve(spec->template_name);
  if (!r || r->image_digest.empty()) return {};
  if (!spec->image_ref.empty() && spec->image_ref != r->image_ref &&
      spec->image_ref != r->image_digest) {
    return fail(Code::kInvalid, "field 'image': template " + spec->template_name +
                                    " is built on image " + r->image_ref + " (" + r->image_digest +
                                    "), the root of its sessions");
  }
  spec->image_ref = r->image_ref;
  spec->image_digest = r->image_digest;
  return {};
}

Status resolve_image(image::ImageStore* images, SessionSpec* spec) {
  if (spec->image_ref.empty()) return {};
  if (images == nullptr) return fail(Code::kNotSupported, "field 'image': images are not enabled");
  if (!spec->image_digest.empty()) {
    if (auto img = images->get(spec->image_digest); !img) {
      return fail(Code::kNotFound, "field 'image': image " + spec->image_digest + " of template " +
                                       spec->template_name + " is no longer stored");
    }
    return {};
  }
  auto img = images->get(spec->image_ref);
  if (!img && img.error().code == Code::kNotFound && !image::is_digest(spec->image_ref)) {
    img = images->pull(spec->image_ref, {});
  }
  if (!img) {
    Error e = img.error();
    e.message = "field 'image': " + e.message;
    return std::unexpected(std::move(e));
  }
  spec->image_digest = img->digest;
  return {};
}

Status image_box_config(image::ImageStore* images, const std::string& data_dir,
                        const std::string& id, const SessionSpec& spec, sandbox::BoxConfig* cfg) {
  if (spec.image_digest.empty()) return {};
  if (images == nullptr) return fail(Code::kNotSupported, "field 'image': images are not enabled");
  auto img = images->get(spec.image_digest);
  if (!img) {
    return fail(Code::kNotFound,
                "session " + id + ": its image " + spec.image_digest + " is no longer stored");
  }
  const std::string dir = data_dir + "/rootfs/" + id;
  const std::string upper = spec.read_only_rootfs ? "ro-upper" : "upper";
  const std::string work = spec.read_only_rootfs ? "ro-work" : "work";
  if (spec.read_only_rootfs) {
    // Only mountpoints and /etc identity files: made afresh at every start.
    std::error_code ec;
    fs::remove_all(dir + "/" + upper, ec);
    fs::remove_all(dir + "/" + work, ec);
  }
  return image_root_config(*images, *img, dir, upper, work, !spec.read_only_rootfs, cfg);
}

Status image_root_config(image::ImageStore& images, const image::Image& img, const std::string& dir,
                         const std::string& upper, const std::string& work, bool writable,
                         sandbox::BoxConfig* cfg) {
  // The box's root dir and everything of it: root's in the box (disk_base + 0), so the daemon
  // (host root, seen through the idmap as the box's root) keeps its DAC override there.
  const uid_t box_root = image::kLayerIdBase;
  AB_TRY(make_dir(dir, box_root, 0700));
  struct stat st;
  if (::stat((dir + "/" + upper).c_str(), &st) != 0) {
    AB_TRY(make_dir(dir + "/" + upper, box_root, 0755));
  }
  if (::stat((dir + "/" + work).c_str(), &st) != 0) {
    AB_TRY(make_dir(dir + "/" + work, box_root, 0700));
  }
  // A template's root layer (its build's changes outside /workspace) stays on top of the
  // image's: keep what the caller put there.
  std::vector<std::string> layers = images.layer_dirs(img);
  layers.insert(layers.end(), cfg->root_layers.begin(), cfg->root_layers.end());
  cfg->root_layers = std::move(layers);
  cfg->root_dir = dir;
  cfg->root_upper = upper;
  cfg->root_work = work;
  cfg->root_id_base = image::kLayerIdBase;
  cfg->root_id_count = kRootIdCount;
  cfg->root_writable = writable;
  // The image's Env under the template's and the session's.
  for (const std::string& kv : img.config.env) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    cfg->env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return {};
}

void remove_image_root(const std::string& data_dir, const std::string& id) {
  std::error_code ec;
  fs::remove_all(data_dir + "/rootfs/" + id, ec);
}

}  // namespace agentbox::session
