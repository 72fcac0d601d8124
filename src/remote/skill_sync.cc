#include "remote/skill_sync.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "runner/protocol.h"

namespace agentbox::remote {
namespace {

namespace fs = std::filesystem;
namespace proto = runner::proto;
using namespace std::chrono_literals;

constexpr std::uintmax_t kMaxSyncedFile = 16u << 20;

// Copies the tree `src` to the runner's `dst` (mkdir_all + write_file per file). Symlinks and
// special files are skipped; so are files over kMaxSyncedFile. Returns how many files went over.
Result<std::size_t> sync_tree(RunnerConn* conn, const fs::path& src, const std::string& dst) {
  std::size_t files = 0;
  const std::uint32_t dir_perm = proto::go_perm_from_mode(0755);
  auto st = conn->call("mkdir_all", proto::to_json(proto::MkdirAllRequest{dst, dir_perm}), 30s);
  if (!st) return std::unexpected(st.error());
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(src, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    const fs::directory_entry& e = *it;
    std::string rel = fs::relative(e.path(), src, ec).string();
    if (ec) break;
    std::string target = dst + "/" + rel;
    if (e.is_symlink(ec)) continue;
    if (e.is_directory(ec)) {
      auto r =
          conn->call("mkdir_all", proto::to_json(proto::MkdirAllRequest{target, dir_perm}), 30s);
      if (!r) return std::unexpected(r.error());
    } else if (e.is_regular_file(ec) && e.file_size(ec) <= kMaxSyncedFile) {
      std::ifstream in(e.path(), std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      proto::WriteFileRequest w{target, ss.str(), proto::go_perm_from_mode(0644)};
      auto r = conn->call("write_file", proto::to_json(w), 60s);
      if (!r) return std::unexpected(r.error());
      ++files;
    }
  }
  return files;
}

}  // namespace

void sync_to_runner(const std::shared_ptr<RunnerConn>& conn, const std::string& skills_dir,
                    const std::string& agents_dir) {
  const std::string ws = conn->identity().workspace;
  std::error_code ec;
  std::size_t files = 0;
  if (!skills_dir.empty() && fs::is_directory(skills_dir, ec)) {
    for (const auto& d : fs::directory_iterator(skills_dir, ec)) {
      if (!d.is_directory() || d.is_symlink() || !fs::is_regular_file(d.path() / "SKILL.md")) {
        continue;
      }
      auto n = sync_tree(conn.get(), d.path(), ws + "/.skills/" + d.path().filename().string());
      if (!n) {
        spdlog::warn("runner {}: syncing skill {}: {}", conn->identity().user,
                     d.path().filename().string(), n.error().message);
        return;
      }
      files += *n;
    }
  }
  if (!agents_dir.empty() && fs::is_directory(agents_dir, ec)) {
    auto n = sync_tree(conn.get(), agents_dir, ws + "/.agents");
    if (!n) {
      spdlog::warn("runner {}: syncing agents: {}", conn->identity().user, n.error().message);
      return;
    }
    files += *n;
  }
  if (files > 0)
    spdlog::info("runner {}: synced {} skill/agent files", conn->identity().user, files);
}

}  // namespace agentbox::remote
