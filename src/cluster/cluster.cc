#include "cluster/cluster.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/log.h"

namespace agentbox::cluster {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

std::uint64_t u64(const json& j, const char* f) {
  auto it = j.find(f);
  return it != j.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
}

bool is_record_kind(const std::string& kind) {
  return kind == "runners" || kind == "templates" || kind == "builds";
}

std::string str(const json& j, const char* f) {
  auto it = j.find(f);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

Cluster::Cluster(ClusterOptions opts, LoadFn load, LocalFn local)
    : opts_(std::move(opts)),
      load_(std::move(load)),
      local_(std::move(local)),
      etcd_(EtcdOptions{opts_.etcd, 2000ms, opts_.etcd_ca_file, opts_.etcd_cert_file,
                        opts_.etcd_key_file}) {
  if (opts_.prefix.empty() || opts_.prefix.back() != '/') opts_.prefix += '/';
}

Cluster::~Cluster() {
  stop();
}

void Cluster::start(std::chrono::milliseconds first_sync) {
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
  watcher_ = std::thread([this] { watch_loop(); });
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, first_sync, [this] { return (synced_ && registered_) || stop_.load(); });
  if (!synced_ || !registered_) {
    spdlog::warn(
        "cluster: etcd ({}) not reached yet; serving this node's own sessions and "
        "trying on",
        opts_.etcd.empty() ? "" : opts_.etcd.front());
  }
}

void Cluster::stop() {
  if (stop_.exchange(true)) return;
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  // Down for the others at once (not after lease_sec); best effort.
  if (lease_ != 0) (void)etcd_.lease_revoke(lease_);
  // Wakes the watch (it checks the stop flag on every event).
  (void)etcd_.put(key("wake", opts_.node), std::to_string(unix_now()));
  if (watcher_.joinable()) watcher_.join();
}

std::string Cluster::node_record() const {
  NodeLoad l = load_ ? load_() : NodeLoad{};
  json j = {{"name", opts_.node},
            {"advertise", opts_.advertise},
            {"version", kNodeVersion},
            {"config_digest", opts_.config_digest},
            {"sessions", l.sessions},
            {"running_boxes", l.running_boxes},
            {"free_memory_mb", l.free_memory_mb},
            {"last_seen", unix_now()}};
  return j.dump();
}

Status Cluster::register_self() {
  if (lease_ != 0) {
    auto ttl = etcd_.lease_keepalive(lease_);
    if (!ttl) return std::unexpected(ttl.error());
    if (*ttl <= 0) {
      spdlog::warn("cluster: lease of node {} expired (etcd was out of reach); registering again",
                   opts_.node);
      lease_ = 0;
    }
  }
  const bool fresh = lease_ == 0;
  if (fresh) {
    auto id = etcd_.lease_grant(opts_.lease_sec);
    if (!id) return std::unexpected(id.error());
    lease_ = *id;
  }
  auto put = etcd_.put(key("nodes", opts_.node), node_record());
  if (!put) return std::unexpected(put.error());
  if (fresh) {
    auto alive = etcd_.put(key("alive", opts_.node), std::to_string(unix_now()), lease_);
    if (!alive) {
      lease_ = 0;
      return std::unexpected(alive.error());
    }
    // This node's leased records (a runner connected here) went with a lapsed lease: put again,
    // unless another node wrote one meanwhile (the runner reconnected there: its record stands).
    std::map<std::string, std::string> leased;
    {
      std::lock_guard lock(mu_);
      leased = leased_;
    }
    for (const auto& [k, v] : leased) {
      auto r = etcd_.create_if_absent(k, v, lease_);
      if (!r) return std::unexpected(r.error());
      if (!r->succeeded) {
        std::lock_guard lock(mu_);
        leased_.erase(k);
      }
    }
    if (auto st = reconcile_local(); !st) return st;
    spdlog::info("cluster: node {} registered at {} (lease {} s)", opts_.node, opts_.advertise,
                 opts_.lease_sec);
  }
  return {};
}

Status Cluster::reconcile_local() {
  if (!local_) return {};
  for (const auto& [id, tenant] : local_()) {
    Result<Owner> r = fail(Code::kNotFound, id);
    if (auto o = owner(id)) {
      r = *o;
    } else {
      r = write_entry(id, tenant, opts_.node);  // a cordon stops new sessions, not these
    }
    if (!r) return std::unexpected(r.error());
    if (!r->self) {
      spdlog::error(
          "cluster: session {} is here, but the catalog places it on node {}: it is "
          "not served through the cluster until that is resolved",
          id, r->node);
    }
  }
  return {};
}

void Cluster::heartbeat_loop() {
  const auto interval = std::chrono::milliseconds(std::max(300, opts_.lease_sec * 1000 / 3));
  while (!stop_.load()) {
    auto st = register_self();
    if (st) {
      if (!healthy_.exchange(true)) spdlog::info("cluster: etcd reached");
      std::lock_guard lock(mu_);
      if (!registered_) {
        registered_ = true;
        cv_.notify_all();
      }
    } else if (healthy_.exchange(false) || lease_ == 0) {
      spdlog::warn("cluster: {}", st.error().message);
    }
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, st ? interval : std::chrono::milliseconds(500),
                 [this] { return stop_.load(); });
  }
}

void Cluster::apply(const KeyValue& kv, bool deleted) {
  if (kv.key.rfind(opts_.prefix, 0) != 0) return;
  std::string rest = kv.key.substr(opts_.prefix.size());
  auto slash = rest.find('/');
  if (slash == std::string::npos) return;
  std::string kind = rest.substr(0, slash);
  std::string name = rest.substr(slash + 1);
  if (kind == "nodes") {
    if (deleted) {
      nodes_.erase(name);
      return;
    }
    auto j = json::parse(kv.value, nullptr, false);
    if (!j.is_object()) return;
    NodeState& n = nodes_[name];
    n.name = name;
    n.advertise = str(j, "advertise");
    n.version = str(j, "version");
    n.config_digest = str(j, "config_digest");
    n.load = {u64(j, "sessions"), u64(j, "running_boxes"), u64(j, "free_memory_mb")};
    auto ls = j.find("last_seen");
    if (ls != j.end() && ls->is_number_integer()) n.last_seen = ls->get<std::int64_t>();
  } else if (kind == "alive") {
    if (deleted) {
      alive_.erase(name);
    } else {
      alive_.insert(name);
    }
  } else if (kind == "cordon") {
    if (deleted) {
      cordoned_.erase(name);
    } else {
      cordoned_.insert(name);
    }
  } else if (is_record_kind(kind)) {
    if (deleted) {
      records_[kind].erase(name);
    } else {
      records_[kind][name] = kv.value;
    }
    ++records_gen_;
  } else if (kind == "sessions") {
    if (deleted) {
      catalog_.erase(name);
      return;
    }
    auto j = json::parse(kv.value, nullptr, false);
    if (!j.is_object()) return;
    catalog_[name] = Entry{str(j, "node"), str(j, "tenant"), kv.value};
  }
}

Status Cluster::resync() {
  auto all = etcd_.range_prefix(opts_.prefix);
  if (!all) return std::unexpected(all.error());
  std::lock_guard lock(mu_);
  nodes_.clear();
  alive_.clear();
  cordoned_.clear();
  catalog_.clear();
  records_.clear();
  ++records_gen_;
  for (const auto& kv : all->kvs) apply(kv, false);
  watch_rev_ = all->revision;
  if (!synced_) {
    synced_ = true;
    cv_.notify_all();
  }
  return {};
}

void Cluster::watch_loop() {
  const auto idle = std::chrono::milliseconds(std::max(1000, opts_.lease_sec * 1000));
  bool need_sync = true;
  while (!stop_.load()) {
    if (need_sync) {
      if (auto st = resync(); !st) {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, 500ms, [this] { return stop_.load(); });
        continue;
      }
      need_sync = false;
    }
    std::int64_t from;
    {
      std::lock_guard lock(mu_);
      from = watch_rev_ + 1;
    }
    auto st = etcd_.watch(
        opts_.prefix, prefix_end(opts_.prefix), from,
        [this](const WatchEvent& ev) {
          spdlog::debug("cluster: watch: {} {} (revision {})", ev.deleted ? "DELETE" : "PUT",
                        ev.kv.key, ev.kv.mod_revision);
          std::lock_guard lock(mu_);
          apply(ev.kv, ev.deleted);
          if (ev.kv.mod_revision > watch_rev_) watch_rev_ = ev.kv.mod_revision;
        },
        stop_, idle,
        [this](std::int64_t rev) {
          std::lock_guard lock(mu_);
          if (rev > watch_rev_) watch_rev_ = rev;
        });
    if (stop_.load()) break;
    if (!st && st.error().code != Code::kTimedOut) {
      spdlog::warn("cluster: watch from revision {}: {}; reading the catalog again", from,
                   st.error().message);
    } else if (!st) {
      spdlog::debug("cluster: watch from revision {}: {}", from, st.error().message);
    }
    // Silence for `idle`: watch again from where it was. Anything else (etcd gone, the
    // revision compacted): read everything again once etcd answers.
    if (!st && st.error().code != Code::kTimedOut) need_sync = true;
  }
}

std::vector<NodeState> Cluster::nodes() const {
  std::lock_guard lock(mu_);
  std::vector<NodeState> out;
  for (const auto& [name, n] : nodes_) {
    NodeState s = n;
    s.up = alive_.contains(name);
    s.cordoned = cordoned_.contains(name);
    if (name == opts_.node) {
      out.insert(out.begin(), std::move(s));
    } else {
      out.push_back(std::move(s));
    }
  }
  if (out.empty() || out.front().name != opts_.node) {
    // Not registered yet (etcd out of reach): this node as it knows itself.
    NodeState self;
    self.name = opts_.node;
    self.advertise = opts_.advertise;
    self.version = kNodeVersion;
    self.config_digest = opts_.config_digest;
    self.up = true;
    self.cordoned = cordoned_.contains(opts_.node);
    if (load_) self.load = load_();
    self.last_seen = unix_now();
    out.insert(out.begin(), std::move(self));
  }
  return out;
}

std::vector<NodeState> Cluster::peers_up() const {
  std::vector<NodeState> out;
  for (auto& n : nodes()) {
    if (n.name != opts_.node && n.up) out.push_back(std::move(n));
  }
  return out;
}

std::optional<Owner> Cluster::owner(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = catalog_.find(id);
  if (it == catalog_.end()) return std::nullopt;
  Owner o;
  o.node = it->second.node;
  o.self = o.node == opts_.node;
  o.up = o.self || alive_.contains(o.node);
  auto n = nodes_.find(o.node);
  if (n != nodes_.end()) {
    o.advertise = n->second.advertise;
    o.last_seen = n->second.last_seen;
  }
  return o;
}

std::optional<Owner> Cluster::lookup(const std::string& id) {
  if (auto o = owner(id)) return o;
  auto r = etcd_.range(key("sessions", id));
  if (!r || r->kvs.empty()) return std::nullopt;
  {
    std::lock_guard lock(mu_);
    apply(r->kvs.front(), false);
  }
  return owner(id);
}

Error Cluster::catalog_error(const Error& e) const {
  return Error::make(Code::kUnavailable,
                     "the session catalog (etcd) cannot be reached, so no new session can be "
                     "placed: " +
                         e.message);
}

Result<Owner> Cluster::place(const std::string& id, const std::string& tenant,
                             const std::string& node) {
  if (auto o = owner(id)) return *o;
  std::string target = node;
  bool cached_cordon = false;
  if (!target.empty()) {
    std::lock_guard lock(mu_);
    cached_cordon = cordoned_.contains(target);
  }
  if (cached_cordon) {
    // The cache follows etcd by watch and may lag an uncordon made on another node a moment
    // ago: a refusal is checked against etcd itself, so an admin's uncordon holds at once.
    auto r = etcd_.range(key("cordon", target));
    if (!r) return std::unexpected(catalog_error(r.error()));
    std::lock_guard lock(mu_);
    if (r->kvs.empty()) {
      cordoned_.erase(target);
    } else {
      cordoned_.insert(target);
    }
  }
  {
    std::lock_guard lock(mu_);
    if (!target.empty()) {
      if (target != opts_.node && !nodes_.contains(target)) {
        return fail(Code::kNotFound, "no node '" + target + "' in the cluster");
      }
      if (target != opts_.node && !alive_.contains(target)) {
        return fail(Code::kUnavailable, "node '" + target + "' is down");
      }
      if (cordoned_.contains(target)) {
        return fail(Code::kExists, "node '" + target + "' is cordoned: it takes no new sessions");
      }
    } else {
      // The most free capacity: free memory shared by the sessions it holds (the catalog's
      // count, current to the last watch event); ties spread by a hash of id and node.
      std::map<std::string, std::uint64_t> held;
      for (const auto& [sid, e] : catalog_) ++held[e.node];
      double best = -1;
      std::size_t best_hash = 0;
      for (const auto& [name, n] : nodes_) {
        // This node is up whatever its lease key says right now (a lapsed lease comes back
        // with the next keepalive); the catalog write below still needs etcd.
        const bool up = name == opts_.node || alive_.contains(name);
        if (!up || cordoned_.contains(name)) continue;
        double mem = static_cast<double>(std::max<std::uint64_t>(n.load.free_memory_mb, 1));
        double score = mem / static_cast<double>(1 + held[name]);
        std::size_t h = std::hash<std::string>{}(id + "/" + name);
        if (score > best || (score == best && h > best_hash)) {
          best = score;
          best_hash = h;
          target = name;
        }
      }
      // This node is up even when the cache says no node is (its record gone with a lapsed
      // lease, or the cache emptied by a resync): it takes the session unless it is cordoned.
      if (target.empty() && !cordoned_.contains(opts_.node)) target = opts_.node;
      if (target.empty()) {
        return fail(Code::kUnavailable,
                    "no node can take a new session: every node is down or cordoned");
      }
    }
  }
  return write_entry(id, tenant, target);
}

Result<Owner> Cluster::write_entry(const std::string& id, const std::string& tenant,
                                   const std::string& target) {
  const std::string value = json{{"node", target}, {"tenant", tenant}}.dump();
  auto r = etcd_.create_if_absent(key("sessions", id), value);
  if (!r) return std::unexpected(catalog_error(r.error()));
  {
    std::lock_guard lock(mu_);
    if (r->succeeded) {
      catalog_[id] = Entry{target, tenant, value};
    } else {
      KeyValue kv = r->existing;
      apply(kv, false);
    }
  }
  auto o = owner(id);
  if (!o) return fail(Code::kInternal, "catalog entry of session " + id + " vanished");
  return *o;
}

void Cluster::forget(const std::string& id) {
  std::string raw;
  {
    std::lock_guard lock(mu_);
    auto it = catalog_.find(id);
    if (it == catalog_.end() || it->second.node != opts_.node) return;
    raw = it->second.raw;
    catalog_.erase(it);
  }
  auto r = etcd_.erase_if_value(key("sessions", id), raw);
  if (!r)
    spdlog::warn("cluster: catalog entry of session {} not removed: {}", id, r.error().message);
}

namespace {

Error move_catalog_error(const Error& e) {
  return Error::make(
      Code::kUnavailable,
      "the session catalog (etcd) cannot be reached: a move needs it (" + e.message + ")");
}

}  // namespace

Result<std::string> Cluster::entry(const std::string& id) {
  auto r = etcd_.range(key("sessions", id));
  if (!r) return std::unexpected(move_catalog_error(r.error()));
  return r->kvs.empty() ? std::string() : r->kvs.front().value;
}

Result<bool> Cluster::swap_entry(const std::string& id, const std::string& from,
                                 const std::string& to) {
  auto r = etcd_.put_if_value(key("sessions", id), from, to);
  if (!r) return std::unexpected(move_catalog_error(r.error()));
  return *r;
}

Status Cluster::set_cordon(const std::string& name, bool cordoned) {
  {
    std::lock_guard lock(mu_);
    if (name != opts_.node && !nodes_.contains(name)) {
      return fail(Code::kNotFound, "no node '" + name + "' in the cluster");
    }
  }
  if (cordoned) {
    auto r = etcd_.put(key("cordon", name), std::to_string(unix_now()));
    if (!r) return std::unexpected(catalog_error(r.error()));
  } else {
    auto r = etcd_.erase(key("cordon", name));
    if (!r) return std::unexpected(catalog_error(r.error()));
  }
  std::lock_guard lock(mu_);
  if (cordoned) {
    cordoned_.insert(name);
  } else {
    cordoned_.erase(name);
  }
  return {};
}

std::optional<std::string> Cluster::record(const std::string& kind, const std::string& name) const {
  std::lock_guard lock(mu_);
  auto k = records_.find(kind);
  if (k == records_.end()) return std::nullopt;
  auto it = k->second.find(name);
  if (it == k->second.end()) return std::nullopt;
  return it->second;
}

std::map<std::string, std::string> Cluster::records(const std::string& kind) const {
  std::lock_guard lock(mu_);
  auto k = records_.find(kind);
  return k == records_.end() ? std::map<std::string, std::string>() : k->second;
}

Result<std::string> Cluster::read_record(const std::string& kind, const std::string& name) {
  auto r = etcd_.range(key(kind, name));
  if (!r) return std::unexpected(catalog_error(r.error()));
  return r->kvs.empty() ? std::string() : r->kvs.front().value;
}

Result<bool> Cluster::swap_record(const std::string& kind, const std::string& name,
                                  const std::string& from, const std::string& to, bool leased) {
  if (!is_record_kind(kind)) return fail(Code::kInvalid, "no catalog records of kind " + kind);
  const std::string k = key(kind, name);
  const std::int64_t lease = leased ? lease_.load() : 0;
  if (leased && lease == 0) {
    return std::unexpected(catalog_error(Error::make(Code::kUnavailable, "no lease yet")));
  }
  Result<bool> done = false;
  if (to.empty()) {
    done = from.empty() ? Result<bool>(true) : etcd_.erase_if_value(k, from);
  } else if (from.empty()) {
    auto c = etcd_.create_if_absent(k, to, lease);
    done = c ? Result<bool>(c->succeeded) : Result<bool>(std::unexpected(c.error()));
  } else {
    done = etcd_.put_if_value(k, from, to, lease);
  }
  if (!done) return std::unexpected(catalog_error(done.error()));
  if (*done) {
    std::lock_guard lock(mu_);
    if (to.empty()) {
      records_[kind].erase(name);
    } else {
      records_[kind][name] = to;
    }
    if (leased && !to.empty()) {
      leased_[k] = to;
    } else {
      leased_.erase(k);
    }
    ++records_gen_;
  }
  return *done;
}

}  // namespace agentbox::cluster
