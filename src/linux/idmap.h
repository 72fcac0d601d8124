#pragma once
// Id mappings for idmapped mounts (mount_setattr(MOUNT_ATTR_IDMAP), Linux 5.12+): a host dir
// mounted rw into a box is seen, and written, by the session user as if it owned it, while on
// the host nothing is chowned and what the agent creates belongs to the dir's owner.
//
// A mount's idmapping is a user namespace that nothing ever runs in: its uid_map line
// "<on-disk id> <id seen through the mount> 1" turns files owned by the host dir's owner into the
// session user's, and the session user's writes back into the owner's. Ids the map does not name
// show as the overflow id (65534, "nobody") through the mount and cannot be written as.
//
// What happens without support is a clear error, never a silent read-only mount or a chown:
// a kernel before 5.12 has no mount_setattr (ENOSYS), and a filesystem without idmapped-mount
// support (FS_ALLOW_IDMAP: ext4, xfs, btrfs, f2fs, vfat, overlayfs 5.19+, tmpfs 6.3+ have it; NFS,
// FUSE and most network filesystems do not) refuses MOUNT_ATTR_IDMAP with EINVAL.

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/error.h"
#include "common/unique_fd.h"

namespace agentbox::linux {

struct IdMap {
  uid_t disk_uid = 0;  // the host dir's owner, as stored on disk
  gid_t disk_gid = 0;
  uid_t seen_uid = 0;  // the session user, as commands in the box are
  gid_t seen_gid = 0;
};

// A user namespace whose only mappings are disk_uid -> seen_uid and disk_gid -> seen_gid, as an
// O_RDONLY|O_CLOEXEC fd of /proc/<pid>/ns/user (what mount_attr.userns_fd takes). Made by a
// short-lived child (clone3 CLONE_NEWUSER) that waits on a pipe while the daemon writes its
// maps, then exits; the fd keeps the namespace alive. Needs CAP_SETUID/CAP_SETGID (root).
[[nodiscard]] Result<UniqueFd> make_idmap_userns(const IdMap& map);
// The same for `count` consecutive ids from each: disk_uid + i -> seen_uid + i (image layers,
// linux/image_root.h).
[[nodiscard]] Result<UniqueFd> make_idmap_userns(const IdMap& map, std::uint32_t count);
// The same with seen ids 0 and `owner` (0 < owner < count) swapped, for uids and gids alike:
// disk_uid + 0 -> seen_uid + owner and disk_uid + owner -> seen_uid + 0. A template build on an
// image (linux/image_root.h ImageRootSpec::owner): the build user acts for the image's root in
// file permissions, and what it writes is stored as the image root's on-disk id.
[[nodiscard]] Result<UniqueFd> make_idmap_userns(const IdMap& map, std::uint32_t count,
                                                 std::uint32_t owner);

// The type of the filesystem `fd` is on ("ext4", "tmpfs", "nfs", ... or "0x<magic>"), for
// messages about what a filesystem cannot do.
std::string filesystem_name(int fd);

}  // namespace agentbox::linux
