#pragma once
// skopeo as the image store's fetcher (image/store.h): one `skopeo copy` of a reference into an
// OCI layout dir, with the registry's settings from the config.

#include <string>

#include "common/error.h"
#include "image/store.h"

namespace agentbox::image::detail {

// Copies `ref` from its registry into the OCI layout `oci_dir` (made by skopeo). `work_dir` is a
// private scratch dir (the CA dir skopeo wants goes there). Errors: kImage for a blob whose
// digest does not match (naming it), kUpstream for anything the registry did or did not do,
// kUnavailable when skopeo is missing.
Status skopeo_copy(const StoreConfig& cfg, const std::string& host, const std::string& ref,
                   const std::string& oci_dir, const std::string& work_dir);

}  // namespace agentbox::image::detail
