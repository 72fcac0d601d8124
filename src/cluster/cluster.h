#pragma once
// One node of an agentbox cluster on etcd (shared/DESIGN.md "Beyond one machine", API.md
// "Cluster"): membership, the session catalog, placement, cordons.
//
// Keys under the prefix (default "/agentbox/"):
//   nodes/N    the node's record: advertise URL, version, config digest, load, last_seen (no
//              lease: it stays when the node dies, so others can say since when it is down)
//   alive/N    bound to the node's lease (lease_sec), kept alive every lease_sec/3: N is up
//              while it exists
//   cordon/N   present while N takes no new placements
//   sessions/S the catalog: {"node","tenant"} of session S, written by a create-if-absent
//              transaction (one owner, even when nodes race)
//   runners/U  {"node"}: the node that holds user U's runner connection, bound to that node's
//              lease (gone with the node); a remote session follows it (server/runner_follow.cc)
//   templates/T  template T's definition, versions and current version (service/template_sync)
//   builds/B   {"node","template"}: where template build B ran (its log is read there)
// Records of the last three kinds are kept by record()/swap_record(), cached like the rest.
// A watch over the prefix keeps a cache of all of it; every lookup (owner of a session, the
// node list) reads the cache and never waits on etcd, so with etcd unreachable a node keeps
// serving the sessions it owns. Placing a new id needs etcd (EUNAVAILABLE naming the catalog
// otherwise).
//
// Threads: two of its own (heartbeat, watch). Every method is thread-safe; place(), claim(),
// forget() and set_cordon() block on etcd (call them from the pool, never the io_context).

#include <atomic>
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
#include <utility>
#include <vector>

#include "cluster/etcd.h"
#include "common/error.h"

namespace agentbox::cluster {

inline constexpr char kNodeVersion[] = "agentboxd/1";

struct ClusterOptions {
  std::vector<std::string> etcd;  // endpoints, "http://host:port" or https://
  // TLS to an https:// etcd (EtcdOptions).
  std::string etcd_ca_file, etcd_cert_file, etcd_key_file;
  std::string node;       // this node's name
  std::string advertise;  // "http://host:port" other nodes reach this one at
  int lease_sec = 10;
  std::string secret;  // the forward signature's key (forward_auth.h)
  std::string config_digest;
  std::string prefix = "/agentbox/";
};

struct NodeLoad {
  std::uint64_t sessions = 0;
  std::uint64_t running_boxes = 0;
  std::uint64_t free_memory_mb = 0;
};

struct NodeState {
  std::string name;
  std::string advertise;
  std::string version;
  std::string config_digest;
  NodeLoad load;
  std::int64_t last_seen = 0;  // unix seconds of its last heartbeat
  bool up = false;
  bool cordoned = false;
  // "up", "down" or "cordoned" (an up node that takes no placements).
  std::string state() const { return !up ? "down" : cordoned ? "cordoned" : "up"; }
};

// Where a session lives.
struct Owner {
  std::string node;
  bool self = false;
  bool up = false;
  std::string advertise;
  std::int64_t last_seen = 0;  // of the node (for "down since")
};

class Cluster {
 public:
  using LoadFn = std::function<NodeLoad()>;
  // The sessions this node holds (id, tenant): entered into the catalog when absent, once etcd
  // is reached (a node that comes back with its data dir serves them again).
  using LocalFn = std::function<std::vector<std::pair<std::string, std::string>>()>;

  Cluster(ClusterOptions opts, LoadFn load, LocalFn local);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Starts the heartbeat and the watch; waits up to `first_sync` for the first registration and
  // catalog read (a node that cannot reach etcd yet starts anyway and keeps trying).
  void start(std::chrono::milliseconds first_sync = std::chrono::seconds(5));
  // Revokes this node's lease (it is down for the others at once) and stops the threads.
  void stop();

  const ClusterOptions& options() const { return opts_; }
  const std::string& node() const { return opts_.node; }
  bool etcd_healthy() const { return healthy_.load(); }

  // Every node known, by name; this node first.
  std::vector<NodeState> nodes() const;
  // The catalog's owner of session `id` (cache), or nullopt when the catalog has none.
  std::optional<Owner> owner(const std::string& id) const;
  // owner() read through to etcd on a cache miss (the watch may lag a create on another node by
  // a moment): nullopt when the catalog has no entry, or etcd cannot be reached. Blocks.
  std::optional<Owner> lookup(const std::string& id);
  // The up nodes other than this one.
  std::vector<NodeState> peers_up() const;

  // Places session `id` (tenant `tenant`): its owner when the catalog has one; else on `node`
  // when given (ENOENT unknown, EUNAVAILABLE down, EEXIST cordoned), else on the up, uncordoned
  // node with the most free capacity; written with a create-if-absent transaction, so racing
  // placements of one id agree. EUNAVAILABLE naming the catalog when etcd cannot be reached.
  Result<Owner> place(const std::string& id, const std::string& tenant,
                      const std::string& node = "");
  // place() on this node.
  Result<Owner> claim(const std::string& id, const std::string& tenant) {
    return place(id, tenant, opts_.node);
  }
  // Session `id` is gone from this node: its catalog entry goes (if it still names this node).
  void forget(const std::string& id);
  // A move's hand-over (server/cluster_move.cc). The catalog entry of `id` as etcd holds it now
  // (the cache is not asked): its stored value, "" when there is none.
  Result<std::string> entry(const std::string& id);
  // Puts `to` as the entry of `id` only while it still holds `from` (one compare-and-swap):
  // whether it did.
  Result<bool> swap_entry(const std::string& id, const std::string& from, const std::string& to);
  // Cordons or uncordons node `name` (ENOENT for a node never seen).
  Status set_cordon(const std::string& name, bool cordoned);

  // Records of kind "runners", "templates" or "builds" (cache): the stored value of `name`, or
  // nullopt; all of a kind, by name.
  std::optional<std::string> record(const std::string& kind, const std::string& name) const;
  std::map<std::string, std::string> records(const std::string& kind) const;
  // Bumped whenever a record of those kinds changes in the cache (watch or write here).
  std::uint64_t records_generation() const { return records_gen_.load(); }
  // The record as etcd holds it now ("" when absent; the cache is not asked). Blocks.
  Result<std::string> read_record(const std::string& kind, const std::string& name);
  // Stores `to` only while the record holds `from` ("" = absent), one transaction; `to` "" deletes
  // it. With `leased` the record is bound to this node's lease (it goes when the node dies, and
  // is put again when the node registers anew after a lapse). Whether it did. EUNAVAILABLE
  // naming the catalog when etcd cannot be reached. Blocks.
  Result<bool> swap_record(const std::string& kind, const std::string& name,
                           const std::string& from, const std::string& to, bool leased = false);

 private:
  void heartbeat_loop();
  void watch_loop();
  Status register_self();
  Status reconcile_local();
  Result<Owner> write_entry(const std::string& id, const std::string& tenant,
                            const std::string& target);
  Status resync();  // full read of the prefix into the cache; sets watch_rev_
  void apply(const KeyValue& kv, bool deleted);  // mu_ held
  std::string node_record() const;
  Error catalog_error(const Error& e) const;
  std::string key(const std::string& kind, const std::string& name) const {
    return opts_.prefix + kind + "/" + name;
  }

  ClusterOptions opts_;
  LoadFn load_;
  LocalFn local_;
  EtcdClient etcd_;

  mutable std::mutex mu_;
  std::map<std::string, NodeState> nodes_;  // records
  std::set<std::string> alive_;
  std::set<std::string> cordoned_;
  struct Entry {
    std::string node;
    std::string tenant;
    std::string raw;  // the stored value (erase_if_value)
  };
  std::map<std::string, Entry> catalog_;
  std::map<std::string, std::map<std::string, std::string>> records_;  // kind -> name -> value
  std::map<std::string, std::string> leased_;  // key -> value of this node's leased records
  std::atomic<std::uint64_t> records_gen_{0};
  std::int64_t watch_rev_ = 0;
  bool synced_ = false;
  bool registered_ = false;
  std::condition_variable cv_;  // stop, first sync

  std::atomic<bool> stop_{false};
  std::atomic<bool> healthy_{false};
  std::atomic<std::int64_t> lease_{0};  // written by the heartbeat thread only
  std::thread heartbeat_;
  std::thread watcher_;
};

}  // namespace agentbox::cluster
