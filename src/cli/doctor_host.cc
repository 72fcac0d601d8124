// `agentbox doctor`: the facts of this host (syscalls probed with harmless arguments, /proc,
// /sys/fs/cgroup, statfs of the data dir, `nft list tables`) and the HTTP probes. Raw syscalls,
// not linux/: the CLI does not link the isolation code.

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/doctor.h"
#include "client/client.h"

namespace agentbox::cli::doctor {
namespace {

namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string w;
  while (ss >> w) out.push_back(w);
  return out;
}

bool has_cap_sys_admin() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      unsigned long long caps = std::strtoull(line.c_str() + 7, nullptr, 16);
      return (caps >> 21) & 1;  // CAP_SYS_ADMIN
    }
  }
  return false;
}

std::string fs_name(long type) {
  switch (static_cast<unsigned long>(type)) {
    case EXT4_SUPER_MAGIC: return "ext4";
    case XFS_SUPER_MAGIC: return "xfs";
    case BTRFS_SUPER_MAGIC: return "btrfs";
    case TMPFS_MAGIC: return "tmpfs";
    case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
    case NFS_SUPER_MAGIC: return "nfs";
    case 0x65735546: return "fuse";
    case 0xFF534D42: return "cifs";
    case 0xFE534D42: return "smb2";
    case 0x2FC12FC1: return "zfs";
    case F2FS_SUPER_MAGIC: return "f2fs";
    case PROC_SUPER_MAGIC: return "proc";
    case SYSFS_MAGIC: return "sysfs";
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(type));
      return buf;
    }
  }
}

// The path of a program: PATH, then the sbin dirs a non-root PATH may lack.
std::string find_program(const std::string& name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/bin:/bin";
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    std::string p = dir + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// Runs argv, returns (exit status, the first line of its combined output).
std::pair<int, std::string> run_quiet(const std::vector<std::string>& argv) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return {-1, "pipe failed"};
  pid_t pid = ::fork();
  if (pid < 0) return {-1, "fork failed"};
  if (pid == 0) {
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) {
    if (out.size() < 65536) out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (auto nl = out.find('\n'); nl != std::string::npos) out.resize(nl);
  return {rc, out};
}

}  // namespace

HostFacts gather_host_facts(const Target& t) {
  HostFacts h;
  struct utsname u {};
  if (::uname(&u) == 0) {
    h.kernel_release = u.release;
    std::sscanf(u.release, "%d.%d", &h.kernel_major, &h.kernel_minor);
  }
  h.root = ::geteuid() == 0 || has_cap_sys_admin();
  for (const char* ns : {"mnt", "pid", "ipc", "uts", "net", "cgroup", "user"}) {
    if (::access((std::string("/proc/self/ns/") + ns).c_str(), F_OK) != 0) {
      h.missing_ns.push_back(ns);
    }
  }
  if (std::string m = read_text("/proc/sys/user/max_user_namespaces"); !m.empty()) {
    h.max_user_namespaces = std::strtol(m.c_str(), nullptr, 10);
  }
  // Each syscall with arguments it refuses: ENOSYS only when the kernel lacks it.
  h.clone3 = !(::syscall(SYS_clone3, nullptr, 0) < 0 && errno == ENOSYS);
  {
    struct open_how how {};
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT;
    long fd = ::syscall(SYS_openat2, AT_FDCWD, "/", &how, sizeof how);
    h.openat2 = fd >= 0;
    if (fd >= 0) ::close(static_cast<int>(fd));
  }
  h.mount_setattr = !(::syscall(SYS_mount_setattr, -1, "", 0, nullptr, 0) < 0 && errno == ENOSYS);
  h.seccomp = !(::prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0 && errno == EINVAL);
  {
    std::string fss = read_text("/proc/filesystems");
    h.overlayfs = fss.find("\toverlay\n") != std::string::npos;
    std::error_code ec;
    const std::string mods = "/lib/modules/" + h.kernel_release;
    h.overlayfs_module = fs::exists(mods + "/kernel/fs/overlayfs", ec) ||
                         read_text(mods + "/modules.builtin").find("overlay") != std::string::npos;
  }
  for (const std::string cand : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    std::error_code ec;
    if (!fs::exists(cand + "/cgroup.controllers", ec)) continue;
    h.cgroup2_root = cand;
    h.cgroup2_controllers = words(read_text(cand + "/cgroup.controllers"));
    h.cgroup2_subtree = words(read_text(cand + "/cgroup.subtree_control"));
    h.cgroup2_nested = fs::exists(cand + "/cgroup.type", ec);
    h.cgroup2_root_procs = words(read_text(cand + "/cgroup.procs")).size();
    break;
  }
  for (const char* c : {"memory", "cpu", "pids", "freezer"}) {
    std::error_code ec;
    if (fs::exists(std::string("/sys/fs/cgroup/") + c + "/cgroup.procs", ec)) {
      h.cgroup1_controllers.push_back(c);
    }
  }
  h.nft_path = find_program("nft");
  if (!h.nft_path.empty()) {
    auto [rc, line] = run_quiet({h.nft_path, "list", "tables"});
    h.nft_works = rc == 0;
    if (rc != 0) h.nft_error = line.empty() ? "exit " + std::to_string(rc) : line;
  }
  {
    std::error_code ec;
    fs::path p = fs::absolute(t.data_dir, ec);
    h.data_dir_exists = fs::is_directory(p, ec);
    while (!p.empty() && !fs::exists(p, ec) && p != p.root_path()) p = p.parent_path();
    h.data_dir_checked = p.string();
    struct statfs sf {};
    struct statvfs sv {};
    if (::statfs(p.c_str(), &sf) == 0 && ::statvfs(p.c_str(), &sv) == 0) {
      h.fs_type = fs_name(static_cast<long>(sf.f_type));
      h.free_bytes = static_cast<std::uint64_t>(sv.f_bavail) * sv.f_frsize;
      h.data_dir_writable = !(sv.f_flag & ST_RDONLY) && ::access(p.c_str(), W_OK) == 0;
    }
  }
  {
    std::error_code ec;
    fs::path self = fs::read_symlink("/proc/self/exe", ec);
    h.init_path = (self.parent_path() / "agentbox-init").string();
    h.init_ok = ::access(h.init_path.c_str(), X_OK) == 0;
  }
  return h;
}

HttpProbe probe_http(const std::string& base, const std::string& path, const std::string& token) {
  HttpProbe p;
  p.url = base + path;
  client::ClientOptions o;
  o.server = base;
  o.token = token;
  o.timeout = std::chrono::seconds(3);
  client::Client c(o);
  auto r = c.request("GET", path);
  if (!r) {
    p.error = r.error().message;
    return p;
  }
  p.status = r->status;
  p.body = r->body;
  return p;
}

}  // namespace agentbox::cli::doctor
