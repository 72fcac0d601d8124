#pragma once
// The `cluster:` section of agentboxd's configuration (API.md "Cluster"), its checks and the
// secret it names. The YAML and the flags are read by config_yaml.h (server/config.cc).

#include <string>
#include <vector>

#include "common/error.h"

namespace agentbox::cluster {

// Cluster mode (API.md "Cluster"): YAML `cluster: {etcd: [URL...], node, advertise, lease_sec,
// secret_file}`, flags --cluster-etcd (repeatable or comma-separated), --node-name,
// --advertise-url, --cluster-lease-sec, --cluster-secret-file (cluster/config_yaml.cc). Without
// etcd endpoints the daemon is a cluster of one and nothing changes.
struct ClusterConfig {
  std::vector<std::string> etcd;  // "http://host:port", or https:// (TLS, with the files below)
  // TLS to an https:// etcd (PEM): the CA its certificate is checked against (the system's CAs
  // when empty), and this node's client certificate and key when etcd asks for one
  // (--client-cert-auth). Given only with https:// endpoints.
  std::string etcd_ca_file;
  std::string etcd_cert_file;
  std::string etcd_key_file;
  std::string node;         // [A-Za-z0-9._-]{1,64}; default: the host name
  std::string advertise;    // "http://host:port" the other nodes reach this one at
  int lease_sec = 10;       // a dead node's sessions are 503 within lease_sec + 2 s
  std::string secret_file;  // the forward signature's key (16+ bytes); required
  bool enabled() const { return !etcd.empty(); }
};

// Checks a cluster config (nothing to check without etcd endpoints). EINVAL naming the key.
Status check_cluster(const ClusterConfig& c);

// The cluster's secret (secret_file's content without a trailing newline): EINVAL naming the
// file when it cannot be read or holds fewer than 16 bytes.
Result<std::string> read_cluster_secret(const ClusterConfig& c);

}  // namespace agentbox::cluster
