#pragma once
// agentboxd's configuration: command-line flags (CLI11) over an optional YAML file (--config)
// with the same keys (listen, data_dir, backend, tokens, shared_dirs, allowed_mount_roots,
// max_file_mb, log_level, max_running_boxes, audit_max_mb, allowed_origins) plus `tenants`,
// `default_limits` and `readonly_dirs` and `network` (YAML only), and seed 001's toolbox-server
// flags (SeedFlags; flags only). Flags override the file.

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cluster/config.h"
#include "common/error.h"
#include "image/store.h"
#include "net/policy.h"
#include "sandbox/default_limits.h"

namespace agentbox::server {

// A seed-001 shared dir: API paths starting with `prefix` read from `host_path` (read-only).
struct SharedDir {
  std::string prefix;     // no leading or trailing "/"
  std::string host_path;  // absolute
};

// A tenant (DESIGN.md "tenant"): the owner of some API tokens. It sees only the sessions it
// created; an admin tenant sees all.
struct TenantConfig {
  std::string name;  // [A-Za-z0-9._-]{1,64}
  std::vector<std::string> tokens;
  bool admin = false;
  std::size_t max_sessions = 0;  // 0 = no limit
  // Scope template for POST /v1/sessions bodies with `variables` but neither `id` nor `scope`
  // (seed 002); "" = the daemon's default_scope.
  std::string default_scope;
};

// LangBot's Box runtime (langbot.cc, PROTOCOLS.md part 2): YAML `langbot: {control_token,
// tenant, trusted_instance}`, flags --langbot-control-token (env LANGBOT_BOX_CONTROL_TOKEN),
// --langbot-tenant, --langbot-trusted-instance (env LANGBOT_BOX_TRUSTED_INSTANCE_UUID).
struct LangbotConfig {
  // X-LangBot-Box-Control-Token: at least 32 characters, no whitespace. "" = none, and then
  // /rpc/ws is refused (401) on a daemon that has tokens: a LangBot route never opens what the
  // daemon's own auth closes.
  std::string control_token;
  std::string tenant;  // whose sessions LangBot's are; "" = "default"
  // The one X-LangBot-Instance-Id accepted; "" = the first /rpc/ws connection binds it.
  std::string trusted_instance;
};

// The name of the tenant that plain --token tokens (and, without tokens, every caller) belong to.
inline constexpr char kDefaultTenant[] = "default";

// A remote runner user (API.md "Runners"): its runner registers at /ws/<user> with `token` and
// serves sessions of `tenant`.
struct RunnerConfig {
  std::string user;
  std::string token;
  std::string tenant = kDefaultTenant;
};

// Seed 001 (Ghost's toolbox-server) command line, so agentboxd replaces that binary unchanged:
// --port, --shell, --workdir, --multi-agent, --shared-readonly (no-op), --toolchain-path
// (and --shared-dirs, a DaemonConfig key), with SHARED_DIRS / TOOLCHAIN_PATH env fallbacks.
struct SeedFlags {
  std::optional<std::uint16_t> port;  // --port P: listen on 0.0.0.0:P
  bool multi_agent = false;           // --multi-agent: isolated boxes (ns)
  bool shared_readonly = false;       // --shared-readonly: deprecated, accepted, no effect
  std::string shared_readonly_value;  // the path old command lines give it (ignored)
  // The shell of seed /exec and /exec-stream `command`s; given (--shell or the config's
  // `shell`), also of every string `command` of /v1 (exec, processes), which else keep /bin/sh.
  std::string shell = "/bin/bash";
  bool shell_given = false;
  // The agents' workspace root: workspaces at {workdir}/{agent_id}. "" = data_dir/workspaces.
  std::string workdir;
  // Prefixed to PATH in every box ("" = none); may hold several dirs joined by ':'.
  std::string toolchain_path;
  // --port with --multi-agent and no token: the seed's trust model (anyone who reaches the
  // port may run commands in the agents' isolated boxes), allowed with a loud warning.
  bool open_without_token = false;
  std::vector<std::string> warnings;  // for the startup log
};

// The `cluster:` section (cluster/config.h).
using ClusterConfig = cluster::ClusterConfig;

struct DaemonConfig {
  std::string listen = "127.0.0.1:9090";
  std::string data_dir = "./.agentbox";
  // The default backend of new sessions. `ns` (isolated) unless the operator names another; if
  // the chosen backend cannot run here the daemon refuses to start (never a silent fallback).
  std::string backend = "ns";
  std::vector<std::string> tokens;  // tenant "default"
  // YAML `tenants: [{name, tokens: [..], admin, max_sessions}]`.
  std::vector<TenantConfig> tenants;
  std::vector<RunnerConfig> runners;  // --runner-token USER=TOKEN, config `runners:`
  // Sessions created without a `backend` go to this runner user (backend remote); one of
  // `runners`. "" = they get `backend`.
  std::string default_runner;
  // Boxes running at once over all tenants (0 = no limit); past it creates/resumes are 429.
  std::size_t max_running_boxes = 0;
  // Suspend the least recently used idle box instead of refusing at max_running_boxes.
  bool evict_idle = false;
  // Backends a session may ask for besides the default one (`backend` in POST /v1/sessions).
  // SECURITY: empty by default, so no client can pick `host` (no isolation) on an ns daemon.
  std::vector<std::string> allowed_backends;
  // Sessions idle (no API use, no command running) this long are suspended, or destroyed when
  // ttl_action is "destroy"; a session's own ttl_sec wins. 0 = never.
  std::int64_t ttl_sec = 1800;
  std::string ttl_action = "suspend";  // suspend | destroy
  // Keep sessions in data_dir/state.db across restarts (false: in memory only).
  bool persist = true;
  // Scope template used when a create names neither id nor scope (seed 002's presets, e.g.
  // "{launcher_type}_{launcher_id}"); per tenant in `tenants[].default_scope`. "" = none.
  std::string default_scope;
  // data_dir/audit.log is rotated at this size (3 old files kept).
  std::uint64_t audit_max_mb = 64;
  // A WebSocket peer quiet this long is pinged, and closed after twice as long without any frame
  // (a half-open runner connection is found within 2 x this).
  std::uint32_t ws_ping_sec = 30;
  std::vector<SharedDir> shared_dirs;
  // Host dirs under which sessions may ask for extra mounts and skills (none: refused).
  std::vector<std::string> allowed_mount_roots;
  // Browser origins ("https://app.example.org", scheme://host[:port], lower case) whose pages
  // may open the WebSocket routes (YAML `allowed_origins`, flag --allow-origin). SECURITY:
  // empty by default, so a WebSocket upgrade carrying any Origin header is refused (403):
  // a page the operator did not list cannot drive a terminal (CSWSH); non-browser clients send
  // no Origin and are not affected.
  std::vector<std::string> allowed_origins;
  // Seed 000 (xbot): every skill dir (holding a SKILL.md) under global_skills_dir appears
  // read-only in every box at /workspace/.skills/<name> (a session's own skill of that name
  // wins), and agents_dir read-only at /workspace/.agents. Absolute, existing dirs; "" = none.
  std::string global_skills_dir;
  std::string agents_dir;
  std::uint64_t max_file_mb = 500;
  // The web dashboard at GET /ui/ (YAML `ui`, flag --no-ui); false: /ui/ is 404.
  bool ui = true;
  // Seed 004: run every session's health checks, and the repairs of the failing ones, when it
  // resumes (YAML `auto_repair`, flag --auto-repair).
  bool auto_repair = false;
  // Seed 004: MiB of each ns box's /cache tmpfs, where pip/uv/npm/bun keep their caches (not in
  // the workspace's disk quota; memory charged to the box). YAML `cache_mb`, flag --cache-mb;
  // 0 = no /cache (the caches then live in the workspace).
  std::uint64_t cache_mb = 512;
  // Issue 22: ns boxes kept started ahead and bound to a session at its create or resume
  // (sandbox/internal/ns_pool.h). YAML `pool`, flag --pool; 0 = off. Default 2: a burst of two
  // creates gets warm boxes on a small (2-core) host while the pool refills one box at a time
  // at nice +10; the escape and ns integration suites run with it. Bigger hosts with bursts of
  // creates: 4 or more (README "Configuration" gives the memory an idle pooled box holds).
  // Started only when the ns backend is the default or an allowed backend.
  std::size_t pool = 2;
  // YAML `default_limits: {memory_mb, cpu_percent, max_pids, disk_mb, max_open_files,
  // cpu_time_sec, tmp_mb}`: what a session's unset limits become (validated like a request's
  // `limits`; disk_mb and cpu_time_sec 0 = none); the keys not given keep sandbox's built-in
  // defaults. tmp_mb unset: derived per session from its memory_mb (default_tmp_mb).
  sandbox::Limits default_limits = sandbox::builtin_default_limits();
  // YAML `network: {hosts: {name: address}, allow_private: bool}` (API.md "Network"): names the
  // allowlist proxy resolves before DNS (validated with net::parse_hosts) and whether allowed
  // names may resolve to private ranges. daemon_ports is filled by the daemon (its listen port).
  net::NetworkConfig network;
  std::string log_level = "info";
  std::string ready_file;  // written with "HOST:PORT\n" once listening
  // --check-backend NAME: report whether NAME can run on this host and exit (0 usable, 1 not).
  std::string check_backend;
  SeedFlags seed;  // seed 001's toolbox-server flags (apply_seed_flags folds them in)
  // Host dirs every isolated box sees read-only at the same path (YAML `readonly_dirs`); unset:
  // /opt when it exists on the host (toolchains live there).
  std::optional<std::vector<std::string>> readonly_dirs;
  LangbotConfig langbot;
  ClusterConfig cluster;
  // YAML `registries: {host: {username, password_file | token_file, ca_file, insecure}}` (API.md
  // "Images"): how the image store reaches each registry host (config_registries.cc).
  std::map<std::string, image::RegistryAuth> registries;
  // YAML `image_aliases: {name: ref}`: E2B's templateID names an image by one of these when no
  // template has that name (config_registries.cc).
  std::map<std::string, std::string> image_aliases;
  // YAML `default_image: REF`, or seed 003's docker mode as xbot's server is configured for it
  // (env SANDBOX_MODE=docker with SANDBOX_DOCKER_IMAGE=REF): the image of every new session on a
  // backend that makes image roots that names no image and no template (config_registries.cc).
  std::string default_image;
};

// Parses the YAML `registries:` mapping into c->registries (config_registries.cc).
namespace detail {
Status load_registries(const void* yaml_node, const std::string& file, DaemonConfig* c);
// Parses the YAML `image_aliases:` mapping into c->image_aliases (config_registries.cc).
Status load_image_aliases(const void* yaml_node, const std::string& file, DaemonConfig* c);
// `default_image:` (a scalar node) and, when the YAML has none, seed 003's docker-mode env.
Status load_default_image(const void* yaml_node, const std::string& file, DaemonConfig* c);
}  // namespace detail

// Seed 001's read-only mount of the host's shared files (gcsfuse in the seed's pod).
inline constexpr char kSeedSharedReadonly[] = "/mnt/shared-readonly";

// The host dirs boxes get read-only: c.readonly_dirs, or /opt when unset and it exists; in
// seed 001's mode (--multi-agent or --workdir) also /mnt/shared-readonly when the host has it.
// `is_dir` answers whether a host dir exists (default: stat; tests pass their own).
std::vector<std::string> effective_readonly_dirs(
    const DaemonConfig& c, const std::function<bool(const std::string&)>& is_dir = {});

struct ParseOutcome {
  std::optional<DaemonConfig> config;  // empty: exit with exit_code (help, bad flag, bad file)
  int exit_code = 0;
};

// Checks the seed flags and folds them into the config: --port -> listen 0.0.0.0:P,
// --multi-agent -> backend ns, the seed's "no isolation" -> only with an explicit --backend host.
// `backend_given`: --backend (or the file's backend) was set by the operator. Errors name the
// flag; what the operator must see at startup goes to c->seed.warnings.
Status apply_seed_flags(DaemonConfig* c, bool backend_given);

// Parses argv (and the --config file). Help and errors are printed to `out` / `err`.
ParseOutcome parse_daemon_args(int argc, const char* const* argv, std::ostream& out,
                               std::ostream& err);

// "127.0.0.1:9090", "[::1]:0", "localhost:8080" -> (address, port). The address must be an IP
// literal or "localhost".
Result<std::pair<std::string, std::uint16_t>> parse_listen(std::string_view listen);

// "prefix:/abs/path,other:/path2" (seed 001's --shared-dirs).
Result<std::vector<SharedDir>> parse_shared_dirs(std::string_view spec);

bool is_loopback_address(std::string_view address);

// An allowed_origins entry: scheme://host[:port] in lower case, as browsers send Origin; EINVAL
// naming it otherwise.
Status check_origin(std::string_view origin);

// Checks the combination: a non-loopback listen address needs at least one token, the backend
// name is not empty, max_file_mb is at least 1, no token is empty, tenant names are valid and
// unique, every tenant has a token, no token belongs to two tenants, every allowed origin is
// scheme://host[:port].
Status validate_config(const DaemonConfig& c);

// A digest of what must agree between nodes (tenants, their tokens' hashes and limits), shown by
// GET /v1/cluster so a mismatch is visible.
std::string config_digest(const DaemonConfig& c);

// Every tenant that can authenticate: the YAML tenants plus, when --token tokens are given, the
// tenant "default" holding them. Empty: auth is off (every caller is tenant "default").
std::vector<TenantConfig> effective_tenants(const DaemonConfig& c);

}  // namespace agentbox::server
