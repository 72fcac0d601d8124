#pragma once
// Cluster mode: templates live in the catalog (API.md "Cluster"), so a push, a delete, a build's
// new version or a rollback through one node holds on every node. The record templates/T
// (cluster/template_record.h) changes by compare-and-swap only.
// Each node keeps its own copy of every definition (session/template_manager.h) and builds a
// version's snapshot itself the first time a session here needs it, from the YAML recorded with
// that version, under the same version number; a version number is reserved in the record when a
// build starts, so two nodes never make two different version 3s. Where a build ran is the record
// builds/B: its log is read there through any node.
//
// Every method blocks on etcd (call it on the pool) and is thread-safe; with etcd out of reach a
// change is EUNAVAILABLE naming the catalog, and reads go on from the cache.

#include <boost/asio/awaitable.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "cluster/cluster.h"
#include "cluster/template_record.h"
#include "common/error.h"
#include "session/template_manager.h"

namespace agentbox::service {

struct Deps;

class TemplateCatalog {
 public:
  TemplateCatalog(cluster::Cluster* cl, std::shared_ptr<session::TemplateManager> tm);

  // This node's copies made the catalog's: a definition pushed elsewhere is put here, one deleted
  // elsewhere is removed here (kept while a session here uses it; tried again at the next sync),
  // the catalog's current version made current here when it is built here. The first sync enters
  // the templates this node had and the catalog has never seen (a node joining with its own).
  void sync();
  // One template's copy, as sync() makes it.
  void sync_one(const std::string& name);

  // A put here (`yaml`, already stored here): the definition into the record (its versions stay;
  // a tombstone is replaced by a fresh record).
  Status pushed(const std::string& name, const std::string& yaml);
  // A delete here: the record becomes a tombstone.
  Status removed(const std::string& name);
  // A new build here: the next version number, reserved in the record ("building", this node),
  // and the YAML it builds. started() then names its build; unreserve() frees the number when the
  // build could not start.
  Result<session::TemplateManager::BuildAs> reserve(const std::string& name);
  void started(const std::string& name, std::uint64_t version, const std::string& build_id);
  void unreserve(const std::string& name, std::uint64_t version);
  // The record's current version becomes `version` (ENOENT unless it is built somewhere), and
  // this node's too when it has it.
  Status rollback(const std::string& name, std::uint64_t version);

  // `t` (this node's copy) as the cluster sees it: the record's current version, and every
  // version built on any node (those built here with this node's figures); nullopt when it was
  // deleted in the cluster (a copy a session here still uses is not shown).
  std::optional<session::TemplateInfo> view(session::TemplateInfo t) const;
  // The node build `build_id` ran on when it is another one ("": here, or unknown).
  std::string build_node(const std::string& build_id) const;

  // A session on `ref` ("name" or "name@version") is about to be made here: nullopt when this node
  // has what it needs (or the catalog does not know the template: the session manager says what
  // is wrong); else the id of a build that must end first (started here now for the version the
  // record names, or "" when one of the template runs here already: wait and ask again).
  Result<std::optional<std::string>> prepare(const std::string& ref);
  // Waits up to half a second for build `build_id` of `name` to end: the build once it has.
  Result<std::optional<session::BuildInfo>> build_turn(const std::string& name,
                                                       const std::string& build_id);

 private:
  void on_build_end(const session::BuildInfo& b, const std::optional<session::SnapshotInfo>& si);
  // Read-modify-compare-and-swap of record templates/`name` (`fn` edits it; an error from it ends
  // the update). The record as stored.
  Result<cluster::TemplateRecord> update(const std::string& name,
                                         const std::function<Status(cluster::TemplateRecord&)>& fn);
  void enter_local();

  cluster::Cluster* cl_;
  std::shared_ptr<session::TemplateManager> tm_;
  std::mutex mu_;
  bool entered_ = false;  // enter_local() done
};

// `ref` ready on this node for a new session (TemplateCatalog::prepare, and the wait for the build
// it names, in short turns on the pool): EEXIST naming the build when the version could not be
// built here. A no-op without a catalog.
boost::asio::awaitable<Status> template_ready(Deps d, std::string ref);

}  // namespace agentbox::service
