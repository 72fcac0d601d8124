// Templates on an image (API.md "Images": a template YAML's `image:` as its base). The build box's
// root is an overlay of the image's layers with an upper dir of the build's own
// (builds/<id>/root/{upper,work}), writable, and idmapped so that the build user acts for the
// image's root (linux/image_root.h ImageRootSpec::owner): `setup` may write /usr/local or /etc,
// and what it writes is stored as the image root's on-disk id. When the build succeeds that
// upper dir, without what the box itself put there (mountpoints, /etc identity files), becomes
// the snapshot's root layer (root_layers/<build_id>), stacked on the image's layers in the roots
// of the template's sessions. The snapshot records the image's digest: its sessions get that
// image whatever the reference names since.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "common/log.h"
#include "image/store.h"
#include "session/internal/template_build.h"
#include "session/session_images.h"
#include "session/template_manager.h"

namespace agentbox::session {
namespace {

namespace fs = std::filesystem;

// What the box's mount plan writes into its root at every start (linux/mounts.cc: the
// identity files replace the image's): never part of a root layer.
constexpr const char* kBoxFiles[] = {"etc/passwd",   "etc/group",         "etc/hosts",
                                     "etc/hostname", "etc/nsswitch.conf", "etc/mtab"};

}  // namespace

Status TemplateManager::check_image(const workspace::Template& t) const {
  if (t.image.empty()) return {};
  if (!config_.images) {
    return fail(Code::kNotSupported,
                "template: field 'image' (" + t.image + "): images are not enabled");
  }
  if (!config_.backend->supports_image_root()) {
    return fail(Code::kNotSupported, "template: field 'image' (" + t.image +
                                         ") is not supported on the " +
                                         std::string(config_.backend->name()) +
                                         " backend (an image root needs the ns backend)");
  }
  if (!image::is_digest(t.image)) {
    if (auto host = image::registry_host(t.image); !host) {
      return fail(Code::kInvalid, "template: field 'image': " + host.error().message);
    }
  }
  return {};
}

Status TemplateManager::image_build_root(const workspace::Template& t, const std::string& build_dir,
                                         uid_t owner, sandbox::BoxConfig* cfg, SnapshotInfo* si) {
  if (t.image.empty()) return {};
  AB_TRY(check_image(t));
  auto img = config_.images->get(t.image);
  if (!img && img.error().code == Code::kNotFound && !image::is_digest(t.image)) {
    img = config_.images->pull(t.image, {});
  }
  if (!img) return fail(img.error().code, "image " + t.image + ": " + img.error().message);
  si->image_ref = t.image;
  si->image_digest = img->digest;
  AB_TRY(image_root_config(*config_.images, *img, build_dir + "/root", "upper", "work",
                           /*writable=*/true, cfg));
  cfg->root_owner = owner;
  return {};
}

std::vector<std::string> TemplateManager::build_root_entries(const std::string& build_dir) {
  std::vector<std::string> out;
  const fs::path upper = build_dir + "/root/upper";
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(upper, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    out.push_back(it->path().lexically_relative(upper).string());
  }
  return out;
}

Result<std::string> TemplateManager::keep_build_root(const std::string& build_dir,
                                                     const std::vector<std::string>& box_made,
                                                     const std::string& build_id) {
  const std::string upper = build_dir + "/root/upper";
  struct stat st;
  if (::lstat(upper.c_str(), &st) != 0) return std::string();  // not on an image
  // What the box made when it started, deepest first: its identity files, and its empty
  // mountpoints (dirs, files for file binds) unless the build filled them; a dir copied up only
  // to hold them goes with them, so the image's shows through again.
  std::vector<std::string> made = box_made;
  std::sort(made.rbegin(), made.rend());
  for (const std::string& rel : made) {
    const std::string p = upper + "/" + rel;
    if (::lstat(p.c_str(), &st) != 0) continue;
    const bool identity =
        std::find(std::begin(kBoxFiles), std::end(kBoxFiles), rel) != std::end(kBoxFiles);
    if (S_ISDIR(st.st_mode)) {
      (void)::rmdir(p.c_str());  // ENOTEMPTY: the build put something there
    } else if (identity || (S_ISREG(st.st_mode) && st.st_size == 0)) {
      if (::unlink(p.c_str()) != 0) return fail_errno(errno, "unlink(" + p + ")");
    }
  }
  UniqueFd dir(::open(upper.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) return fail_errno(errno, "open(" + upper + ")");
  std::error_code ec;
  if (fs::is_empty(upper, ec) && !ec) return std::string();  // nothing changed outside /workspace
  if (::syncfs(dir.get()) != 0) return fail_errno(errno, "syncfs(" + upper + ")");
  fs::create_directories(root_layers_dir(), ec);
  if (ec) return fail(Code::kInternal, "mkdir " + root_layers_dir() + ": " + ec.message());
  ::chmod(root_layers_dir().c_str(), 0700);
  const std::string target = root_layers_dir() + "/" + build_id;
  if (::rename(upper.c_str(), target.c_str()) != 0) {
    return fail_errno(errno, "rename(" + upper + ", " + target + ")");
  }
  return build_id;
}

void TemplateManager::gc_root_layers(const std::set<std::string>& keep) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_layers_dir(), ec)) {
    const std::string name = e.path().filename().string();
    if (keep.count(name)) continue;
    // A running build's (named by its id), not recorded yet. Called with mu_ held.
    if (auto b = builds_.find(name);
        b != builds_.end() && b->second->info.state == BuildState::kRunning) {
      continue;
    }
    spdlog::info("templates: removing unused root layer {}", name);
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (rm) spdlog::warn("templates: removing root layer {}: {}", name, rm.message());
  }
}

std::string TemplateManager::root_layer(const std::string& ref, std::uint64_t version) {
  auto r = workspace::parse_template_ref(ref);
  if (!r) return {};
  std::lock_guard lk(mu_);
  auto it = templates_.find(r->name);
  if (it == templates_.end()) return {};
  for (const SnapshotInfo& s : it->second.snapshots) {
    if (s.version == version && !s.root_layer.empty()) {
      return root_layers_dir() + "/" + s.root_layer;
    }
  }
  return {};
}

std::string TemplateManager::image_user(const std::string& digest) {
  std::vector<std::pair<std::string, std::string>> refs;  // template -> its `image:`
  {
    std::lock_guard lk(mu_);
    for (const auto& [name, t] : templates_) {
      for (const SnapshotInfo& s : t.snapshots) {
        if (s.image_digest == digest) return name;
      }
      if (!t.tmpl.image.empty()) refs.emplace_back(name, t.tmpl.image);
    }
  }
  if (!config_.images) return {};
  for (const auto& [name, ref] : refs) {
    auto img = config_.images->get(ref);
    if (img && img->digest == digest) return name;
  }
  return {};
}

}  // namespace agentbox::session
