// The `cluster:` configuration (config.h ClusterConfig): YAML, flags, checks and the secret.

#include "cluster/config_yaml.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <sstream>

#include "common/validate.h"

namespace agentbox::cluster {
namespace {

// "a,b" and repeated values alike.
std::vector<std::string> split_endpoints(const std::vector<std::string>& in) {
  std::vector<std::string> out;
  for (const auto& v : in) {
    std::stringstream ss(v);
    std::string part;
    while (std::getline(ss, part, ',')) {
      if (!part.empty()) out.push_back(part);
    }
  }
  return out;
}

bool valid_node_name(std::string_view n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(), [](char ch) {
    auto c = static_cast<unsigned char>(ch);
    return std::isalnum(c) || c == '.' || c == '_' || c == '-';
  });
}

// "http://host:port" (or https:// with `https_too`) without a path.
Status check_http_url(std::string_view url, const std::string& key, bool https_too = false) {
  const std::string_view scheme = url.rfind("https://", 0) == 0 ? "https://" : "http://";
  const std::string form = https_too ? "http(s)://host:port" : "http://host:port";
  if (url.rfind(scheme, 0) != 0 || (scheme == "https://" && !https_too)) {
    return fail(Code::kInvalid, key + " '" + std::string(url) + "' must be " + form);
  }
  std::string_view rest = url.substr(scheme.size());
  auto colon = rest.rfind(':');
  if (rest.empty() || rest.find('/') != std::string_view::npos || colon == std::string_view::npos ||
      colon + 1 == rest.size() ||
      !std::all_of(rest.begin() + static_cast<long>(colon) + 1, rest.end(),
                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    return fail(Code::kInvalid, key + " '" + std::string(url) + "' must be " + form);
  }
  return {};
}

// The TLS files of an https:// etcd: readable, a cert with its key, none without https.
Status check_etcd_tls(const ClusterConfig& c) {
  const bool https = std::any_of(c.etcd.begin(), c.etcd.end(),
                                 [](const std::string& e) { return e.rfind("https://", 0) == 0; });
  const std::pair<const char*, const std::string*> files[] = {
      {"cluster.etcd_ca_file", &c.etcd_ca_file},
      {"cluster.etcd_cert_file", &c.etcd_cert_file},
      {"cluster.etcd_key_file", &c.etcd_key_file}};
  for (const auto& [key, path] : files) {
    if (path->empty()) continue;
    if (!https) {
      return fail(Code::kInvalid,
                  std::string(key) + " is for TLS to etcd: the cluster.etcd endpoints are http://");
    }
    if (::access(path->c_str(), R_OK) != 0) {
      return fail_errno(errno, std::string(key) + " '" + *path + "'");
    }
  }
  if (c.etcd_cert_file.empty() != c.etcd_key_file.empty()) {
    return fail(Code::kInvalid,
                "cluster.etcd_cert_file and cluster.etcd_key_file go together (a client "
                "certificate and its key)");
  }
  return {};
}

}  // namespace

Status load_cluster_yaml(const YAML::Node& node, const std::string& file, ClusterConfig* c,
                         const std::function<bool(std::string_view)>& given) {
  if (!node.IsMap()) {
    return fail(Code::kInvalid, "config " + file +
                                    ": cluster must be a mapping {etcd, node, advertise, "
                                    "lease_sec, secret_file, etcd_ca_file, etcd_cert_file, "
                                    "etcd_key_file}");
  }
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (given("cluster." + key)) continue;
    if (key == "etcd") {
      std::vector<std::string> raw;
      if (kv.second.IsSequence()) {
        for (const auto& e : kv.second) raw.push_back(e.as<std::string>());
      } else {
        raw.push_back(kv.second.as<std::string>());
      }
      c->etcd = split_endpoints(raw);
    } else if (key == "node") {
      c->node = kv.second.as<std::string>();
    } else if (key == "advertise") {
      c->advertise = kv.second.as<std::string>();
    } else if (key == "lease_sec") {
      c->lease_sec = kv.second.as<int>();
    } else if (key == "secret_file") {
      c->secret_file = kv.second.as<std::string>();
    } else if (key == "etcd_ca_file") {
      c->etcd_ca_file = kv.second.as<std::string>();
    } else if (key == "etcd_cert_file") {
      c->etcd_cert_file = kv.second.as<std::string>();
    } else if (key == "etcd_key_file") {
      c->etcd_key_file = kv.second.as<std::string>();
    } else {
      return fail(Code::kInvalid, "config " + file + ": cluster: unknown key '" + key + "'");
    }
  }
  return {};
}

std::vector<std::string> add_cluster_flags(CLI::App& app, ClusterConfig* c,
                                           std::vector<CLI::Option*>* options) {
  constexpr auto take_last = CLI::MultiOptionPolicy::TakeLast;
  auto* etcd = app.add_option_function<std::vector<std::string>>(
      "--cluster-etcd", [c](const std::vector<std::string>& v) { c->etcd = split_endpoints(v); },
      "Cluster mode: etcd endpoints (http://host:port, comma-separated or repeated)");
  options->push_back(etcd);
  options->push_back(app.add_option("--node-name", c->node,
                                    "Cluster mode: this node's name (default: the host name)")
                         ->multi_option_policy(take_last));
  options->push_back(
      app.add_option("--advertise-url", c->advertise,
                     "Cluster mode: http://host:port the other nodes reach this one at")
          ->multi_option_policy(take_last));
  options->push_back(app.add_option("--cluster-lease-sec", c->lease_sec,
                                    "Cluster mode: membership lease (a dead node's sessions are "
                                    "503 within this + 2 s; default 10)")
                         ->multi_option_policy(take_last));
  options->push_back(app.add_option("--cluster-secret-file", c->secret_file,
                                    "Cluster mode: file holding the nodes' shared secret")
                         ->multi_option_policy(take_last));
  options->push_back(app.add_option("--cluster-etcd-ca", c->etcd_ca_file,
                                    "Cluster mode, https:// etcd: the CA file (PEM) its "
                                    "certificate is checked against (default: the system's)")
                         ->multi_option_policy(take_last));
  options->push_back(app.add_option("--cluster-etcd-cert", c->etcd_cert_file,
                                    "Cluster mode, https:// etcd: this node's client "
                                    "certificate (PEM), with --cluster-etcd-key")
                         ->multi_option_policy(take_last));
  options->push_back(app.add_option("--cluster-etcd-key", c->etcd_key_file,
                                    "Cluster mode, https:// etcd: the client certificate's key "
                                    "(PEM)")
                         ->multi_option_policy(take_last));
  return {"cluster.etcd",           "cluster.node",         "cluster.advertise",
          "cluster.lease_sec",      "cluster.secret_file",  "cluster.etcd_ca_file",
          "cluster.etcd_cert_file", "cluster.etcd_key_file"};
}

Status check_cluster(const ClusterConfig& c) {
  if (!c.enabled()) {
    if (!c.advertise.empty() || !c.secret_file.empty()) {
      return fail(Code::kInvalid,
                  "cluster.advertise and cluster.secret_file need cluster.etcd (--cluster-etcd)");
    }
    return {};
  }
  for (const auto& e : c.etcd) {
    if (auto st = check_http_url(e, "cluster.etcd", /*https_too=*/true); !st) return st;
  }
  if (auto st = check_etcd_tls(c); !st) return st;
  if (!c.node.empty() && !valid_node_name(c.node)) {
    return fail(Code::kInvalid,
                "cluster.node " + validate::quote(c.node) + " must match [A-Za-z0-9._-]{1,64}");
  }
  if (c.advertise.empty()) {
    return fail(Code::kInvalid,
                "cluster.advertise (--advertise-url) is required in cluster mode: the "
                "http://host:port the other nodes reach this one at");
  }
  if (auto st = check_http_url(c.advertise, "cluster.advertise"); !st) return st;
  if (c.lease_sec < 1 || c.lease_sec > 3600) {
    return fail(Code::kInvalid, "cluster.lease_sec must be between 1 and 3600");
  }
  if (c.secret_file.empty()) {
    return fail(Code::kInvalid,
                "cluster.secret_file (--cluster-secret-file) is required in cluster mode");
  }
  return {};
}

Result<std::string> read_cluster_secret(const ClusterConfig& c) {
  std::ifstream in(c.secret_file, std::ios::binary);
  if (!in) return fail(Code::kInvalid, "cluster.secret_file '" + c.secret_file + "': cannot read");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.size() < 16) {
    return fail(Code::kInvalid,
                "cluster.secret_file '" + c.secret_file + "' must hold at least 16 bytes");
  }
  return s;
}

}  // namespace agentbox::cluster
