#pragma once
// The `cluster:` section of the daemon's YAML and its flags (cluster/config_yaml.cc), for
// server/config.cc.

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/config.h"

namespace agentbox::cluster {

// Reads `cluster: {etcd, node, advertise, lease_sec, secret_file}`; keys `given` on the command
// line ("cluster.etcd", ...) are left alone. EINVAL naming the key.
Status load_cluster_yaml(const YAML::Node& node, const std::string& file, ClusterConfig* c,
                         const std::function<bool(std::string_view)>& given);
// Adds the cluster flags; `options[i]` counts for the key returned at i.
std::vector<std::string> add_cluster_flags(CLI::App& app, ClusterConfig* c,
                                           std::vector<CLI::Option*>* options);

}  // namespace agentbox::cluster
