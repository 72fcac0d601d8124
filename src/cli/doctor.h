#pragma once
// `agentbox doctor`: checks that this host can run agentboxd as configured and says, for each
// thing missing, how to fix it. Three steps: the facts of the host are gathered
// (gather_host_facts: syscalls, /proc, /sys, statfs, `nft`), the daemon and etcd are asked over
// HTTP (probe_http), and evaluate() turns both into findings (pure, so tests can feed it any
// host). The exit code is non-zero when the configured default backend cannot run here.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace agentbox::cli::doctor {

// What the doctor checks against: agentboxd's YAML (listen, data_dir, backend, cluster.etcd,
// tokens[0]) overridden by the doctor's flags.
struct Target {
  std::string config_file;               // "" = none read
  std::string data_dir = "./.agentbox";  // agentboxd's own default
  std::string backend = "ns";
  std::string server;  // the daemon's URL; "" = from listen
  std::string listen = "127.0.0.1:9090";
  std::string token;
  std::vector<std::string> etcd;  // cluster mode when not empty
};

// Reads agentboxd's config file into `t` (only the keys above); an error names the file and
// what is wrong.
std::optional<std::string> load_target(const std::string& file, Target* t);
// http://listen, with 0.0.0.0 / [::] asked at loopback.
std::string server_of_listen(const std::string& listen);

struct HostFacts {
  std::string kernel_release;  // uname -r
  int kernel_major = 0;
  int kernel_minor = 0;
  bool root = false;                    // euid 0 or CAP_SYS_ADMIN
  std::vector<std::string> missing_ns;  // of mnt pid ipc uts net cgroup user
  long max_user_namespaces = -1;        // /proc/sys/user/max_user_namespaces; -1 unknown
  bool clone3 = false;
  bool openat2 = false;
  bool mount_setattr = false;  // the new mount API: idmapped mounts (5.12+)
  bool seccomp = false;
  bool overlayfs = false;         // in /proc/filesystems
  bool overlayfs_module = false;  // not yet loaded but loadable (overlay.ko under /lib/modules)
  // cgroup v2: the unified mount (/sys/fs/cgroup or /sys/fs/cgroup/unified) and its controllers.
  std::string cgroup2_root;
  std::vector<std::string> cgroup2_controllers;
  // Delegation: the controllers that root hands down (cgroup.subtree_control), whether it is
  // a namespace's root rather than the hierarchy's (it has cgroup.type: a container's own
  // cgroup namespace), and how many processes it holds. cgroup v2's no-internal-process rule
  // forbids handing controllers down from a non-root cgroup that holds processes.
  std::vector<std::string> cgroup2_subtree;
  bool cgroup2_nested = false;
  std::size_t cgroup2_root_procs = 0;
  // cgroup v1: which of memory, cpu, pids, freezer are mounted under /sys/fs/cgroup.
  std::vector<std::string> cgroup1_controllers;
  // nftables: the nft program and whether `nft list tables` works.
  std::string nft_path;
  bool nft_works = false;
  std::string nft_error;
  // The data dir (or, when missing, its nearest existing parent, where it would be made).
  bool data_dir_exists = false;
  std::string data_dir_checked;  // the path statfs'd
  bool data_dir_writable = false;
  std::uint64_t free_bytes = 0;
  std::string fs_type;  // "ext4", "xfs", "btrfs", "tmpfs", "overlayfs", "nfs", ...
  // agentbox-init, beside agentboxd.
  std::string init_path;
  bool init_ok = false;
};

HostFacts gather_host_facts(const Target& t);

// A GET of a URL: the status and body, or why there was no answer.
struct HttpProbe {
  std::string url;
  int status = 0;  // 0 = no answer
  std::string body;
  std::string error;
};
HttpProbe probe_http(const std::string& base, const std::string& path, const std::string& token);

enum class Level { kOk, kWarn, kFail };

struct Finding {
  std::string name;  // "clone3", "cgroups", "data dir", ...
  Level level = Level::kOk;
  std::string detail;  // what was found
  std::string fix;     // what to do ("" when ok)
  // A failure here means the configured default backend cannot run (exit non-zero).
  bool blocks = false;
};

struct Report {
  std::vector<Finding> findings;
  int exit_code = 0;  // 1 when a blocking finding failed
};

// The findings for a host; readyz nullopt = not asked, etcd one probe per endpoint.
Report evaluate(const Target& t, const HostFacts& h, const std::optional<HttpProbe>& readyz,
                const std::vector<HttpProbe>& etcd);

// The report as printed: one line per finding ("ok", "WARN", "FAIL"), the fix indented below.
std::string format_report(const Report& r);

// `agentbox doctor`: gathers, probes, prints; returns the exit code.
int run(Target t, bool skip_daemon);

}  // namespace agentbox::cli::doctor
