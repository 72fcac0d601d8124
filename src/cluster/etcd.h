#pragma once
// A small etcd v3 client over etcd's JSON gateway (etcd 3.4: POST /v3/kv/put, /v3/kv/range,
// /v3/kv/deleterange, /v3/kv/txn, /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke,
// /v3/watch; keys and values base64 on the wire, plain bytes here). It speaks HTTP through
// client::Client (client/client.h), one keep-alive connection per concurrent caller, and tries
// the endpoints in turn: the first that answers serves, and is tried first next time.
//
// Thread-safe: any thread may call; calls block (the cluster's own threads and the pool make
// them, never the io_context). Errors: EUNAVAILABLE when no endpoint answers (or etcd has no
// quorum), EINTERNAL for a reply that makes no sense; the message names the endpoints.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"

namespace agentbox::client {
class Client;
}

namespace agentbox::cluster {

struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  std::int64_t revision = 0;  // the store's revision when read
};

// Create-if-absent: `succeeded` when this call wrote the key; else `existing` is what holds it.
struct CreateResult {
  bool succeeded = false;
  KeyValue existing;
  std::int64_t revision = 0;
};

struct WatchEvent {
  bool deleted = false;  // DELETE; else PUT
  KeyValue kv;           // a DELETE has the key and mod_revision only
};

struct EtcdOptions {
  std::vector<std::string> endpoints;  // "http://127.0.0.1:2379", or https:// (TLS)
  // Unary calls: how long an endpoint may stay silent before the next one is tried.
  std::chrono::milliseconds timeout{2000};
  // TLS to https:// endpoints (client/client.h TlsOptions): the CA file (the system's CAs when
  // empty); this client's certificate and key for an etcd with --client-cert-auth.
  std::string ca_file, cert_file, key_file;
};

// The end of every key starting with `prefix` (etcd's range_end for a prefix).
std::string prefix_end(const std::string& prefix);

class EtcdClient {
 public:
  explicit EtcdClient(EtcdOptions opts);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const std::vector<std::string>& endpoints() const { return opts_.endpoints; }

  // Returns the revision of the write. `lease` 0: none.
  Result<std::int64_t> put(const std::string& key, const std::string& value,
                           std::int64_t lease = 0);
  // One key (range_end empty) or [key, range_end).
  Result<RangeResult> range(const std::string& key, const std::string& range_end = {});
  Result<RangeResult> range_prefix(const std::string& prefix) {
    return range(prefix, prefix_end(prefix));
  }
  // Returns how many keys went.
  Result<std::int64_t> erase(const std::string& key, const std::string& range_end = {});
  // One transaction: put `key` = `value` if it does not exist (create_revision == 0), else read
  // it. Two racing callers: exactly one succeeds, the other gets its value.
  Result<CreateResult> create_if_absent(const std::string& key, const std::string& value,
                                        std::int64_t lease = 0);
  // Deletes `key` only while it still holds `value` (compare value): whether it did.
  Result<bool> erase_if_value(const std::string& key, const std::string& value);
  // Puts `value` only while `key` still holds `expected` (compare value): whether it did.
  Result<bool> put_if_value(const std::string& key, const std::string& expected,
                            const std::string& value, std::int64_t lease = 0);

  // A lease of `ttl_sec`: its id.
  Result<std::int64_t> lease_grant(std::int64_t ttl_sec);
  // Refreshes a lease: its TTL now, 0 when it has expired (or never existed).
  Result<std::int64_t> lease_keepalive(std::int64_t id);
  Status lease_revoke(std::int64_t id);

  // Watches every key in [key, range_end) from `start_revision` (0: now), calling `on_event`
  // for each change in order and `on_progress` (optional) with each reply's revision. Blocks
  // until `stop` is set (checked whenever etcd sends something and at least every
  // `idle_timeout`), or the connection fails: then an error (EUNAVAILABLE, or ETIMEDOUT after
  // `idle_timeout` of silence), and the caller watches again from the revision it saw last.
  Status watch(const std::string& key, const std::string& range_end, std::int64_t start_revision,
               const std::function<void(const WatchEvent&)>& on_event,
               const std::atomic<bool>& stop, std::chrono::milliseconds idle_timeout,
               const std::function<void(std::int64_t)>& on_progress = {});

 private:
  // A POST of a JSON body to `path` on the first endpoint that answers: the reply's body.
  Result<std::string> call(const std::string& path, const std::string& body);
  std::unique_ptr<client::Client> take(std::size_t endpoint);
  void give_back(std::size_t endpoint, std::unique_ptr<client::Client> c);

  EtcdOptions opts_;
  std::mutex mu_;
  std::vector<std::vector<std::unique_ptr<client::Client>>> idle_;  // per endpoint
  std::atomic<std::size_t> preferred_{0};
};

}  // namespace agentbox::cluster
