#pragma once
// Cluster mode (API.md "Cluster"): every node answers every /v1 route of every session, sending
// a request for a session another node owns on to that node (forward.cc), signed with the
// cluster secret (cluster/forward_auth.h); and the owner's side: the check of that signature.

#include <boost/asio/awaitable.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cluster/cluster.h"
#include "server/internal/context.h"
#include "server/routes.h"

namespace agentbox::server::detail {

struct Call;

// For a /v1/sessions/{id}/... route of a session another node owns: the whole exchange relayed
// to the owner (request and reply bodies streamed, never buffered: NDJSON streams, uploads,
// downloads; a WebSocket upgrade becomes a byte tunnel once the owner answers 101) and whether
// the connection may serve another request; 503 EUNAVAILABLE when the
// owner is down or unreachable. nullopt: serve it here (no cluster, this node owns it, the
// catalog does not know it, or it was forwarded to us already). Before the body is read.
asio::awaitable<std::optional<bool>> forward_if_remote(Call* call, const std::string& target);

// The owner of session `id` when another node holds it (from the catalog cache, else etcd);
// nullopt: serve it here (no cluster, this node holds it or the catalog does not know it, the
// request was forwarded to us already).
asio::awaitable<std::optional<cluster::Owner>> remote_owner(Call* call, std::string id);

// forward_if_remote() for session `id` as a surface names it (seed 001's agent_id, E2B's sandbox
// id); `target` "" is the request's path and query. `buffered`: the transport read the (JSON)
// body already (Request::body is sent on); else
// the body is still unread and streams through, and a WebSocket upgrade becomes a tunnel to the
// owner.
asio::awaitable<std::optional<bool>> forward_session(Call* call, std::string id, std::string target,
                                                     bool buffered);

// The whole exchange relayed to node `owner` as forward_session() does, for what the catalog
// places on a node without being a session (a template build another node ran); `what` names it
// in errors ("build B"). Whether the connection may serve another request.
asio::awaitable<bool> forward_to(Call* call, cluster::Owner owner, std::string what,
                                 std::string target, bool buffered);

// X-Agentbox-Forwarded of a request: the caller it carries (the tenant as this node's config
// has it; a nameless caller when the first node had none), or EUNAUTHORIZED (a missing, forged or
// stale signature; a node not in a cluster).
Result<session::Caller> forwarded_caller(Context* ctx, std::string_view header,
                                         std::string_view method, std::string_view target);

// A small request (JSON or none) to node `n` on behalf of `caller`, whole reply buffered: a
// create placed on another node, the list of another node's sessions. Runs on the pool.
// `timeout`: how long the owner may take (a LangBot box_exec runs its command meanwhile).
asio::awaitable<Reply> forward_small(Context* ctx, std::string advertise, std::string method,
                                     std::string target, std::string body, session::Caller caller,
                                     std::chrono::seconds timeout = std::chrono::seconds(30));

}  // namespace agentbox::server::detail
