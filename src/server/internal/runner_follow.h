#pragma once
// Cluster mode: a remote session's ownership follows its runner (runner_follow.cc, API.md
// "Cluster"). The catalog's runners/<user> record names the node holding that user's runner
// connection; the node that owns a remote session whose runner went to another node hands the
// session over to it (POST /v1/cluster/sessions/{id}/adopt there, then one compare-and-swap of
// the catalog entry, then its own row goes).

#include <boost/asio/awaitable.hpp>
#include <memory>
#include <string>

#include "server/internal/context.h"

namespace agentbox::server::detail {

// What the hand-over keeps between its passes (made by make_runner_follow).
class RunnerFollow;

// The node a runners/<user> record names ("" when the value is not a record).
std::string runner_record_node(const std::string& value);

// In cluster mode with runners configured: makes ctx->runner_follow. Call before the first
// connection is accepted (runner_changed() needs it); a no-op otherwise.
void make_runner_follow(Context* ctx);

// The runner of `user` registered on this node (`registered`), or a connection of it here ended:
// runners/<user> is made to name this node (a registration here is the newest one, whichever
// node the record named), or no longer to name it once no connection of the user is left here.
// In the pool, in the background; the next hand-over pass runs right after. Call on the
// io_context. A no-op without ctx->runner_follow.
void runner_changed(Context* ctx, std::string user, bool registered);

// The hand-over loop (started with recover_moves; returns at once without ctx->runner_follow):
// a pass when a runners/ record changed or a runner came or went here, and every 10 s. A pass:
//   - keeps this node's runners/ records true (one whose write failed is written again);
//   - hands each local remote session whose runner is not connected here, while runners/<user>
//     names another up node, over to that node;
//   - drops a local remote session the catalog gives to another node, made over 60 s ago,
//     whose runner is not connected here (this node stopped between a hand-over's switch and
//     its drop, or a node adopted it and the switch never came).
asio::awaitable<void> follow_runners(Context* ctx);

// POST /v1/cluster/sessions/{id}/adopt (node to node, signed): the session as the spec in the
// body (session::encode_spec) is made here, for the forwarded tenant, when its runner is
// connected here; ?cancel=1 (no body): the remote session of that id adopted here goes again
// (the hand-over's switch failed), unless the catalog names this node for it.
asio::awaitable<Reply> adopt_session(Context* ctx, Request* req);

}  // namespace agentbox::server::detail
