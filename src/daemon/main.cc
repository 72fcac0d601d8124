// agentboxd: parse the configuration, wire backends -> SessionManager -> HttpServer, run.
//
// Threads: the io_context runs on this thread (all network I/O, exec supervision and the boxes'
// control sockets); a pool of max(4, 2 x cores) threads takes the blocking file-system, session
// and artifact-scan work.
//
// Exit codes: 0 after SIGTERM/SIGINT, 2 for a bad configuration, 1 when startup fails.

#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "cluster/cluster.h"
#include "common/log.h"
#include "common/unique_fd.h"
#include "linux/mounts.h"
#include "remote/remote_backend.h"
#include "remote/runner_hub.h"
#include "sandbox/host_backend.h"
#include "sandbox/ns_backend.h"
#include "server/audit.h"
#include "server/config.h"
#include "server/http_server.h"
#include "server/internal/cluster_v1.h"
#include "service/resume_repair.h"
#include "session/session_manager.h"
#include "session/template_manager.h"

namespace {

namespace asio = boost::asio;
using namespace agentbox;

// This node's default name in a cluster (and in GET /v1/cluster of a single daemon).
std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "agentboxd";
  return buf;
}

// The backends this daemon can run sessions on, by name. This is the one place where backends
// are registered. A backend that cannot run on this host is still registered: its
// check_usable() says what is missing, and creating a box on it fails with that message.
// `blocking`: the worker pool the backends run the blocking steps of an exec on (empty: none).
// `path_prefix`: --toolchain-path, first in every box's PATH. `network`: the config's network
// settings for the ns backend's egress proxies (null: defaults). `control`: the network
// executor, where the ns backend reads box control sockets (empty: its own thread).
Result<std::map<std::string, std::shared_ptr<sandbox::Backend>>> make_backends(
    const std::string& runtime_dir, asio::any_io_executor blocking = {},
    const std::string& path_prefix = "", std::shared_ptr<const net::NetworkConfig> network = {},
    asio::any_io_executor control = {}, std::uint64_t cache_mb = 512, std::size_t pool_size = 0) {
  std::map<std::string, std::shared_ptr<sandbox::Backend>> backends;
  backends["host"] = std::make_shared<sandbox::HostBackend>(blocking, path_prefix);
  sandbox::NsBackendOptions ns_opts;
  ns_opts.runtime_dir = runtime_dir;
  ns_opts.blocking = blocking;
  ns_opts.path_prefix = path_prefix;
  ns_opts.network = std::move(network);
  ns_opts.control = std::move(control);
  ns_opts.cache_bytes = cache_mb << 20;
  ns_opts.pool_size = pool_size;
  auto ns = sandbox::make_ns_backend(std::move(ns_opts));
  if (!ns) return std::unexpected(ns.error());
  backends["ns"] = std::move(*ns);
  return backends;
}

// max(4, 2 x cores), at most 32.
std::size_t worker_threads() {
  const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
  return std::clamp<std::size_t>(2 * cores, 4, 32);
}

// --check-backend NAME: "NAME: usable" (exit 0) or "NAME: <what is missing>" (exit 1). Uses a
// throwaway runtime dir so that checking touches no data dir.
int check_backend(const std::string& name) {
  char tmp[] = "/tmp/agentbox-check-XXXXXX";
  if (::mkdtemp(tmp) == nullptr) {
    std::cerr << "agentboxd: mkdtemp: " << std::strerror(errno) << "\n";
    return 1;
  }
  int rc = 1;
  {
    auto backends = make_backends(std::string(tmp) + "/run");
    if (!backends) {
      std::cerr << name << ": " << backends.error().message << "\n";
    } else if (auto it = backends->find(name); it == backends->end()) {
      std::cerr << name << ": unknown backend\n";
    } else if (auto st = it->second->check_usable(); !st) {
      std::cerr << name << ": " << st.error().message << "\n";
    } else {
      std::cout << name << ": usable\n";
      rc = 0;
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return rc;
}

// Every box costs the daemon a few descriptors (control socket, root dir, pidfds, cgroup dirs)
// and every connection one: the usual soft limit of 1024 would cap a daemon near 250 sessions.
// Raise it to 65536 (the hard limit too, as root), or at least to the hard limit. Not higher:
// host-backend commands inherit it, and some programs walk every possible descriptor.
void raise_open_file_limit() {
  constexpr rlim_t kWant = 65536;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= kWant) return;
  rlimit raised{kWant, std::max(lim.rlim_max, kWant)};
  if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) return;
  lim.rlim_cur = lim.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    spdlog::warn("could not raise the open-file limit: {}", std::strerror(errno));
  }
}

// Writes "HOST:PORT\n" to `path` atomically (temp file + rename), so a watcher never reads half.
Status write_ready_file(const std::string& path, const std::string& host_port) {
  std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return fail_errno(errno, "open(" + tmp + ")");
  std::string line = host_port + "\n";
  if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    return fail_errno(errno, "write(" + tmp + ")");
  }
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail_errno(errno, "rename(" + tmp + ", " + path + ")");
  }
  return {};
}

// Commands a user can paste. The token itself is never printed: with tokens configured the
// lines read it from $AGENTBOX_TOKEN (the variable the CLI reads too), in double quotes so the
// shell expands it.
void print_usage_hint(const std::string& url, bool with_token) {
  std::string auth = with_token ? " -H \"Authorization: Bearer $AGENTBOX_TOKEN\"" : "";
  std::cout << "agentboxd is serving " << url << "\n"
            << "Try:\n";
  if (with_token) {
    std::cout << "  export AGENTBOX_TOKEN=...   # one of the daemon's tokens (--token/config)\n";
  }
  std::cout << "  export AGENTBOX_URL=" << url << "   # read by the agentbox CLI\n"
            << "  curl -s" << auth << " -X POST " << url << "/v1/sessions -d '{\"id\":\"demo\"}'\n"
            << "  curl -s" << auth << " -X POST " << url
            << "/v1/sessions/demo/exec -d '{\"command\":\"echo hello; uname -a\"}'\n"
            << "  curl -sN" << auth << " -X POST " << url
            << "/v1/sessions/demo/exec/stream -d '{\"command\":\"for i in 1 2 3; do echo "
               "$i; sleep 1; done\"}'\n"
            << "  curl -s" << auth << " -T ./README.md '" << url
            << "/v1/sessions/demo/files?path=README.md'\n"
            << "  agentbox exec demo -- ls -la\n"
            << std::flush;
}

}  // namespace

int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 512 << 10);  // big buffers (file chunks) go back when freed
  auto parsed = server::parse_daemon_args(argc, argv, std::cout, std::cerr);
  if (!parsed.config) return parsed.exit_code;
  const server::DaemonConfig& cfg = *parsed.config;
  if (!cfg.check_backend.empty()) {
    init_logging("error");
    return check_backend(cfg.check_backend);
  }
  if (auto st = server::validate_config(cfg); !st) {
    std::cerr << "agentboxd: " << st.error().message << "\n";
    return 2;
  }
  init_logging(cfg.log_level);
  for (const std::string& w : cfg.seed.warnings) {
    spdlog::warn("{}", w);
    std::cerr << "agentboxd: " << w << "\n";
  }
  raise_open_file_limit();
  // A client that goes away mid-write must be an EPIPE error, not a dead daemon.
  ::signal(SIGPIPE, SIG_IGN);

  auto listen = server::parse_listen(cfg.listen);  // validated above
  std::error_code fs_ec;
  std::filesystem::create_directories(cfg.data_dir, fs_ec);
  if (fs_ec) {
    spdlog::error("data dir {}: {}", cfg.data_dir, fs_ec.message());
    return 1;
  }
  std::string data_dir = std::filesystem::absolute(cfg.data_dir, fs_ec).string();

  // --toolchain-path: a host dir the isolated boxes would not see is refused (before anything is
  // set up), naming the readonly_dirs entry it needs, never a silent "not found" in every box.
  if (cfg.backend == "ns" && !cfg.seed.toolchain_path.empty()) {
    const std::vector<std::string> ro = server::effective_readonly_dirs(cfg);
    std::string rest = cfg.seed.toolchain_path;
    for (std::size_t p = 0; p <= rest.size();) {
      std::size_t e = std::min(rest.find(':', p), rest.size());
      const std::string d = rest.substr(p, e - p);
      p = e + 1;
      std::error_code dir_ec;
      if (d.empty() || !std::filesystem::exists(d, dir_ec)) continue;  // the box's own dir
      if (!linux::host_path_seen_in_box(d, ro)) {
        std::cerr << "agentboxd: --toolchain-path '" << d
                  << "' is a host dir the isolated boxes do not see: add '" << d
                  << "' (or a dir above it) to the config's readonly_dirs\n";
        return 2;
      }
    }
  }

  // The worker pool: every blocking step (file routes, fsync, session set-up, artifact scans)
  // runs here, never on the network thread. Those steps are mostly waits on the disk, not CPU,
  // so a few more threads than cores keep one slow client's fsync from queueing everyone else.
  asio::thread_pool pool(worker_threads());
  // SECURITY: a `network.hosts` entry never leads a box to the daemon's own port.
  auto network = std::make_shared<net::NetworkConfig>(cfg.network);
  if (listen->second != 0) network->daemon_ports.insert(listen->second);
  // The network io_context, made before the backends: the ns backend reads the boxes' control
  // sockets on it (no thread hop between a command's exit report and its exec). Destroyed where
  // it always was, after the server and before the sessions.
  auto ioc_owner = std::make_unique<asio::io_context>(1);
  asio::io_context& ioc = *ioc_owner;
  // The warm pool only where ns sessions can be made.
  const bool ns_in_use =
      cfg.backend == "ns" || std::find(cfg.allowed_backends.begin(), cfg.allowed_backends.end(),
                                       "ns") != cfg.allowed_backends.end();
  auto made = make_backends(data_dir + "/run", pool.get_executor(), cfg.seed.toolchain_path,
                            network, ioc.get_executor(), cfg.cache_mb, ns_in_use ? cfg.pool : 0);
  if (!made) {
    spdlog::error("backends: {}", made.error().message);
    return 1;
  }
  auto& backends = *made;
  auto backend_it = backends.find(cfg.backend);
  if (backend_it == backends.end()) {
    std::string known;
    for (const auto& [name, b] : backends) known += (known.empty() ? "" : ", ") + name;
    std::cerr << "agentboxd: unknown backend '" << cfg.backend << "' (available: " << known
              << ")\n";
    return 2;
  }
  std::shared_ptr<sandbox::Backend> default_backend = backend_it->second;
  // SECURITY: never a silent fallback to less isolation. If the default backend (ns unless the
  // operator chose otherwise) cannot run here, refuse to start and say what is missing.
  if (auto st = default_backend->check_usable(); !st) {
    std::cerr << "agentboxd: backend '" << cfg.backend
              << "' cannot run on this host: " << st.error().message << "\n";
    if (default_backend->isolated()) {
      std::cerr << "agentboxd: to run WITHOUT isolation, start with --backend host\n";
    }
    return 1;
  }

  session::ManagerConfig mc;
  mc.data_dir = data_dir;
  mc.workspaces_dir = cfg.seed.workdir;
  mc.default_backend = cfg.backend;
  // SECURITY: sessions get the default backend and only those the operator allowed besides;
  // a client cannot pick `host` (no isolation) on an ns daemon unless --allow-backend host.
  mc.backends[cfg.backend] = default_backend;
  for (const std::string& name : cfg.allowed_backends) {
    auto it = backends.find(name);
    if (it == backends.end()) {
      std::cerr << "agentboxd: --allow-backend: unknown backend '" << name << "'\n";
      return 2;
    }
    if (auto st = it->second->check_usable(); !st) {
      spdlog::warn("allowed backend {} cannot run on this host: {}", name, st.error().message);
    }
    mc.backends[name] = it->second;
  }
  // Remote runners (API.md "Runners"): `remote` needs no --allow-backend; a runner configured
  // for the caller's tenant is the permission (RemoteBackend::create checks it).
  std::vector<remote::RunnerUser> runner_users;
  for (const auto& r : cfg.runners) runner_users.push_back({r.user, r.token, r.tenant});
  auto runner_hub =
      std::make_shared<remote::RunnerHub>(ioc.get_executor(), std::move(runner_users));
  mc.backends["remote"] = std::make_shared<remote::RemoteBackend>(runner_hub);
  mc.default_runner = cfg.default_runner;
  mc.default_image = cfg.default_image;  // seed 003's docker mode (SANDBOX_DOCKER_IMAGE)
  for (const auto& d : cfg.shared_dirs) {
    mc.shared_dirs.push_back(sandbox::BindMount{d.host_path, d.prefix, /*read_only=*/true});
  }
  // readonly_dirs (default /opt): the host's toolchains, read-only at the same path in a box.
  for (const std::string& d : server::effective_readonly_dirs(cfg)) {
    mc.shared_dirs.push_back(sandbox::BindMount{d, d, /*read_only=*/true});
  }
  mc.allowed_mount_roots = cfg.allowed_mount_roots;
  mc.global_skills_dir = cfg.global_skills_dir;
  mc.agents_dir = cfg.agents_dir;
  mc.max_running_boxes = cfg.max_running_boxes;
  mc.evict_idle = cfg.evict_idle;
  mc.persist = cfg.persist;
  mc.default_ttl_sec = cfg.ttl_sec;
  mc.default_limits = cfg.default_limits;
  mc.ttl_destroys = cfg.ttl_action == "destroy";
  // One audit log for the server's requests and the manager's own doings (reaper, eviction).
  auto audit = server::AuditLog::open(data_dir + "/audit.log", cfg.audit_max_mb << 20);
  if (!audit) {
    spdlog::error("audit log: {}", audit.error().message);
    return 1;
  }
  std::shared_ptr<server::AuditLog> audit_log = std::move(*audit);
  // Every 403 of an egress proxy is a `net.deny` line (the weak_ptr: denials that race the
  // shutdown are dropped, not written to a closed log).
  mc.on_net_deny = [log = std::weak_ptr<server::AuditLog>(audit_log)](
                       const std::string& id, const std::string& tenant, const net::DenyEvent& d) {
    if (auto l = log.lock()) {
      l->record("net.deny", tenant, id,
                {{"method", d.method}, {"host", d.host}, {"port", d.port}, {"reason", d.reason}});
    }
  };
  {
    // Images (API.md "Images"): pulled into data_dir/images, sessions' roots on the ns backend.
    image::StoreConfig ic;
    ic.dir = data_dir + "/images";
    ic.registries = cfg.registries;
    ic.aliases = cfg.image_aliases;
    auto images = image::ImageStore::open(std::move(ic));
    if (!images) {
      spdlog::error("images: {}", images.error().message);
      return 1;
    }
    mc.images = std::move(*images);
  }
  {
    // Templates, builds and snapshots (builds run on the default backend).
    session::TemplateManager::Config tc;
    tc.data_dir = data_dir;
    tc.backend = default_backend;
    tc.default_limits = cfg.default_limits;
    tc.shared_dirs = mc.shared_dirs;
    tc.readonly_dirs = server::effective_readonly_dirs(cfg);
    tc.images = mc.images;  // templates on an image (`image:`)
    auto templates = session::TemplateManager::open(std::move(tc));
    if (!templates) {
      spdlog::error("templates: {}", templates.error().message);
      return 1;
    }
    mc.templates = std::move(*templates);
  }
  // Seed 004's auto_repair: a resumed session is repaired before its first command.
  if (cfg.auto_repair) mc.on_resume = service::auto_repair_on_resume(mc.templates);
  auto manager = session::SessionManager::open(std::move(mc));
  if (!manager) {
    spdlog::error("sessions: {}", manager.error().message);
    return 1;
  }
  // Every session change (API requests, the reaper, eviction, restores) is audited from the
  // manager's lifecycle events, every operation (exec, files, processes, policy, runners) from
  // the operation bus (audit_operations); no surface writes an audit line itself.
  std::shared_ptr<void> audit_sub = server::audit_session_events(**manager, audit_log);

  // Cluster mode (API.md "Cluster"): membership, the catalog, placement; none without
  // `cluster:` (a cluster of one).
  std::shared_ptr<cluster::Cluster> cluster;
  std::string cluster_secret;
  std::string node_name = cfg.cluster.node.empty() ? host_name() : cfg.cluster.node;
  if (cfg.cluster.enabled()) {
    auto secret = cluster::read_cluster_secret(cfg.cluster);
    if (!secret) {
      std::cerr << "agentboxd: " << secret.error().message << "\n";
      return 2;
    }
    cluster_secret = std::move(*secret);
    cluster::ClusterOptions co;
    co.etcd = cfg.cluster.etcd;
    co.etcd_ca_file = cfg.cluster.etcd_ca_file;
    co.etcd_cert_file = cfg.cluster.etcd_cert_file;
    co.etcd_key_file = cfg.cluster.etcd_key_file;
    co.node = node_name;
    co.advertise = cfg.cluster.advertise;
    co.lease_sec = cfg.cluster.lease_sec;
    co.secret = cluster_secret;
    co.config_digest = server::config_digest(cfg);
    session::SessionManager* sm = manager->get();
    cluster = std::make_shared<cluster::Cluster>(
        std::move(co), [sm] { return server::detail::node_load(*sm); },
        [sm] {
          std::vector<std::pair<std::string, std::string>> out;
          for (const auto& s : sm->list(session::Caller::daemon()))
            out.emplace_back(s.id, s.tenant);
          return out;
        });
    cluster->start();
  }

  server::ServerOptions opts;
  opts.node_name = node_name;
  opts.cluster = cluster;
  opts.cluster_secret = cluster_secret;
  opts.config_digest = server::config_digest(cfg);
  opts.address = listen->first;
  opts.port = listen->second;
  opts.tenants = server::effective_tenants(cfg);
  opts.audit = audit_log;
  opts.runners = runner_hub;
  opts.default_scope = cfg.default_scope;
  opts.shared_dirs = cfg.shared_dirs;
  opts.allowed_origins = cfg.allowed_origins;
  opts.ui = cfg.ui;
  opts.langbot = cfg.langbot;
  opts.max_file_bytes = cfg.max_file_mb << 20;
  opts.ws_ping_interval = std::chrono::seconds(cfg.ws_ping_sec);
  opts.seed_shell = cfg.seed.shell;
  if (cfg.seed.shell_given) opts.command_shell = cfg.seed.shell;
  opts.seed_workspace_root = cfg.seed.workdir.empty() ? data_dir + "/workspaces" : cfg.seed.workdir;

  {
    // The operations every surface calls (service/); their events are audited and counted.
    service::ServiceOptions so;
    so.templates = (*manager)->config().templates;
    so.cluster = cluster.get();
    so.images = (*manager)->config().images;
    service::Services services(ioc, pool, **manager, std::move(so));
    std::shared_ptr<void> audit_ops_sub = server::audit_operations(services.bus(), audit_log);
    server::HttpServer http(ioc, pool, services, default_backend, opts);
    auto ep = http.listen();
    if (!ep) {
      spdlog::error("{}", ep.error().message);
      return 1;
    }
    // The bound port (--listen :0): no box runs yet (sessions load suspended and no request has
    // come), so no proxy reads the config while it changes.
    network->daemon_ports.insert(ep->port());
    std::string host_port =
        ep->address().is_v6() ? "[" + ep->address().to_string() + "]:" + std::to_string(ep->port())
                              : ep->address().to_string() + ":" + std::to_string(ep->port());
    spdlog::info("listening on {} (backend {}, data dir {}, auth {}, {} tenant(s))", host_port,
                 cfg.backend, data_dir, opts.tenants.empty() ? "off" : "on", opts.tenants.size());
    http.start();
    // Sessions with managed processes come up without a client (API.md).
    services.start();
    // The hint is printed (and flushed) before the ready file appears: whoever waits for the file
    // may read the whole startup message at once.
    print_usage_hint("http://" + host_port, !opts.tenants.empty());
    if (!cfg.ready_file.empty()) {
      if (auto st = write_ready_file(cfg.ready_file, host_port); !st) {
        spdlog::error("ready file: {}", st.error().message);
        return 1;
      }
    }

    // SIGTERM/SIGINT: stop accepting, kill running commands (their requests then finish with
    // the killed result), wait for connections to drain, exit 0. A second signal exits at once.
    asio::signal_set signals(ioc, SIGTERM, SIGINT);
    bool stopping = false;
    std::function<void(const boost::system::error_code&, int)> on_signal;
    on_signal = [&](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      if (stopping) {
        spdlog::warn("signal {} again: stopping now", sig);
        ioc.stop();
        return;
      }
      stopping = true;
      spdlog::info("signal {}: shutting down", sig);
      http.shutdown([&ioc] { ioc.stop(); });
      session::SessionManager* sm = manager->get();
      asio::post(pool, [sm] { sm->shutdown_all(); });
      signals.async_wait(on_signal);
    };
    signals.async_wait(on_signal);

    for (;;) {
      try {
        ioc.run();
        break;
      } catch (const std::exception& e) {
        // Handlers catch their own errors; this is the last line of defence.
        spdlog::error("io loop: {}", e.what());
      }
    }
    // The loop is over: a late SIGTERM/SIGINT (e.g. `timeout` signalling the whole process group
    // after the daemon itself) must not kill the clean exit below with 143 once the signal_set
    // restores the default action.
    ::signal(SIGTERM, SIG_IGN);
    ::signal(SIGINT, SIG_IGN);
    // Cluster mode: down for the other nodes at once (the lease revoked), not after lease_sec.
    if (cluster) cluster->stop();
    // Boxes may still be up if we stopped on the second signal or the grace period ran out.
    (*manager)->shutdown_all();
    pool.join();
  }
  runner_hub.reset();
  ioc_owner.reset();
  spdlog::info("stopped");
  return 0;
}
