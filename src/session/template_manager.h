#pragma once
// Templates, builds and snapshots (API.md "Templates, snapshots, health, packages"; DESIGN.md
// "Workspaces"). On disk, under the daemon's data dir (0700):
//   templates/<name>.json   the template's YAML, its snapshot versions and which one is current
//                           (written whole: temp file, fsync, rename)
//   snapshots/<sha256>      a build's frozen workspace, content-addressed, never written again
//   builds/<build_id>/ws    a build's workspace while it runs (removed when it ends; leftovers
//                           of a crash are removed at the next start)
//   build_records/<build_id>.{json,log}  a build's record and log (session/build_records.h),
//                           the last 32 per template
//   layers/<session>/{upper,work}  a templated session's own copy-on-write layer
//   layers/<session>.img    with limits.disk_mb: the capped disk mounted at layers/<session>
//   root_layers/<build_id>  a build on an image (`image:`): what it changed outside /workspace,
//                           an overlayfs upper dir kept as a read-only layer its sessions stack
//                           on the image's (session/template_images.cc); gone with the last
//                           snapshot version naming it
// A build runs the template's files and setup in a box of the sessions' backend, as the build
// user, under the template's network policy, and becomes a snapshot only when every step
// succeeded: a failed (or killed) build never changes which version is current.
//
// Threading: every method may be called from any thread. Locking: mu_ is never held while
// calling the in-use callback (which takes the session manager's lock), so the session manager
// may call in here with its own lock held.

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "sandbox/sandbox.h"
#include "workspace/templates.h"

namespace agentbox::image {
class ImageStore;
}

namespace agentbox::session {

struct SnapshotInfo {
  std::string id;  // sha256 of the tree
  std::uint64_t version = 0;
  std::chrono::system_clock::time_point created_at;
  std::uint64_t bytes = 0;
  std::uint64_t files = 0;
  std::string build_id;
  // The health checks of the YAML it was built from: its sessions run these, whatever the
  // template says since.
  std::vector<workspace::TemplateHealthCheck> health;
  // The env of the YAML it was built from: in the environment of every session on it (under
  // the session's own env).
  std::map<std::string, std::string> env;
  // Built on an image (the YAML's `image:`): the reference and the digest it resolved to, and
  // the build's root layer (a name in data_dir/root_layers; "" when it changed nothing there).
  std::string image_ref, image_digest, root_layer;
};

struct TemplateInfo {
  workspace::Template tmpl;
  std::vector<std::string> warnings;  // of the last upload
  std::chrono::system_clock::time_point created_at, updated_at;
  std::vector<SnapshotInfo> snapshots;  // by version
  std::uint64_t current = 0;            // 0: never built
};

enum class BuildState { kRunning, kSucceeded, kFailed };
std::string_view build_state_name(BuildState s);

struct BuildInfo {
  std::string id;
  std::string template_name;
  BuildState state = BuildState::kRunning;
  std::string step;                // the step running, or the one that failed
  std::optional<int> exit_code;    // of the failing step, or 0 when it succeeded
  std::string error;               // why it failed
  std::string snapshot;            // the snapshot it made
  std::uint64_t version = 0;       // its version
  std::chrono::system_clock::time_point started_at, ended_at;
};

// A session's snapshot, as resolved at its creation.
struct ResolvedTemplate {
  std::string snapshot;
  std::uint64_t version = 0;
  std::string image_ref, image_digest;  // the snapshot's image (SnapshotInfo); "" = host root
};

// Cluster mode (service/template_sync.h): what a build makes when the catalog decides it.
struct TemplateBuildAs {
  std::uint64_t version = 0;  // the snapshot's version (0: the next one here)
  std::string yaml;           // the YAML to build ("": the template's own); names the template
};

class TemplateManager {
 public:
  struct Config {
    std::string data_dir;                      // absolute, exists
    std::shared_ptr<sandbox::Backend> backend;  // builds run in its boxes
    uid_t build_uid = 9000;                     // owns every snapshot's files on disk
    sandbox::Limits default_limits;             // of a build box, under the template's own
    std::vector<sandbox::BindMount> shared_dirs;  // read-only in the build box, as in sessions
    // The daemon's readonly_dirs: with an isolated backend, a host path a template names
    // (find_links, ...) must lie under one (or a system dir) or its push and build are refused.
    std::vector<std::string> readonly_dirs;
    std::chrono::seconds step_timeout{1800};      // per setup line
    // Templates on an image (`image:`): pulled here on a build's first use. Null: such a
    // template is refused (ENOTSUP naming `image`).
    std::shared_ptr<image::ImageStore> images;
  };
  static Result<std::shared_ptr<TemplateManager>> open(Config config);
  ~TemplateManager();
  // Stops running builds (they fail, nothing of them is kept) and refuses new ones; waits for
  // their threads. Idempotent; the daemon calls it while its network loop still runs.
  void shutdown();

  // Stores (or replaces) a template from its YAML; true when it is new. Snapshots stay.
  Result<std::pair<TemplateInfo, bool>> put(std::string_view yaml);
  Result<TemplateInfo> get(const std::string& name);
  std::vector<TemplateInfo> list();
  // EEXIST (409) while a session uses one of its snapshots or a build runs; then its unused
  // snapshots are removed.
  Status remove(const std::string& name);
  Result<TemplateInfo> rollback(const std::string& name, std::uint64_t version);

  using BuildAs = TemplateBuildAs;
  // Starts a build (EEXIST while one runs for this template).
  Result<BuildInfo> start_build(const std::string& name, BuildAs as = {});
  // Called once per build when it has ended, before it shows as ended (on the build's thread, no
  // lock held): the build, and its snapshot when it succeeded. Set once, before builds start.
  using BuildEnd = std::function<void(const BuildInfo&, const std::optional<SnapshotInfo>&)>;
  void set_on_build_end(BuildEnd fn) { on_build_end_ = std::move(fn); }
  Result<BuildInfo> build(const std::string& name, const std::string& build_id);
  // Blocks until the build ended.
  Result<BuildInfo> wait_build(const std::string& name, const std::string& build_id);
  // The build's log lines from index `from`; waits up to `wait` for more while it runs.
  // `ended`: the build is over and there are no lines past the returned ones.
  struct LogChunk {
    std::vector<std::string> lines;
    bool ended = false;
  };
  Result<LogChunk> build_log(const std::string& name, const std::string& build_id,
                             std::size_t from, std::chrono::milliseconds wait);

  // Sessions. "name" or "name@version" -> the snapshot (ENOENT unknown template or version,
  // EEXIST when it has no built snapshot).
  Result<ResolvedTemplate> resolve(const std::string& ref);
  // The env of the sessions on template `ref` ("name" or "name@version") at snapshot
  // `version`: that snapshot's, or the template's current one for a snapshot recorded before
  // snapshots kept their own. Empty when the template is gone.
  std::map<std::string, std::string> session_env(const std::string& ref, std::uint64_t version);
  // The host dir of the root layer of template `ref`'s snapshot `version` (stacked on the
  // image's layers in its sessions' roots); "" when it has none.
  std::string root_layer(const std::string& ref, std::uint64_t version);
  // The first template (by name) whose `image:` names image `digest` or one of whose snapshots
  // was built on it; "" when none (DELETE /v1/images/{digest} is 409 while one does).
  std::string image_user(const std::string& digest);
  // Mounts session `id`'s overlay (lower = the snapshot, upper/work = layers/<id>) at
  // `workspace_path` unless one is mounted there already; the session user owns its view.
  // disk_mb (limits.disk_mb): layers/<id> is then a capped disk (linux/quota_disk.h, image
  // layers/<id>.img) holding upper and work, so the session's writes hit ENOSPC at the cap
  // while the snapshot (lower) does not count.
  Status mount_session(const std::string& id, const std::string& snapshot,
                       const std::string& workspace_path, uid_t uid, gid_t gid,
                       std::uint64_t disk_mb = 0);
  // Unmounts it (keeps the layer; with `id`, also unmounts a capped layer, keeping its image).
  Status unmount_session(const std::string& workspace_path, const std::string& id = "");
  // Unmounts it and deletes the session's layer.
  Status drop_session(const std::string& id, const std::string& workspace_path);
  // The snapshots sessions use (set by the session manager); runs the startup GC once set.
  void set_in_use(std::function<std::set<std::string>()> fn);

  std::string snapshot_path(const std::string& id) const {
    return config_.data_dir + "/snapshots/" + id;
  }

 private:
  explicit TemplateManager(Config config);
  struct Build;
  struct Loop;
  Status save_locked(const TemplateInfo& t);
  // session/template_images.cc: `image:` checks at upload and build (ENOTSUP without images or
  // a backend that makes image roots, EINVAL for a malformed reference); the build box's root
  // on the image (pulled on first use) with the build user acting for its root; the upper dir
  // kept as the snapshot's root layer without the box's own files; unused root layers removed.
  Status check_image(const workspace::Template& t) const;
  Status image_build_root(const workspace::Template& t, const std::string& build_dir, uid_t owner,
                          sandbox::BoxConfig* cfg, SnapshotInfo* si);
  static std::vector<std::string> build_root_entries(const std::string& build_dir);
  Result<std::string> keep_build_root(const std::string& build_dir,
                                      const std::vector<std::string>& box_made,
                                      const std::string& build_id);
  void gc_root_layers(const std::set<std::string>& keep);  // mu_ held
  std::string root_layers_dir() const { return config_.data_dir + "/root_layers"; }
  Status load();
  void run_build(std::shared_ptr<Build> b, workspace::Template tmpl);
  std::string records_dir() const { return config_.data_dir + "/build_records"; }
  // Drops template `name`'s oldest finished builds past the ones kept (and their records).
  void prune_builds_locked(const std::string& name);
  // Removes snapshots no template version names and no session uses.
  void gc(const std::set<std::string>& in_use);
  std::set<std::string> in_use();

  Config config_;
  std::mutex mu_;
  std::condition_variable cv_;  // a build logged a line or ended
  std::map<std::string, TemplateInfo> templates_;
  std::map<std::string, std::shared_ptr<Build>> builds_;  // by build id
  std::vector<std::thread> threads_;
  std::unique_ptr<Loop> loop_;
  bool closing_ = false;
  std::mutex in_use_mu_;
  std::function<std::set<std::string>()> in_use_;
  BuildEnd on_build_end_;
};

}  // namespace agentbox::session
