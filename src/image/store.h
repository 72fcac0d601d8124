#pragma once
// The image store (API.md "Images"): OCI / Docker v2 images pulled by reference into
// `<data_dir>/images`, for the ns backend to stack as a box's root.
//
//   <dir>/layers/<hex of diff id>/   one unpacked layer (image/layer.h), read-only, shared by every
//                                    image that has it; made in tmp/ and renamed in whole
//   <dir>/images/<hex of digest>.json  one image's record (below), written to a temp name and
//                                    renamed: an image exists exactly when its record does
//   <dir>/tmp/                       pulls in progress; emptied when the store opens
//
// Records are one JSON file per image rather than rows of the session store: the layer dirs are
// the store's truth on disk and live beside them, an image is complete exactly when its record
// is renamed in (no transaction across SQLite and the file system), and the store stays below
// session/ with no schema of its own to migrate.
//
// Fetching is Debian's skopeo (`skopeo copy docker://REF oci:DIR`, which picks the host's
// platform from a multi-arch index), with the credentials, CA and plain-HTTP setting of the
// config's `registries:` entry for the reference's host. Every blob is then verified here
// (sha256 of manifest, config and each layer; each layer's decompressed stream against the
// config's diff_ids) before anything is kept; a layer the store has unpacked already (known by its
// blob digest from its images' records) is not fetched again (a sparse stand-in of the blob in
// the layout is what skopeo finds and reuses). A failed pull leaves nothing: its temp dir and the
// layers it added are removed.
//
// Thread-safe: pulls, removals and GC take one mutex (a pull holds it throughout); reads take
// the record mutex only.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"

namespace agentbox::image {

// The config's `registries: {host: {...}}` entry for one registry host ("127.0.0.1:5000").
struct RegistryAuth {
  std::string username;
  std::string password_file;  // with username: basic auth
  std::string token_file;     // a bearer token
  std::string ca_file;        // PEM; the registry's TLS is verified against it
  bool insecure = false;      // plain HTTP (or unverified TLS): loopback registries in tests
};

struct StoreConfig {
  std::string dir;  // <data_dir>/images
  std::map<std::string, RegistryAuth> registries;
  // The config's `image_aliases: {name: ref}`: short names a dialect may give for an image (E2B's
  // templateID when no template has that name).
  std::map<std::string, std::string> aliases;
  std::string skopeo = "skopeo";  // looked up in PATH unless absolute
  std::chrono::seconds pull_timeout{1800};
};

struct LayerInfo {
  std::string digest;   // of the blob as the registry serves it
  std::string diff_id;  // of its decompressed tar (the layer dir's name)
  std::uint64_t size = 0;
  std::string media_type;
};

struct ImageConfig {
  std::vector<std::string> env;  // "K=V"
  std::string workdir;
  std::string user;
};

struct Image {
  std::string ref;                // the reference it was last pulled by
  std::vector<std::string> refs;  // every reference it was pulled by
  std::string digest;             // the manifest's: "sha256:<hex>"
  std::uint64_t size = 0;         // sum of the layer blobs
  std::vector<LayerInfo> layers;  // lowest first
  std::string platform;           // "linux/amd64"
  ImageConfig config;
  std::int64_t pulled_at = 0;  // unix seconds
};

// A layer done during a pull (NDJSON progress: {"layer", "bytes", "total"}).
struct PullProgress {
  std::string layer;  // blob digest
  std::uint64_t bytes = 0;
  std::uint64_t total = 0;
};
using ProgressFn = std::function<void(const PullProgress&)>;

// Whether `s` is a digest reference ("sha256:" + 64 hex).
bool is_digest(const std::string& s);
// The registry host of a reference ("127.0.0.1:5000/a/b:1" -> "127.0.0.1:5000"; Docker Hub's
// short names -> "docker.io"). kInvalid for a malformed reference (naming field `ref`).
Result<std::string> registry_host(const std::string& ref);

class ImageStore {
 public:
  // Makes the directories, empties tmp/. Blocking.
  static Result<std::shared_ptr<ImageStore>> open(StoreConfig cfg);

  // Pulls `ref` (a tag or @digest reference). An image already stored under that digest gains
  // the ref. Errors: kInvalid (the ref), kImage (a bad digest or hostile layer, naming the blob or
  // entry), kUpstream (the registry unreachable or refusing, its reason quoted). Blocking.
  Result<Image> pull(const std::string& ref, const ProgressFn& progress);

  std::vector<Image> list() const;
  // By digest or by any reference it was pulled by; kNotFound otherwise.
  Result<Image> get(const std::string& ref_or_digest) const;
  // Removes the record of `digest` and its layers no other image has (GC). The caller has made
  // sure no session or template uses it. kNotFound when absent.
  Status remove(const std::string& digest);
  // Removes the layer dirs no image record names (what a crash between steps may leave).
  // Returns how many went.
  std::size_t gc_layers();

  // The reference an alias names (StoreConfig::aliases); "" when none.
  std::string alias(const std::string& name) const {
    auto it = cfg_.aliases.find(name);
    return it == cfg_.aliases.end() ? std::string() : it->second;
  }
  // The first alias (by name) of reference `ref`; "" when none.
  std::string alias_of(const std::string& ref) const {
    for (const auto& [name, r] : cfg_.aliases) {
      if (r == ref) return name;
    }
    return {};
  }

  // The host dirs of `img`'s layers, lowest first.
  std::vector<std::string> layer_dirs(const Image& img) const;
  const std::string& dir() const { return cfg_.dir; }

 private:
  explicit ImageStore(StoreConfig cfg) : cfg_(std::move(cfg)) {}
  Result<Image> read_record(const std::string& digest) const;
  Status write_record(const Image& img);
  std::size_t gc_layers_locked();
  // Puts a sparse stand-in (of its size) for every layer blob the store has unpacked into the
  // OCI layout dir `oci`, for skopeo to reuse instead of fetching; returns blob digest -> diff id.
  Result<std::map<std::string, std::string>> stand_in_blobs(const std::string& oci) const;

  StoreConfig cfg_;
  std::mutex pull_mu_;  // pulls, removals, GC
  mutable std::mutex records_mu_;
};

}  // namespace agentbox::image
