// The config digest of GET /v1/cluster (config.h config_digest).

#include <algorithm>

#include "cluster/forward_auth.h"
#include "server/config.h"

namespace agentbox::server {

std::string config_digest(const DaemonConfig& c) {
  // Tenants sorted by name, each with its admin flag, session cap and its tokens' hashes (never
  // the tokens themselves).
  std::vector<TenantConfig> tenants = effective_tenants(c);
  std::sort(tenants.begin(), tenants.end(),
            [](const TenantConfig& a, const TenantConfig& b) { return a.name < b.name; });
  std::string canon;
  for (const auto& t : tenants) {
    canon += t.name + "|" + (t.admin ? "1" : "0") + "|" + std::to_string(t.max_sessions) + "|";
    std::vector<std::string> toks;
    for (const auto& tok : t.tokens) toks.push_back(cluster::sha256_hex(tok));
    std::sort(toks.begin(), toks.end());
    for (const auto& h : toks) canon += h + ",";
    canon += "\n";
  }
  return "sha256:" + cluster::sha256_hex(canon).substr(0, 16);
}

}  // namespace agentbox::server
