// Shared cgroup plumbing (file I/O, tree walks, the pidfd-pinned kill) and driver detection.
// The drivers themselves are in cgroup_v1.cc and cgroup_v2.cc.
#include "linux/cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <sstream>
#include <thread>

#include "common/unique_fd.h"
#include "linux/internal/cgroup_fs.h"
#include "linux/sys.h"

namespace agentbox::linux {
namespace detail {
namespace {

class RealCgroupFs final : public CgroupFs {
 public:
  int make_dir(const std::string& path) override {
    return ::mkdir(path.c_str(), 0755) == 0 ? 0 : errno;
  }
  int remove_dir(const std::string& path) override {
    return ::rmdir(path.c_str()) == 0 ? 0 : errno;
  }
};

// A pid listed in a cgroup.procs file; the kernel writes one decimal pid per line.
Status parse_pids(std::string_view text, const std::string& path, std::vector<pid_t>& out) {
  while (!text.empty()) {
    std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (line.empty()) continue;
    pid_t pid = 0;
    auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), pid);
    if (ec != std::errc{} || p != line.data() + line.size() || pid <= 0) {
      return fail(Code::kInternal, "parse(" + path + "): not a pid: " + std::string(line));
    }
    out.push_back(pid);
  }
  return {};
}

}  // namespace

std::shared_ptr<CgroupFs> real_cgroup_fs() {
  static const std::shared_ptr<CgroupFs> fs = std::make_shared<RealCgroupFs>();
  return fs;
}

Status write_file(const std::string& path, std::string_view value) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC));
  if (!fd) return fail_errno(errno, "open(" + path + ")");
  ssize_t n;
  do {
    n = ::write(fd.get(), value.data(), value.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) return fail_errno(errno, "write(" + path + ", \"" + std::string(value) + "\")");
  if (static_cast<std::size_t>(n) != value.size()) {
    return fail(Code::kInternal, "write(" + path + "): short write");
  }
  return {};
}

Status move_process(const std::string& procs, pid_t pid) {
  auto st = write_file(procs, std::to_string(pid));
  if (!st && st.error().sys_errno == ESRCH) st.error().code = Code::kNotFound;
  return st;
}

Result<std::string> read_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return fail_errno(errno, "open(" + path + ")");
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "read(" + path + ")");
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

Result<std::uint64_t> read_u64(const std::string& path) {
  auto text = read_file(path);
  if (!text) return std::unexpected(std::move(text.error()));
  std::uint64_t v = 0;
  const char* end = text->data() + text->size();
  auto [p, ec] = std::from_chars(text->data(), end, v);
  if (ec != std::errc{} || (p != end && *p != '\n' && *p != ' ')) {
    return fail(Code::kInternal, "parse(" + path + "): not a number: " + *text);
  }
  return v;
}

Result<std::uint64_t> read_keyed_u64(const std::string& path, std::string_view key) {
  auto text = read_file(path);
  if (!text) {
    if (text.error().sys_errno == ENOENT) return fail(Code::kNotFound, "no file " + path);
    return std::unexpected(std::move(text.error()));
  }
  std::string_view rest = *text;
  while (!rest.empty()) {
    const std::size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (line.size() <= key.size() || !line.starts_with(key) || line[key.size()] != ' ') continue;
    std::string_view num = line.substr(key.size() + 1);
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
    if (ec != std::errc{} || p != num.data() + num.size()) {
      return fail(Code::kInternal, "parse(" + path + "): " + std::string(line));
    }
    return v;
  }
  return fail(Code::kNotFound, "no '" + std::string(key) + "' in " + path);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

Result<std::vector<std::string>> subdirs(const std::string& dir) {
  std::vector<std::string> names;
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return names;
    return fail_errno(errno, "open(" + dir + ")");
  }
  auto entries = sys::read_dir(fd.get(), dir);
  if (!entries) return std::unexpected(std::move(entries.error()));
  for (const sys::DirEntry& e : *entries) {
    // cgroupfs and tmpfs both fill d_type; DT_UNKNOWN is handled for other test filesystems.
    bool is_dir = e.type == DT_DIR;
    if (e.type == DT_UNKNOWN) {
      struct stat st;
      is_dir =
          ::fstatat(fd.get(), e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    if (is_dir) names.push_back(e.name);
  }
  return names;
}

Status collect_pids(const std::string& dir, std::vector<pid_t>& out) {
  const std::string procs = join(dir, "cgroup.procs");
  auto text = read_file(procs);
  if (!text) {
    // A child cgroup removed while we walk is not an error: it holds no pids any more.
    if (text.error().sys_errno == ENOENT) return {};
    return std::unexpected(std::move(text.error()));
  }
  if (auto st = parse_pids(*text, procs, out); !st) return st;
  auto kids = subdirs(dir);
  if (!kids) return std::unexpected(std::move(kids.error()));
  for (const auto& k : *kids) {
    if (auto st = collect_pids(join(dir, k), out); !st) return st;
  }
  return {};
}

Status make_dir(CgroupFs& fs, const std::string& path, bool ok_if_exists) {
  int err = fs.make_dir(path);
  if (err == 0 || (err == EEXIST && ok_if_exists)) return {};
  return fail_errno(err, "mkdir(" + path + ")");
}

Status remove_tree(CgroupFs& fs, const std::string& dir,
                   std::chrono::steady_clock::time_point deadline) {
  auto kids = subdirs(dir);
  if (!kids) return std::unexpected(std::move(kids.error()));
  for (const auto& k : *kids) {
    if (auto st = remove_tree(fs, join(dir, k), deadline); !st) return st;
  }
  for (;;) {
    int err = fs.remove_dir(dir);
    if (err == 0 || err == ENOENT) return {};
    // A task that got SIGKILL is removed from its cgroup only when it has finished exiting, which
    // on a loaded machine may be a few ms after the cgroup.procs read that saw it gone.
    if (err != EBUSY || std::chrono::steady_clock::now() >= deadline) {
      return fail_errno(err, "rmdir(" + dir + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void kill_listed(const std::vector<pid_t>& pids, const std::vector<std::string>& dirs) {
  // SECURITY: a pid number from cgroup.procs may be reaped (by a parent outside the cgroup) and
  // reused by an unrelated host process before we signal it. Pin each process with a pidfd
  // first, then re-list: a pid still listed after pinning is either the pinned process, or a
  // reuse that is itself in the cgroup (then the pidfd refers to the dead one and gets ESRCH).
  struct Pinned {
    pid_t pid;
    UniqueFd fd;
  };
  std::vector<Pinned> pinned;
  pinned.reserve(pids.size());
  bool have_pidfd = true;
  for (pid_t pid : pids) {
    UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));  // pidfds are always CLOEXEC
    if (!fd && errno == ENOSYS) have_pidfd = false;  // Linux < 5.3: plain kill() below
    if (fd || !have_pidfd) pinned.push_back({pid, std::move(fd)});
  }
  if (pinned.empty()) return;
  std::vector<pid_t> now;
  for (const auto& d : dirs) (void)collect_pids(d, now);  // best effort: a failure kills nothing
  sort_unique(now);
  for (const auto& p : pinned) {
    if (!std::binary_search(now.begin(), now.end(), p.pid)) continue;
    if (p.fd) {
      (void)::syscall(SYS_pidfd_send_signal, p.fd.get(), SIGKILL, nullptr, 0);
    } else {
      ::kill(p.pid, SIGKILL);  // re-listed just now: the reuse window is as small as it gets
    }
  }
}

bool contains_word(std::string_view text, std::string_view word) {
  std::size_t pos = 0;
  while ((pos = text.find(word, pos)) != std::string_view::npos) {
    std::size_t end = pos + word.size();
    bool starts = pos == 0 || text[pos - 1] == ' ' || text[pos - 1] == '\n';
    bool ends = end == text.size() || text[end] == ' ' || text[end] == '\n';
    if (starts && ends) return true;
    pos = end;
  }
  return false;
}

void sort_unique(std::vector<pid_t>& pids) {
  std::sort(pids.begin(), pids.end());
  pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
}

bool valid_name(std::string_view name, std::size_t max_len) {
  if (name.empty() || name.size() > max_len || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

bool valid_parent(std::string_view parent) {
  if (parent.empty()) return false;
  for (;;) {
    std::size_t slash = parent.find('/');
    if (!valid_name(parent.substr(0, slash), 255)) return false;
    if (slash == std::string_view::npos) return true;
    parent.remove_prefix(slash + 1);
  }
}

std::string join(const std::string& dir, std::string_view name) {
  std::string out = dir;
  if (out.empty() || out.back() != '/') out += '/';
  out += name;
  return out;
}

}  // namespace detail

namespace {

// Appends to missing the words of `words` that text lacks.
bool has_words(const std::string& text, std::initializer_list<std::string_view> words,
               std::string& missing) {
  for (auto w : words) {
    if (!detail::contains_word(text, w)) {
      if (!missing.empty()) missing += ',';
      missing += w;
    }
  }
  return missing.empty();
}

}  // namespace

Result<std::unique_ptr<CgroupDriver>> detect_cgroup_driver(const std::string& root,
                                                           std::string parent) {
  if (!detail::valid_parent(parent)) {
    return fail(Code::kInvalid, "cgroup parent \"" + parent + "\": not a relative path of names");
  }
  std::string why;
  // Pure v2 (cgroup2 at the root) first, then the hybrid layout's unified mount.
  for (const std::string& cand : {root, detail::join(root, "unified")}) {
    const std::string ctl = detail::join(cand, "cgroup.controllers");
    auto text = detail::read_file(ctl);
    if (!text) continue;
    std::string missing;
    if (has_words(*text, {"memory", "cpu", "pids"}, missing)) {
      return make_cgroup_v2_driver(cand, std::move(parent));
    }
    why += "cgroup2 at " + cand + " lacks controllers " + missing + "; ";
  }
  std::string missing;
  for (std::string_view c : {"memory", "cpu", "pids", "freezer"}) {
    if (!detail::exists(detail::join(detail::join(root, c), "cgroup.procs"))) {
      if (!missing.empty()) missing += ',';
      missing += c;
    }
  }
  if (missing.empty()) return make_cgroup_v1_driver(root, std::move(parent));
  why += "cgroup v1 hierarchies not mounted under " + root + ": " + missing;
  return fail(Code::kUnavailable, "no usable cgroup hierarchy: " + why);
}

std::uint64_t proc_tree_cpu_usec(const std::vector<pid_t>& pids) {
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  std::uint64_t total_ticks = 0;
  for (pid_t pid : pids) {
    auto stat = detail::read_file("/proc/" + std::to_string(pid) + "/stat");
    if (!stat) continue;
    // After "pid (comm) ", whose comm may hold spaces and parentheses: the fields from the
    // state (field 3) on; utime..cstime are fields 14-17.
    const std::size_t close = stat->rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream in(stat->substr(close + 1));
    std::string field;
    for (int i = 3; i <= 13; ++i) in >> field;
    for (int i = 14; i <= 17; ++i) {
      std::uint64_t v = 0;
      if (!(in >> v)) break;
      total_ticks += v;
    }
  }
  return ticks > 0 ? total_ticks * 1000000 / static_cast<std::uint64_t>(ticks) : 0;
}

}  // namespace agentbox::linux
