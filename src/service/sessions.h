#pragma once
// Sessions as operations (API.md "Sessions", "Live changes to a session"): create-or-get, get,
// list, the lifecycle steps, destroy (with archive), restore, network policy, mounts, and the
// one way any surface gets a session's sandbox (lease). Each call validates the id once, runs the
// manager's blocking work on the pool and resumes on the caller's executor. Lifecycle changes are
// told by the manager's own events (session/events.h); policy and mount changes emit an operation
// event here.

#include <boost/asio/awaitable.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "sandbox/sandbox.h"
#include "service/deps.h"
#include "service/origin.h"
#include "session/session_manager.h"

namespace agentbox::service {

// A session's live sandbox, held for one operation (the box stays up while it is held: a
// suspend waits for no lease, but the Sandbox object outlives it).
struct Lease {
  std::string id;
  std::shared_ptr<sandbox::Sandbox> box;
};

class Sessions {
 public:
  explicit Sessions(Deps deps) : d_(deps) {}

  // POST /v1/sessions: the session and whether it was made now; an existing id is returned as
  // it is (its spec is not changed by `spec`).
  asio::awaitable<Result<std::pair<session::SessionInfo, bool>>> create(Origin origin,
                                                                        std::string id,
                                                                        session::SessionSpec spec);
  asio::awaitable<Result<session::SessionInfo>> get(Origin origin, std::string id);
  asio::awaitable<Result<std::vector<session::SessionInfo>>> list(Origin origin);
  // What it uses now (SessionManager::usage): never resumes it, not a use of it.
  asio::awaitable<Result<session::SessionManager::Usage>> usage(Origin origin, std::string id);
  asio::awaitable<Result<session::SessionInfo>> suspend(Origin origin, std::string id);
  asio::awaitable<Result<session::SessionInfo>> resume(Origin origin, std::string id);
  asio::awaitable<Result<session::SessionInfo>> keepalive(Origin origin, std::string id);
  // Tears the box down and deletes the workspace; with `archive`, writes it to
  // data_dir/archives first and returns the archive's path ("" without).
  asio::awaitable<Result<std::string>> destroy(Origin origin, std::string id, bool archive);
  asio::awaitable<Result<session::SessionInfo>> restore(Origin origin, std::string id,
                                                        std::string archive);
  // Makes session `id` with `spec` when it does not exist; an existing one is taken as it is,
  // except its limits: the ones `spec` sets that differ are changed in place (update(), errors
  // naming `limits_field`), so a command run next runs under them (seed 001's `cgroup`).
  asio::awaitable<Status> ensure(Origin origin, std::string id, session::SessionSpec spec,
                                 std::string limits_field);
  // A live change of limits, TTL and labels (emits "session.update"): the session as it is now.
  asio::awaitable<Result<session::SessionInfo>> update(Origin origin, std::string id,
                                                       session::SessionManager::Update update);
  // update() of the idle TTL alone (E2B's timeout).
  asio::awaitable<Result<session::SessionInfo>> set_ttl(Origin origin, std::string id,
                                                        std::int64_t ttl_sec);
  // The session's egress policy (emits "session.network").
  asio::awaitable<Result<session::SessionInfo>> set_network(Origin origin, std::string id,
                                                            session::NetworkSpec network);
  // More mounts and skills (emits "session.mounts" with where they apply).
  asio::awaitable<Result<session::SessionManager::MountsAdded>> add_mounts(
      Origin origin, std::string id, session::SessionSpec add);

  // Cluster mode (placement.cc): the owner of session `id`: the catalog's, else the node it is
  // placed on now (`node` when given, else the one with the most free capacity). Without a
  // cluster: this node (a `node` naming another one is ENOENT).
  asio::awaitable<Result<cluster::Owner>> place(Origin origin, std::string id, std::string node);
  // Cluster mode, a remote session following its runner (server/runner_follow.cc): makes
  // session `id` here from `spec` as the node that held it had it, for origin's tenant, without
  // entering it into the catalog (which names that node until the hand-over switches it here)
  // and without the tenant's max_sessions (the session exists already; refusing it would leave it
  // on a node without its runner). An existing remote session of that id, tenant and runner is
  // returned as it is (false: not made now); any other session of that id is EEXIST.
  asio::awaitable<Result<std::pair<session::SessionInfo, bool>>> adopt(Origin origin,
                                                                       std::string id,
                                                                       session::SessionSpec spec);

  // The one lease rule: the live sandbox of session `id` (resumed when suspended), made with the
  // default spec first when `create_if_missing` (exec and process routes create; file routes do
  // not). A running session is leased without a hop through the pool.
  asio::awaitable<Result<Lease>> lease(Origin origin, std::string id, bool create_if_missing);
  // The running session's sandbox, never resuming it: nullptr when it is not running.
  asio::awaitable<std::shared_ptr<sandbox::Sandbox>> lease_running(Origin origin, std::string id);

  const Deps& deps() const { return d_; }

 private:
  Deps d_;
};

}  // namespace agentbox::service
