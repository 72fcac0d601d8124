#pragma once
// agentboxd's HTTP/1.1 and WebSocket server (Boost.Beast on C++20 coroutines): every route of
// API.md (the route table, routes.h; not built yet: 501).
//
// Threading: everything network-facing runs on one io_context (run it on one thread); blocking
// file-system and session work is handed to `pool` and resumed on the io_context. Beast stays
// inside http_server.cc; this header only needs Asio's basic types.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "sandbox/sandbox.h"
#include "server/config.h"
#include "service/services.h"
#include "session/session_manager.h"

namespace agentbox::cluster {
class Cluster;  // cluster/cluster.h
}

namespace agentbox::remote {
class RunnerHub;  // remote/runner_hub.h
}

namespace agentbox::server {

class AuditLog;

struct ServerOptions {
  std::string address = "127.0.0.1";
  std::uint16_t port = 9090;
  // Who may call, by token (config.h effective_tenants). Empty: no auth, and every caller is
  // tenant "default".
  std::vector<TenantConfig> tenants;
  // The audit log (audit.h), opened by the caller, which subscribes it to the session and
  // operation events; the server only reads it (GET /v1/audit). Null = none.
  std::shared_ptr<AuditLog> audit;
  std::vector<SharedDir> shared_dirs;
  // POST /v1/sessions with variables but no id/scope renders the caller's tenant's
  // default_scope, else this one ("" = none: id or scope is required).
  std::string default_scope;
  std::uint64_t max_file_bytes = 500ull << 20;
  // Seed 001: the shell of /exec and /exec-stream `command`s (--shell),
  // and the host dir holding the agents' workspaces (an artifact_dir the seed client sends as
  // a host path, /mnt/workspace/<id>/... or <root>/<id>/..., maps onto /workspace/...).
  std::string seed_shell = "/bin/bash";
  // The shell of /v1's string `command`s (exec, processes): --shell or the config's `shell`
  // when given; "" = /bin/sh (the backends' own).
  std::string command_shell;
  std::string seed_workspace_root;
  std::size_t max_json_bytes = 1u << 20;
  // The exec routes carry the command's stdin inside their JSON body: the CLI sends up to
  // 16 MiB of it (client::kMaxExecStdinBytes), plus room for JSON escaping.
  std::size_t max_exec_json_bytes = 24u << 20;
  std::size_t max_header_bytes = 8u << 10;
  std::size_t max_connections = 4096;
  // How long a connection may sit idle between requests, or make no progress on a read or write.
  std::chrono::seconds io_timeout{120};
  // WebSockets (websocket.h): the largest message a peer may send (a bigger one: close 1009),
  // how often a quiet peer is pinged (no pong within another interval: closed), and how much may
  // wait in one socket's write queue (a peer that stops reading is closed when it is full).
  std::size_t ws_max_message_bytes = 16u << 20;
  std::chrono::milliseconds ws_ping_interval{30000};
  std::size_t ws_max_queued_bytes = 16u << 20;
  // Browser origins allowed to open WebSocket routes (config.h allowed_origins); an upgrade
  // with any other Origin header is 403.
  std::vector<std::string> allowed_origins;
  // The web dashboard (dashboard.cc): GET /ui/ and its assets; false: 404, and the daemon's
  // own origin is then no allowed origin for WebSockets.
  bool ui = true;
  // LangBot's Box runtime (langbot.cc).
  LangbotConfig langbot;
  // Remote runners (runner_hub.h): GET /ws/{user}, GET /v1/runners, the remote backend. Null:
  // no runner is accepted. Runner frames are bounded by runner_max_frame_bytes.
  std::shared_ptr<remote::RunnerHub> runners;
  std::size_t runner_max_frame_bytes = 64u << 20;
  // This node's name (every session object's "node", GET /v1/cluster); "" = the host name.
  std::string node_name;
  // config_digest(config.h), shown by GET /v1/cluster.
  std::string config_digest;
  // Cluster mode (cluster/cluster.h; null: a cluster of one) and the secret that signs
  // forwarded requests (internal/forward.h).
  std::shared_ptr<cluster::Cluster> cluster;
  std::string cluster_secret;
  // How long shutdown waits for requests in flight.
  std::chrono::seconds shutdown_grace{10};
};

class HttpServer {
 public:
  // `default_backend` answers /readyz. The server keeps references to ioc, pool and the
  // services (and through them the session manager), which outlive it.
  HttpServer(boost::asio::io_context& ioc, boost::asio::thread_pool& pool,
             service::Services& services, std::shared_ptr<sandbox::Backend> default_backend,
             ServerOptions opts);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Opens the shared dirs and binds the listening socket; returns the bound endpoint (the real
  // port when 0 was asked for).
  Result<boost::asio::ip::tcp::endpoint> listen();
  // Starts accepting on the io_context. After listen().
  void start();
  // Stops accepting and closes idle connections; requests in flight finish (their responses say
  // "Connection: close"). `done` runs on the io_context once no connection is left, or after
  // shutdown_grace. Call from the io_context's thread.
  void shutdown(std::function<void()> done);

  struct Impl;  // opaque; public so the connection code in http_server.cc can name it

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace agentbox::server
