#pragma once
// OCI images for tests, made and served on this machine only (API.md "Images"):
//  - LocalRegistry: Debian's docker-registry on 127.0.0.1 (a free port), its config and storage
//    in a temp dir, optionally with basic auth (htpasswd, bcrypt); killed and removed with the
//    object;
//  - layers and OCI layouts written by hand (libarchive tar+gzip, sha256 digests), including
//    hostile ones a real build tool would not make ("../x", device nodes, whiteouts of "/");
//  - busybox_rootfs(): a tiny root from Debian's busybox-static (/bin/busybox and its applets as
//    symlinks, /etc/os-release);
//  - push(): `skopeo copy oci:DIR:TAG docker://127.0.0.1:PORT/REPO:TAG`.
// Everything throws std::runtime_error on failure (a test's setup either works or the test fails).

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "support/support.h"

namespace agentbox::testing {

struct LayerEntry {
  enum class Kind { kFile, kDir, kSymlink, kHardlink, kCharDev };
  Kind kind = Kind::kFile;
  std::string path;  // as stored in the tar ("etc/os-release", "../evil", "/abs")
  std::string data;  // kFile: contents; kSymlink, kHardlink: target
  std::uint32_t mode = 0644;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;

  static LayerEntry file(std::string path, std::string data, std::uint32_t mode = 0644) {
    return {Kind::kFile, std::move(path), std::move(data), mode};
  }
  static LayerEntry dir(std::string path, std::uint32_t mode = 0755) {
    return {Kind::kDir, std::move(path), "", mode};
  }
  static LayerEntry symlink(std::string path, std::string target) {
    return {Kind::kSymlink, std::move(path), std::move(target), 0777};
  }
};

struct TestImage {
  std::vector<std::vector<LayerEntry>> layers;  // lowest first
  std::vector<std::string> env;                 // config Env, "K=V"
  std::string architecture;                     // "" = this host's
};

// A root with /bin/busybox (copied from the host's busybox-static) and applet symlinks
// (sh, ls, cat, id, echo, env, touch, rm, mkdir, stat, chmod, test), /etc/os-release naming
// `os_id`, /tmp, /workspace-free.
std::vector<LayerEntry> busybox_rootfs(const std::string& os_id = "agentbox-test-busybox");

// The tar+gzip bytes of a layer, and its blob and diff ids.
struct BuiltLayer {
  std::string blob;     // tar+gzip
  std::string digest;   // sha256 of blob
  std::string diff_id;  // sha256 of the tar
};
BuiltLayer build_layer(const std::vector<LayerEntry>& entries);

// "sha256:<hex>" of `data`.
std::string sha256_digest(const std::string& data);

// Writes `img` as an OCI image layout in `dir` (made if missing) under tag `tag`. Returns the
// manifest digest.
std::string write_oci_layout(const std::string& dir, const TestImage& img, const std::string& tag);

class LocalRegistry {
 public:
  struct Options {
    std::string user;  // set: basic auth with this user and password
    std::string password;
  };
  LocalRegistry() : LocalRegistry(Options{}) {}
  explicit LocalRegistry(Options opts);
  ~LocalRegistry();
  LocalRegistry(const LocalRegistry&) = delete;
  LocalRegistry& operator=(const LocalRegistry&) = delete;

  // "127.0.0.1:PORT".
  const std::string& host() const { return host_; }
  // Where the registry keeps blobs: <storage>/docker/registry/v2/blobs/sha256/<2>/<hex>/data.
  std::string blob_path(const std::string& digest) const;
  // Pushes the layout `oci_dir` tag `tag` as host()/repo_tag ("team/app:1").
  void push(const std::string& oci_dir, const std::string& tag, const std::string& repo_tag) const;
  // Stops the registry (a "registry down" test); idempotent.
  void stop();

 private:
  Options opts_;
  TempDir dir_{"agentbox-registry"};
  std::string host_;
  pid_t pid_ = -1;
};

}  // namespace agentbox::testing
