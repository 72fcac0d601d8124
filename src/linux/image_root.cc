#include "linux/image_root.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <vector>

#include "linux/idmap.h"

namespace agentbox::linux {
namespace {

// A detached, idmapped clone of `dir`.
Result<UniqueFd> idmapped_clone(const std::string& dir, int userns, bool read_only) {
  UniqueFd src(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!src) return fail_errno(errno, "image root: open(" + dir + ")");
  UniqueFd tree(::open_tree(src.get(), "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH));
  if (!tree) return fail_errno(errno, "image root: open_tree(" + dir + ")");
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  if (read_only) attr.attr_set |= MOUNT_ATTR_RDONLY;
  attr.userns_fd = static_cast<std::uint64_t>(userns);
  if (::mount_setattr(tree.get(), "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) {
    return fail_errno(
        errno, "image root: mount_setattr(" + dir + ", idmap) on " + filesystem_name(src.get()));
  }
  return tree;
}

Status set_fd(int fs, const char* key, int fd, const std::string& dir) {
  if (::fsconfig(fs, FSCONFIG_SET_FD, key, nullptr, fd) != 0) {
    return fail_errno(errno, std::string("image root: fsconfig(") + key + " " + dir +
                                 " by fd; overlayfs needs Linux 6.13+)");
  }
  return {};
}

}  // namespace

Result<UniqueFd> make_image_root(const ImageRootSpec& spec) {
  if (spec.layers.empty()) return fail(Code::kInvalid, "image root: no layers");
  auto userns = AB_TRY(
      make_idmap_userns(IdMap{spec.disk_base, spec.disk_base, 0, 0}, spec.count, spec.owner));
  UniqueFd fs(::fsopen("overlay", FSOPEN_CLOEXEC));
  if (!fs) return fail_errno(errno, "image root: fsopen(overlay)");
  // lowerdir+ goes top first: the image's last layer is the first lower. Each clone's fd stays
  // open until the overlay is made: overlayfs only takes the path, and closing the fd of a
  // detached mount dissolves it (its private clone at create would then fail with EINVAL,
  // "failed to clone lowerpath").
  std::vector<UniqueFd> lowers;
  lowers.reserve(spec.layers.size());
  for (auto it = spec.layers.rbegin(); it != spec.layers.rend(); ++it) {
    lowers.push_back(AB_TRY(idmapped_clone(*it, userns.get(), true)));
    AB_TRY(set_fd(fs.get(), "lowerdir+", lowers.back().get(), *it));
  }
  // The upper and work dirs through one idmapped clone of their parent (overlayfs wants them on
  // one mount): what the box writes is stored as disk_base + its id, never as a host id.
  auto parent = AB_TRY(idmapped_clone(spec.parent, userns.get(), false));
  for (auto [key, name] : {std::pair{"upperdir", &spec.upper}, std::pair{"workdir", &spec.work}}) {
    UniqueFd dir(
        ::openat(parent.get(), name->c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir) return fail_errno(errno, "image root: open(" + spec.parent + "/" + *name + ")");
    AB_TRY(set_fd(fs.get(), key, dir.get(), spec.parent + "/" + *name));
  }
  for (const char* off : {"metacopy", "redirect_dir", "index"}) {
    const char* v = "off";
    if (::fsconfig(fs.get(), FSCONFIG_SET_STRING, off, v, 0) != 0) {
      return fail_errno(errno, std::string("image root: fsconfig(") + off + "=off)");
    }
  }
  if (::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
    return fail_errno(errno,
                      "image root: create overlay (upper " + spec.parent + "/" + spec.upper + ")");
  }
  UniqueFd mnt(::fsmount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  if (!mnt) return fail_errno(errno, "image root: fsmount");
  return mnt;
}

}  // namespace agentbox::linux
