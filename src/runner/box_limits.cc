#include "runner/box_limits.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

namespace agentbox::runner {
namespace {

namespace p = proto;

bool has_token(const std::string& list, std::string_view word, char sep) {
  std::size_t i = 0;
  while (i <= list.size()) {
    std::size_t j = list.find(sep, i);
    if (j == std::string::npos) j = list.size();
    if (std::string_view(list).substr(i, j - i) == word) return true;
    i = j + 1;
  }
  return false;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

Status write_text(const std::string& path, const std::string& text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) return fail_errno(errno, "open(" + path + ")");
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return fail_errno(errno, "write(" + path + ", " + text + ")");
  }
  return {};
}

Status make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return fail_errno(errno, "mkdir(" + path + ")");
  }
  return {};
}

// Kills what is in the cgroup at `dir` and removes it (waiting up to 2 s for the kills).
void remove_cgroup(const std::string& dir) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return;
    if (errno != EBUSY || std::chrono::steady_clock::now() > until) return;
    std::istringstream procs(read_text(dir + "/cgroup.procs"));
    for (pid_t pid; procs >> pid;) {
      if (pid > 1) ::kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<std::string> subdirs(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (e->d_type == DT_DIR && name != "." && name != "..") out.push_back(dir + "/" + name);
  }
  ::closedir(d);
  return out;
}

}  // namespace

BoxCgroups::BoxCgroups() {
  if (::geteuid() != 0) return;
  std::ifstream mounts("/proc/self/mounts");
  std::string v2_root, memory, pids;
  for (std::string line; std::getline(mounts, line);) {
    std::istringstream in(line);
    std::string dev, dir, type, opts;
    if (!(in >> dev >> dir >> type >> opts)) continue;
    if (type == "cgroup2" && v2_root.empty()) {
      const std::string controllers = read_text(dir + "/cgroup.controllers");
      if (has_token(controllers, "memory", ' ') && has_token(controllers, "pids", ' ')) {
        v2_root = dir;
      }
    } else if (type == "cgroup") {
      if (has_token(opts, "memory", ',') && memory.empty()) memory = dir;
      if (has_token(opts, "pids", ',') && pids.empty()) pids = dir;
    }
  }
  const std::string name = "/agentbox-runner-" + std::to_string(::getpid());
  if (!v2_root.empty()) {
    v2_ = true;
    parents_ = {v2_root + name};
  } else if (!memory.empty() && !pids.empty()) {
    parents_ = {memory + name, pids + name};
    memsw_ = exists(memory + "/memory.memsw.limit_in_bytes");
  }
}

std::vector<std::string> BoxCgroups::enforces() const {
  std::vector<std::string> out = {std::string(p::enforce::kTimeout),
                                  std::string(p::enforce::kOutputCap)};
  if (!parents_.empty()) {
    out.emplace_back(p::enforce::kMemoryMb);
    out.emplace_back(p::enforce::kMaxPids);
  }
  return out;
}

std::vector<std::string> BoxCgroups::box_dirs(const std::string& box) const {
  std::vector<std::string> out;
  for (const auto& parent : parents_) out.push_back(parent + "/" + box);
  return out;
}

Result<std::vector<UniqueFd>> BoxCgroups::acquire(const p::BoxLimits& limits) {
  std::vector<UniqueFd> fds;
  if (limits.limits.empty()) return fds;
  for (const auto& [name, value] : limits.limits) {
    (void)value;
    const bool known = name == p::enforce::kMemoryMb || name == p::enforce::kMaxPids;
    if (!known || parents_.empty()) {
      return fail(Code::kNotSupported,
                  "limits." + name + ": this runner does not enforce it" +
                      (known ? " (it needs root and the memory and pids cgroup controllers)" : ""));
    }
  }
  if (limits.box.empty()) return fail(Code::kInvalid, "limits without a box");
  auto value = [&](std::string_view name) -> std::optional<std::uint64_t> {
    auto it = limits.limits.find(std::string(name));
    if (it == limits.limits.end()) return std::nullopt;
    return it->second;
  };
  const auto mem = value(p::enforce::kMemoryMb);
  const auto pids = value(p::enforce::kMaxPids);
  std::lock_guard lk(mu_);
  if (!made_parents_) {
    if (v2_) {
      // The controllers reach our parent's children only when enabled at each level above.
      const std::string root = parents_[0].substr(0, parents_[0].rfind('/'));
      (void)write_text(root + "/cgroup.subtree_control", "+memory +pids");
      AB_TRY(make_dir(parents_[0]));
      AB_TRY(write_text(parents_[0] + "/cgroup.subtree_control", "+memory +pids"));
    } else {
      for (const auto& dir : parents_) AB_TRY(make_dir(dir));
    }
    made_parents_ = true;
  }
  const std::vector<std::string> dirs = box_dirs(limits.box);
  for (const auto& dir : dirs) AB_TRY(make_dir(dir));
  const std::string bytes = mem ? std::to_string(*mem << 20) : std::string();
  if (v2_) {
    AB_TRY(write_text(dirs[0] + "/memory.max", mem ? bytes : "max"));
    // No swap beyond the limit: past it the box's commands are OOM-killed, not swapped out.
    if (exists(dirs[0] + "/memory.swap.max")) {
      (void)write_text(dirs[0] + "/memory.swap.max", mem ? "0" : "max");
    }
    AB_TRY(write_text(dirs[0] + "/pids.max", pids ? std::to_string(*pids) : "max"));
  } else {
    const std::string limit = mem ? bytes : "-1";
    // memsw >= limit at every step: memsw first when raising, the limit first when lowering.
    if (memsw_) (void)write_text(dirs[0] + "/memory.memsw.limit_in_bytes", limit);
    AB_TRY(write_text(dirs[0] + "/memory.limit_in_bytes", limit));
    if (memsw_) AB_TRY(write_text(dirs[0] + "/memory.memsw.limit_in_bytes", limit));
    AB_TRY(write_text(dirs[1] + "/pids.max", pids ? std::to_string(*pids) : "max"));
  }
  for (const auto& dir : dirs) {
    UniqueFd fd(::open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return fail_errno(errno, "open(" + dir + "/cgroup.procs)");
    fds.push_back(std::move(fd));
  }
  ++users_[limits.box];
  return fds;
}

void BoxCgroups::release(const std::string& box) {
  std::lock_guard lk(mu_);
  auto it = users_.find(box);
  if (it == users_.end() || --it->second > 0) return;
  users_.erase(it);
  // Its last command is reaped; what it left running in the background stays (and the dir).
  for (const auto& dir : box_dirs(box)) (void)::rmdir(dir.c_str());
}

void BoxCgroups::close() {
  std::lock_guard lk(mu_);
  if (!made_parents_) return;
  made_parents_ = false;
  users_.clear();
  for (const auto& parent : parents_) {
    for (const auto& dir : subdirs(parent)) remove_cgroup(dir);
    remove_cgroup(parent);
  }
}

}  // namespace agentbox::runner
