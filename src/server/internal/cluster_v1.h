#pragma once
// The /v1 parts of cluster mode (cluster_routes.cc): GET /v1/cluster and the cordons, a create
// placed on another node, the cluster-wide session list.

#include <boost/asio/awaitable.hpp>
#include <optional>
#include <string>

#include "cluster/cluster.h"
#include "server/internal/context.h"
#include "session/session_manager.h"

namespace agentbox::server::detail {

// This node's load: sessions, running boxes (the manager's counts), free memory
// (MemAvailable).
cluster::NodeLoad node_load(session::SessionManager& sm);

// Removes a create body's "node" (a non-empty string, else EINVAL) and returns it ("" absent).
Result<std::string> take_node_field(json* body);

// POST /v1/sessions in cluster mode: places `id` (on `node` when given); when another node owns
// it, that node's reply to the create (`body` sent on); nullopt: make it here. An error reply
// when it cannot be placed.
asio::awaitable<std::optional<Reply>> place_create(Context* ctx, Request* req, std::string id,
                                                   std::string node, std::string body);

// Where a new remote session of runner `user` goes (its commands and files are the runner's):
// the node holding that runner's connection: this one first, else the up node the catalog's
// runners/<user> record names (runner_follow.h), else the first up peer whose GET /v1/runners
// shows it connected; "" when no node has it (the create then answers as a node without the
// runner does).
asio::awaitable<std::string> runner_node(Context* ctx, Request* req, std::string user);

// GET /v1/sessions in cluster mode: appends the sessions of every other up node to `arr`.
asio::awaitable<void> add_peer_sessions(Context* ctx, Request* req, json* arr);

struct Call;
// POST /v1/sessions/{id}/move {"node"} on the session's owner (cluster_move.cc).
asio::awaitable<Reply> move_session(Context* ctx, Request* req);
// At start in cluster mode: every move a kill interrupted (journals in data_dir/moving) is
// finished (the target has the session) or undone (it has not: the catalog entry and the
// session come back here); a target that cannot be asked yet is asked again every 2 s.
asio::awaitable<void> recover_moves(Context* ctx);
// POST /v1/cluster/sessions/{id}/receive: a moved session's archive, restored here.
asio::awaitable<bool> receive_session(Call* call);

}  // namespace agentbox::server::detail
