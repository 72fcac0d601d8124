// `agentbox doctor`: what evaluate() concludes from the host's facts, and the command itself.
// The facts are gathered in doctor_host.cc.

#include "cli/doctor.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli.h"

namespace agentbox::cli::doctor {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// The kernel option that provides each namespace type.
const char* ns_option(const std::string& ns) {
  if (ns == "pid") return "CONFIG_PID_NS";
  if (ns == "ipc") return "CONFIG_IPC_NS";
  if (ns == "uts") return "CONFIG_UTS_NS";
  if (ns == "net") return "CONFIG_NET_NS";
  if (ns == "cgroup") return "CONFIG_CGROUPS";
  if (ns == "user") return "CONFIG_USER_NS";
  return "CONFIG_NAMESPACES";
}

constexpr std::uint64_t kMiB = 1024 * 1024;
constexpr std::uint64_t kFailBelow = 256 * kMiB;  // a template build or two fills this
constexpr std::uint64_t kWarnBelow = 5 * 1024 * kMiB;

}  // namespace

std::string server_of_listen(const std::string& listen) {
  std::string host = listen;
  std::string port = "9090";
  if (auto colon = listen.rfind(':'); colon != std::string::npos) {
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
  }
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  if (host == "[::]") host = "[::1]";
  return "http://" + host + ":" + port;
}

std::optional<std::string> load_target(const std::string& file, Target* t) {
  try {
    YAML::Node root = YAML::LoadFile(file);
    if (!root.IsMap() && !root.IsNull()) return "config " + file + ": top level must be a mapping";
    if (root["listen"]) t->listen = root["listen"].as<std::string>();
    if (root["data_dir"]) t->data_dir = root["data_dir"].as<std::string>();
    if (root["backend"]) t->backend = root["backend"].as<std::string>();
    if (const YAML::Node& tok = root["tokens"]; tok && t->token.empty()) {
      t->token =
          tok.IsSequence() ? (tok.size() ? tok[0].as<std::string>() : "") : tok.as<std::string>();
    }
    if (const YAML::Node& cl = root["cluster"]; cl && cl.IsMap() && cl["etcd"]) {
      t->etcd.clear();
      std::vector<std::string> raw;
      if (cl["etcd"].IsSequence()) {
        for (const auto& e : cl["etcd"]) raw.push_back(e.as<std::string>());
      } else {
        raw.push_back(cl["etcd"].as<std::string>());
      }
      for (const auto& r : raw) {  // comma-separated, as the daemon takes them
        std::stringstream ss(r);
        std::string one;
        while (std::getline(ss, one, ',')) {
          if (!one.empty()) t->etcd.push_back(one);
        }
      }
    }
  } catch (const YAML::Exception& e) {
    return "config " + file + ": " + e.what();
  }
  t->config_file = file;
  return std::nullopt;
}

Report evaluate(const Target& t, const HostFacts& h, const std::optional<HttpProbe>& readyz,
                const std::vector<HttpProbe>& etcd) {
  Report r;
  const bool ns = t.backend == "ns";
  auto add = [&](std::string name, Level level, std::string detail, std::string fix = {},
                 bool blocks = false) {
    r.findings.push_back(
        Finding{std::move(name), level, std::move(detail), std::move(fix), blocks});
  };
  const std::string upgrade =
      "upgrade to a Linux 5.12+ kernel (Debian 12's 6.1 has everything; on Debian 11 install "
      "linux-image-amd64 from bullseye-backports)";

  add("backend", Level::kOk,
      "default backend '" + t.backend + "'" +
          (t.config_file.empty() ? "" : " (from " + t.config_file + ")"));
  {
    bool old = h.kernel_major < 5 || (h.kernel_major == 5 && h.kernel_minor < 12);
    add("kernel", old ? Level::kFail : Level::kOk, "Linux " + h.kernel_release, old ? upgrade : "",
        ns);
  }
  if (ns) {
    add("privileges", h.root ? Level::kOk : Level::kFail,
        h.root ? "root"
               : "not root and no CAP_SYS_ADMIN: the ns backend makes namespaces, "
                 "cgroups and mounts",
        h.root ? ""
               : "run agentboxd as root (the packaged unit does: sudo systemctl start "
                 "agentboxd), or, for development only, --backend host (no isolation)",
        true);
  }
  {
    std::vector<std::string> blocking;  // the ns backend's own namespaces (not user)
    std::vector<std::string> options;
    for (const auto& n : h.missing_ns) {
      if (n != "user") blocking.push_back(n);
      options.push_back(ns_option(n));
    }
    add("namespaces", blocking.empty() ? Level::kOk : Level::kFail,
        blocking.empty() ? "mnt, pid, ipc, uts, net, cgroup" : "missing: " + join(blocking),
        blocking.empty()
            ? ""
            : "a kernel built with " + join(options) + "; in a container, run it --privileged",
        ns);
  }
  {
    bool user_ok = !contains(h.missing_ns, "user") && h.max_user_namespaces != 0;
    add("user namespaces", user_ok ? Level::kOk : Level::kWarn,
        user_ok ? "available"
                : (contains(h.missing_ns, "user") ? "not built in this kernel"
                                                  : "disabled (user.max_user_namespaces = 0)"),
        user_ok ? ""
                : "sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/); without "
                  "them host dirs cannot be mounted read-write into boxes (idmapped mounts)");
    bool idmap_ok = user_ok && h.mount_setattr;
    add("idmapped mounts", idmap_ok ? Level::kOk : Level::kWarn,
        idmap_ok ? "mount_setattr and user namespaces available"
                 : std::string("unavailable (") +
                       (h.mount_setattr ? "no user namespaces" : "no mount_setattr") + ")",
        idmap_ok ? ""
                 : "sessions' read-write host mounts (--mount, --host-path) will be refused; " +
                       upgrade);
  }
  add("clone3", h.clone3 ? Level::kOk : Level::kFail, h.clone3 ? "available" : "missing",
      h.clone3 ? "" : upgrade + " (clone3: 5.3+)", ns);
  add("openat2", h.openat2 ? Level::kOk : Level::kFail, h.openat2 ? "available" : "missing",
      h.openat2 ? "" : upgrade + " (openat2: 5.6+)", ns);
  add("mount API", h.mount_setattr ? Level::kOk : Level::kFail,
      h.mount_setattr ? "mount_setattr available" : "mount_setattr missing",
      h.mount_setattr ? "" : upgrade, ns);
  add("seccomp", h.seccomp ? Level::kOk : Level::kFail, h.seccomp ? "available" : "missing",
      h.seccomp ? "" : "a kernel built with CONFIG_SECCOMP and CONFIG_SECCOMP_FILTER", ns);
  {
    Level l = h.overlayfs ? Level::kOk : (h.overlayfs_module ? Level::kOk : Level::kFail);
    add("overlayfs", l,
        h.overlayfs ? "available"
                    : (h.overlayfs_module ? "module present (loaded on first use)" : "missing"),
        l == Level::kOk ? "" : "modprobe overlay (a kernel with CONFIG_OVERLAY_FS)", ns);
  }
  {
    // The daemon's driver: cgroup v2 with memory, cpu and pids, else v1 with those and freezer.
    std::vector<std::string> v2_missing, v1_missing;
    for (const char* c : {"memory", "cpu", "pids"}) {
      if (!contains(h.cgroup2_controllers, c)) v2_missing.push_back(c);
    }
    for (const char* c : {"memory", "cpu", "pids", "freezer"}) {
      if (!contains(h.cgroup1_controllers, c)) v1_missing.push_back(c);
    }
    bool v2 = !h.cgroup2_root.empty() && v2_missing.empty();
    bool v1 = v1_missing.empty();
    std::string detail;
    if (v2) {
      detail = "v2 at " + h.cgroup2_root + " (" + join(h.cgroup2_controllers) + ")";
    } else if (v1) {
      detail =
          "v1 (" + join(h.cgroup1_controllers) + ")" +
          (h.cgroup2_root.empty() ? ""
                                  : "; v2 at " + h.cgroup2_root + " lacks " + join(v2_missing));
    } else {
      detail = "no usable hierarchy: v2 " +
               (h.cgroup2_root.empty() ? std::string("not mounted")
                                       : "at " + h.cgroup2_root + " lacks " + join(v2_missing)) +
               "; v1 lacks " + join(v1_missing);
    }
    // v2 in a container's own cgroup namespace: its root holds the container's processes, so
    // it cannot hand controllers down to the boxes' cgroups until they move into a leaf.
    std::vector<std::string> not_delegated;
    for (const char* c : {"memory", "cpu", "pids"}) {
      if (!contains(h.cgroup2_subtree, c)) not_delegated.push_back(c);
    }
    if (v2 && h.cgroup2_nested && h.cgroup2_root_procs > 0 && !not_delegated.empty()) {
      add("cgroup delegation", Level::kFail,
          h.cgroup2_root + " is a cgroup namespace's root holding " +
              std::to_string(h.cgroup2_root_procs) + " processes, and does not hand down " +
              join(not_delegated) + " (cgroup v2's no-internal-process rule)",
          "move the processes into a leaf cgroup before agentboxd starts (the image's "
          "entrypoint does: mkdir " +
              h.cgroup2_root +
              "/init and write each pid of cgroup.procs into its cgroup.procs), "
              "or run the container with --cgroupns=host",
          ns);
    }
    add("cgroups", v2 || v1 ? Level::kOk : Level::kFail, detail,
        v2 || v1 ? ""
                 : "mount cgroup2 on /sys/fs/cgroup with the memory, cpu and pids controllers "
                   "enabled (systemd does by default; kernel command line "
                   "systemd.unified_cgroup_hierarchy=1), or the v1 hierarchies memory, cpu, pids, "
                   "freezer; in a container, run it with --cgroupns=host or --privileged",
        ns);
  }
  {
    Level l = h.nft_works ? Level::kOk : Level::kWarn;
    std::string detail = h.nft_works          ? h.nft_path + " works"
                         : h.nft_path.empty() ? "nft not found"
                                              : "nft fails: " + h.nft_error;
    add("nftables", l, detail,
        h.nft_works ? ""
                    : "apt-get install nftables (a kernel with nf_tables); needed only for the "
                      "'open' network mode");
  }
  {
    std::string where = h.data_dir_exists ? t.data_dir
                                          : t.data_dir + " (missing; made at start under " +
                                                h.data_dir_checked + ")";
    Level l = Level::kOk;
    std::string fix;
    std::string detail = where + ": " + (h.fs_type.empty() ? "?" : h.fs_type) + ", " +
                         human_bytes(h.free_bytes) + " free";
    if (h.fs_type == "proc" || h.fs_type == "sysfs") {
      l = Level::kFail;
      fix = "data_dir must be on a disk, not in " + h.fs_type;
    } else if (!h.data_dir_writable) {
      l = Level::kFail;
      fix = "make " + h.data_dir_checked + " writable for agentboxd, or set data_dir";
    } else if (h.fs_type == "overlayfs" || h.fs_type == "nfs" || h.fs_type == "fuse" ||
               h.fs_type == "fuseblk" || h.fs_type == "cifs" || h.fs_type == "smb2") {
      l = ns ? Level::kFail : Level::kWarn;
      fix = "put data_dir on a local ext4, xfs or btrfs file system (" + h.fs_type +
            " cannot hold overlayfs upper dirs); in a container, mount a volume there";
    } else if (h.free_bytes < kFailBelow) {
      l = Level::kFail;
      fix = "free space on " + h.data_dir_checked + " (at least 256 MiB; 5 GiB or more advised)";
    } else if (h.free_bytes < kWarnBelow) {
      l = Level::kWarn;
      fix = "less than 5 GiB free: workspaces and template snapshots will soon fill it";
    } else if (h.fs_type == "tmpfs") {
      l = Level::kWarn;
      fix = "tmpfs: sessions are lost at reboot; put data_dir on a disk";
    }
    add("data dir", l, detail, fix, l == Level::kFail);
  }
  if (ns) {
    add("agentbox-init", h.init_ok ? Level::kOk : Level::kFail,
        h.init_ok ? h.init_path : h.init_path + " missing or not executable",
        h.init_ok ? "" : "install agentbox-init beside agentboxd (the package does)", true);
  }
  if (!t.etcd.empty()) {
    for (const auto& p : etcd) {
      bool ok = p.status == 200 && p.body.find("true") != std::string::npos;
      add("etcd", ok ? Level::kOk : Level::kFail,
          p.url + (ok              ? ": healthy"
                   : p.status == 0 ? ": no answer (" + p.error + ")"
                                   : ": HTTP " + std::to_string(p.status) + " " + p.body),
          ok ? ""
             : "start etcd there, or fix cluster.etcd in the config (the daemon does not "
               "start in cluster mode without etcd)",
          true);
    }
  }
  if (readyz) {
    const HttpProbe& p = *readyz;
    if (p.status == 200) {
      add("daemon", Level::kOk, p.url + ": ready");
    } else if (p.status == 0) {
      add("daemon", Level::kWarn, p.url + ": not running (" + p.error + ")",
          "start it: sudo systemctl start agentboxd (journalctl -u agentboxd says why it "
          "stopped), or make run");
    } else {
      std::string msg = p.body;
      try {
        auto j = nlohmann::json::parse(p.body);
        msg = j.at("error").at("message").get<std::string>();
      } catch (const std::exception&) {
      }
      bool auth = p.status == 401;
      add("daemon", auth ? Level::kWarn : Level::kFail,
          p.url + ": HTTP " + std::to_string(p.status) + ": " + msg,
          auth ? "pass --token (or AGENTBOX_TOKEN) to let the doctor ask it"
               : "the daemon cannot run its default backend: see the failures above",
          !auth);
    }
  }
  for (const auto& f : r.findings) {
    if (f.blocks && f.level == Level::kFail) r.exit_code = 1;
  }
  return r;
}

std::string format_report(const Report& r) {
  std::string out;
  for (const auto& f : r.findings) {
    const char* tag = f.level == Level::kOk ? "ok  " : f.level == Level::kWarn ? "WARN" : "FAIL";
    out += std::string(tag) + "  " + f.name + ": " + f.detail + "\n";
    if (!f.fix.empty()) out += "      fix: " + f.fix + "\n";
  }
  out += r.exit_code == 0
             ? "agentbox doctor: this host can run agentboxd as configured\n"
             : "agentbox doctor: agentboxd's default backend cannot run here (FAIL above)\n";
  return out;
}

int run(Target t, bool skip_daemon) {
  HostFacts h = gather_host_facts(t);
  std::optional<HttpProbe> readyz;
  if (!skip_daemon) {
    readyz =
        probe_http(t.server.empty() ? server_of_listen(t.listen) : t.server, "/readyz", t.token);
  }
  std::vector<HttpProbe> etcd;
  for (const auto& e : t.etcd) etcd.push_back(probe_http(e, "/health", ""));
  Report r = evaluate(t, h, readyz, etcd);
  std::cout << format_report(r) << std::flush;
  return r.exit_code;
}

}  // namespace agentbox::cli::doctor
