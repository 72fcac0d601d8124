// The host dirs every isolated box sees read-only (config readonly_dirs; seed 001's
// /mnt/shared-readonly), declared in server/config.h.

#include <algorithm>
#include <filesystem>

#include "server/config.h"

namespace agentbox::server {

std::vector<std::string> effective_readonly_dirs(
    const DaemonConfig& c, const std::function<bool(const std::string&)>& is_dir) {
  auto exists = [&](const std::string& d) {
    std::error_code ec;
    return is_dir ? is_dir(d) : std::filesystem::is_directory(d, ec);
  };
  std::vector<std::string> out;
  if (c.readonly_dirs) {
    out = *c.readonly_dirs;
  } else if (exists("/opt")) {
    out = {"/opt"};
  }
  const bool seed_mode = c.seed.multi_agent || !c.seed.workdir.empty();
  if (seed_mode && exists(kSeedSharedReadonly) &&
      std::find(out.begin(), out.end(), kSeedSharedReadonly) == out.end()) {
    out.push_back(kSeedSharedReadonly);
  }
  return out;
}

}  // namespace agentbox::server
