#include "linux/overlay.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mount.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "common/unique_fd.h"

namespace agentbox::linux {
namespace {

Status set_string(int fs, const char* key, const std::string& value, const std::string& what) {
  if (::fsconfig(fs, FSCONFIG_SET_STRING, key, value.c_str(), 0) != 0) {
    return fail_errno(errno, "overlay " + what + ": fsconfig(" + key + "=" + value + ")");
  }
  return {};
}

}  // namespace

Status mount_overlay(const OverlaySpec& spec) {
  const std::string what = spec.target;
  UniqueFd src(::open(spec.lower.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!src) return fail_errno(errno, "overlay " + what + ": open(" + spec.lower + ")");
  UniqueFd lower(::open_tree(src.get(), "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH));
  if (!lower) return fail_errno(errno, "overlay " + what + ": open_tree(" + spec.lower + ")");
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  UniqueFd userns;
  if (spec.lower_idmap) {
    auto ns = make_idmap_userns(*spec.lower_idmap);
    if (!ns) return std::unexpected(ns.error());
    userns = std::move(*ns);
    attr.attr_set |= MOUNT_ATTR_IDMAP;
    attr.userns_fd = static_cast<std::uint64_t>(userns.get());
  }
  if (::mount_setattr(lower.get(), "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) {
    return fail_errno(errno, "overlay " + what + ": mount_setattr(" + spec.lower +
                                 ", ro,idmap) on " + filesystem_name(src.get()));
  }

  UniqueFd fs(::fsopen("overlay", FSOPEN_CLOEXEC));
  if (!fs) return fail_errno(errno, "overlay " + what + ": fsopen(overlay)");
  if (::fsconfig(fs.get(), FSCONFIG_SET_FD, "lowerdir+", nullptr, lower.get()) != 0) {
    return fail_errno(errno, "overlay " + what +
                                 ": fsconfig(lowerdir+ by fd; overlayfs needs Linux 6.13+)");
  }
  AB_TRY(set_string(fs.get(), "upperdir", spec.upper, what));
  AB_TRY(set_string(fs.get(), "workdir", spec.work, what));
  // SECURITY: no metacopy or redirects: an upper entry is always the whole file it names.
  AB_TRY(set_string(fs.get(), "metacopy", "off", what));
  AB_TRY(set_string(fs.get(), "redirect_dir", "off", what));
  if (::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
    return fail_errno(errno, "overlay " + what + ": create (lower " + spec.lower + ", upper " +
                                 spec.upper + ")");
  }
  UniqueFd mnt(::fsmount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  if (!mnt) return fail_errno(errno, "overlay " + what + ": fsmount");
  if (::move_mount(mnt.get(), "", AT_FDCWD, spec.target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0) {
    return fail_errno(errno, "overlay: move_mount onto " + spec.target);
  }
  return {};
}

bool is_overlay(const std::string& path) {
  struct statfs sf {};
  if (::statfs(path.c_str(), &sf) != 0) return false;
  return static_cast<std::uint64_t>(sf.f_type) == OVERLAYFS_SUPER_MAGIC;
}

Status unmount_overlay(const std::string& path) {
  // Stacked mounts (a crash between two starts) come off one by one.
  for (int i = 0; i < 16 && is_overlay(path); ++i) {
    if (::umount2(path.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0) {
      return fail_errno(errno, "umount(" + path + ")");
    }
  }
  return {};
}

}  // namespace agentbox::linux
