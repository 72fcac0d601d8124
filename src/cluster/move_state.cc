#include "cluster/move_state.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/unique_fd.h"

namespace agentbox::cluster {
namespace {

using json = nlohmann::json;

Status make_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return fail_errno(errno, "mkdir(" + dir + ")");
  }
  return {};
}

void sync_dir(const std::string& dir) {
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d) ::fsync(d.get());
}

std::string moving(const std::string& data_dir) {
  return data_dir + "/moving";
}
std::string incoming(const std::string& data_dir) {
  return data_dir + "/incoming";
}

}  // namespace

Status write_move_journal(const std::string& data_dir, const std::string& id,
                          const MoveJournal& j) {
  const std::string dir = moving(data_dir);
  AB_TRY(make_dir(dir));
  const std::string text = json{{"to", j.to},     {"old", j.old_value}, {"moved", j.moved_value},
                                {"spec", j.spec}, {"tenant", j.tenant}, {"archive", j.archive}}
                               .dump();
  const std::string path = dir + "/" + id, tmp = path + ".tmp";
  {
    UniqueFd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!f) return fail_errno(errno, "open(" + tmp + ")");
    if (::write(f.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
        ::fsync(f.get()) != 0) {
      return fail_errno(errno, "write(" + tmp + ")");
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail_errno(errno, "rename(" + tmp + ")");
  sync_dir(dir);
  return {};
}

Result<MoveJournal> read_move_journal(const std::string& data_dir, const std::string& id) {
  const std::string path = moving(data_dir) + "/" + id;
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  auto j = json::parse(ss.str(), nullptr, false);
  if (!f || !j.is_object()) return fail(Code::kInternal, path + ": not a move journal");
  MoveJournal out;
  out.to = j.value("to", "");
  out.old_value = j.value("old", "");
  out.moved_value = j.value("moved", "");
  out.spec = j.value("spec", "");
  out.tenant = j.value("tenant", "");
  out.archive = j.value("archive", "");
  return out;
}

void remove_move_journal(const std::string& data_dir, const std::string& id) {
  ::unlink((moving(data_dir) + "/" + id).c_str());
}

bool has_move_journal(const std::string& data_dir, const std::string& id) {
  return ::access((moving(data_dir) + "/" + id).c_str(), F_OK) == 0;
}

std::vector<std::string> move_journals(const std::string& data_dir) {
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(moving(data_dir), ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".tmp")) {
      ::unlink(e.path().c_str());
    } else {
      ids.push_back(name);
    }
  }
  return ids;
}

Status mark_incoming(const std::string& data_dir, const std::string& id) {
  const std::string dir = incoming(data_dir), mark = dir + "/" + id;
  AB_TRY(make_dir(dir));
  UniqueFd f(::open(mark.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!f || ::fsync(f.get()) != 0) return fail_errno(errno, "open(" + mark + ")");
  sync_dir(dir);
  return {};
}

Status unmark_incoming(const std::string& data_dir, const std::string& id) {
  const std::string mark = incoming(data_dir) + "/" + id;
  if (::unlink(mark.c_str()) != 0 && errno != ENOENT)
    return fail_errno(errno, "unlink(" + mark + ")");
  return {};
}

bool is_incoming(const std::string& data_dir, const std::string& id) {
  return ::access((incoming(data_dir) + "/" + id).c_str(), F_OK) == 0;
}

Status write_spec_sidecar(const std::string& archive, const std::string& spec) {
  const std::string path = archive + ".spec.json";
  UniqueFd s(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!s || ::write(s.get(), spec.data(), spec.size()) != static_cast<ssize_t>(spec.size())) {
    return fail_errno(errno, "write(" + path + ")");
  }
  return {};
}

Status remove_archive(const std::string& archive) {
  ::unlink((archive + ".mounts.json").c_str());
  ::unlink((archive + ".spec.json").c_str());
  if (::unlink(archive.c_str()) != 0 && errno != ENOENT) {
    return fail_errno(errno, "unlink(" + archive + ")");
  }
  return {};
}

std::string newest_archive(const std::string& dir, const std::string& id) {
  std::string best;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(id + "-", 0) != 0 || !name.ends_with(".tar.zst")) continue;
    if (name.find("-moved-") != std::string::npos) continue;  // a received one
    if (name > best) best = name;  // <id>-<UTC time>: the newest sorts last
  }
  return best.empty() ? best : dir + "/" + best;
}

std::string archive_of_move(const std::string& data_dir, const std::string& archives,
                            const std::string& id) {
  const std::string newest = newest_archive(archives, id);
  struct stat a {
  }, j{};
  if (newest.empty() || ::stat(newest.c_str(), &a) != 0 ||
      ::stat((moving(data_dir) + "/" + id).c_str(), &j) != 0) {
    return {};
  }
  const auto ns = [](const struct timespec& t) {
    return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
  };
  return ns(a.st_mtim) >= ns(j.st_mtim) ? newest : std::string();
}

}  // namespace agentbox::cluster
