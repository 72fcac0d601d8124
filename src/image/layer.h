#pragma once
// One OCI layer blob (a tar, gzip- or zstd-compressed or not) unpacked into a directory that an
// overlayfs stacks as a lower layer (API.md "Images"; image/store.h keeps them).
//
// SECURITY: a layer is hostile input from a registry. unpack_layer()
//  - never builds a host path from an entry name: each parent is resolved one component at a time
//    with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV) from the layer dir,
//    and the final name is made with *at() calls that do not follow it;
//  - refuses absolute names, ".." components, entries through a symlink of the same layer (the
//    classic "d -> /etc" then "d/passwd"), hard links to a name outside the layer or not yet in
//    it, device nodes, sockets, and a whiteout of "/" (".wh." of "", "." or "..", or an opaque
//    marker on the layer's root) — each a Code::kImage error naming the entry;
//  - stores files owned by kLayerIdBase + the tar's uid/gid (uids over 65535 are refused), never
//    by host root: a setuid-root binary of an image is not one on the host. The ns backend maps
//    the ids back through an idmapped mount (0..65535 in the box);
//  - keeps no extended attribute (no file capabilities), and symlink targets as given (they are
//    resolved inside the box, never by the daemon).
// OCI whiteouts become overlayfs ones: ".wh.NAME" a 0/0 character device NAME, ".wh..wh..opq" the
// xattr trusted.overlay.opaque=y on its directory.
//
// Blocking; any thread.

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/error.h"

namespace agentbox::image {

// Files of a layer are stored owned by kLayerIdBase + their id in the image.
inline constexpr std::uint32_t kLayerIdBase = 1u << 30;
inline constexpr std::uint32_t kLayerIdCount = 65536;

struct LayerStats {
  std::uint64_t entries = 0;
  std::uint64_t bytes = 0;  // file content bytes
};

// The sha256 of the decompressed stream of `blob_fd` ("sha256:<hex>"), which a config's diff_ids
// name. kImage when the blob is not a (compressed) stream libarchive reads.
[[nodiscard]] Result<std::string> layer_diff_id(int blob_fd, const std::string& shown);

// Unpacks the tar of `blob_fd` into the empty directory `into_fd`. `shown` names the blob in
// errors. A failed unpack may leave a partial tree: the caller made `into_fd` for this and removes
// it.
[[nodiscard]] Result<LayerStats> unpack_layer(int blob_fd, int into_fd, const std::string& shown);

}  // namespace agentbox::image
