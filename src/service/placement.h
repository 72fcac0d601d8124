#pragma once
// Cluster mode at the operation layer (shared/DESIGN.md "Beyond one machine"): a session made on
// this node is first entered into the catalog for this node (one etcd transaction), so no id is
// ever placed twice; one that could not be made leaves the catalog again. Blocking (etcd): call
// on the pool. Without a cluster (null) every function is a no-op.

#include <string>

#include "cluster/cluster.h"
#include "common/error.h"
#include "session/session_manager.h"

namespace agentbox::service {

// The error a surface that does not forward answers for a session another node owns: 503
// EUNAVAILABLE "session S is on node N, which is down since T" when N is down, else naming N and
// where it is reached.
Error elsewhere_error(const std::string& id, const cluster::Owner& owner);

// Session `id` is about to be made here: a no-op when it exists on this node already; else the
// catalog must name this node (claimed now when it names none). EUNAVAILABLE naming the catalog
// when etcd cannot be reached, elsewhere_error() when another node owns the id.
Status claim_here(cluster::Cluster* cl, session::SessionManager* sm, const std::string& id,
                  const session::Caller& caller);

// `e` (the error of a request for session `id`) as 503 when it is ENOENT because of a move:
// "being moved to this node" when the session is on its way here from another node (a move
// marks data_dir/incoming/<id> before the catalog names this node), "in a move this node is
// settling" when this node stopped mid-move and has not settled it yet (its journal
// data_dir/moving/<id>); else `e` as it is. Blocking (a stat): call on the pool.
inline constexpr char kMovingHere[] = "is being moved to this node";  // in its message
Error unless_moving_here(session::SessionManager* sm, const std::string& id, Error e);

// `r` failed and left no session `id` here: its catalog entry goes. Returns `r`.
template <class T>
Result<T> forget_on_failure(cluster::Cluster* cl, session::SessionManager* sm,
                            const std::string& id, Result<T> r) {
  if (!r && cl != nullptr && !sm->get(id, session::Caller::daemon())) cl->forget(id);
  return r;
}

}  // namespace agentbox::service
