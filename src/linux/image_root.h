#pragma once
// A box root made of an OCI image (API.md "Images"; image/store.h keeps the layers): an overlayfs
// whose lower layers are the image's unpacked layer dirs and whose upper and work dirs belong to
// the box (an ephemeral pair for a read-only root, the session's own for a writable one), made
// in the daemon as a detached mount that the box's first process attaches as its root
// (linux/box.h BoxSpec::root_tree) before the mount plan runs on it.
//
// Every layer (and the parent of the upper and work dirs) is an idmapped, detached clone
// (open_tree + MOUNT_ATTR_IDMAP): ids disk_base + i on disk are i in the box for i < count, so the
// image's root-owned files are uid 0 in the box while on disk they belong to an unused id range,
// never to host root; what the box writes (the mount plan's files as root, the session user's
// files, copy-ups of the image's) is stored as disk_base + its id. The layers are handed to
// overlayfs by fd ("lowerdir+", "upperdir", "workdir" with FSCONFIG_SET_FD; Linux 6.13+), so no
// mount of them exists anywhere else.
//
// SECURITY: the overlay is nosuid,nodev (the box makes "/" read-only too unless the root is
// writable), with metacopy and redirect_dir off; index off, so a resumed box may mount the same
// upper dir while its old box's mount namespace is still going away.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"

namespace agentbox::linux {

struct ImageRootSpec {
  std::vector<std::string> layers;  // host dirs, lowest first; at least one
  std::string parent;               // owned by disk_base; holds upper and work
  std::string upper;                // a dir in parent (a name), owned by disk_base
  std::string work;                 // a dir in parent (a name), owned by disk_base
  std::uint32_t disk_base = 0;      // on-disk id of id 0 in the box
  std::uint32_t count = 0;          // ids mapped
  // Non-zero: box ids 0 and `owner` swapped in the mapping (linux/idmap.h): a template build on
  // an image runs as this user, who then acts for the image's root in file permissions (writes
  // /usr/local, /etc), and what it writes is stored as the image root's, never as host ids.
  std::uint32_t owner = 0;
};

// The detached overlay mount (an fd for move_mount). Errors name the step and the layer.
[[nodiscard]] Result<UniqueFd> make_image_root(const ImageRootSpec& spec);

}  // namespace agentbox::linux
