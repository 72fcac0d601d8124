#include "service/placement.h"

#include <ctime>
#include <optional>

#include "cluster/move_state.h"
#include "common/log.h"
#include "service/blocking.h"
#include "service/sessions.h"

namespace agentbox::service {
namespace {

std::string rfc3339(std::int64_t unix_sec) {
  if (unix_sec <= 0) return "an unknown time (before this node started)";
  std::time_t t = static_cast<std::time_t>(unix_sec);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// server/cluster_move.cc marks a session coming here before the catalog names this node.
bool moving_here(session::SessionManager* sm, const std::string& id) {
  return cluster::is_incoming(sm->config().data_dir, id);
}

Error moving_error(const std::string& id) {
  return Error::make(Code::kUnavailable,
                     "session " + id + " " + kMovingHere + ": try again in a moment");
}

// A move out of this node that was cut short (the node stopped mid-move) and is being settled
// since it started again (server/cluster_move.cc recover_moves): the session comes back here
// or is known to be on the target; until then it is not made anew, empty, here.
bool settling_move(session::SessionManager* sm, const std::string& id) {
  return cluster::has_move_journal(sm->config().data_dir, id);
}

Error settling_error(const std::string& id) {
  return Error::make(Code::kUnavailable,
                     "session " + id +
                         " is in a move this node is settling (it stopped mid-move): try "
                         "again in a moment");
}

// The error of a session that is not here (yet) because of a move, or none.
std::optional<Error> move_error(session::SessionManager* sm, const std::string& id) {
  if (moving_here(sm, id)) return moving_error(id);
  if (settling_move(sm, id)) return settling_error(id);
  return std::nullopt;
}

}  // namespace

Error unless_moving_here(session::SessionManager* sm, const std::string& id, Error e) {
  if (e.code != Code::kNotFound) return e;
  return move_error(sm, id).value_or(std::move(e));
}

Error elsewhere_error(const std::string& id, const cluster::Owner& owner) {
  if (!owner.up) {
    return Error::make(Code::kUnavailable, "session " + id + " is on node " + owner.node +
                                               ", which is down since " + rfc3339(owner.last_seen));
  }
  return Error::make(Code::kUnavailable,
                     "session " + id + " is on node " + owner.node + " (" + owner.advertise +
                         "); this surface does not forward to other nodes yet: send the "
                         "request there, or use /v1");
}

Status claim_here(cluster::Cluster* cl, session::SessionManager* sm, const std::string& id,
                  const session::Caller& caller) {
  if (cl == nullptr) return {};
  if (sm->get(id, session::Caller::daemon())) return {};  // made here before
  // A session on its way here from another node, or back here from a move cut short: not made
  // anew, empty, while its files are still coming.
  if (auto e = move_error(sm, id)) return std::unexpected(std::move(*e));
  // Not in the cache: most often a create another node placed here a moment ago, before this
  // node's watch saw the entry. Reading it settles that without a transaction through etcd's
  // log; only an id the catalog has never seen is claimed by one.
  if (!cl->owner(id)) {
    if (auto o = cl->lookup(id)) {
      if (!o->self) return std::unexpected(elsewhere_error(id, *o));
      return {};
    }
  }
  auto owner = cl->claim(id, caller.tenant);
  if (!owner) return std::unexpected(owner.error());
  if (!owner->self) return std::unexpected(elsewhere_error(id, *owner));
  return {};
}

asio::awaitable<Result<cluster::Owner>> Sessions::place(Origin origin, std::string id,
                                                        std::string node) {
  if (auto st = session::validate_id(id); !st) co_return std::unexpected(st.error());
  cluster::Cluster* cl = d_.cluster;
  if (cl == nullptr) {
    co_return fail(Code::kInternal, "place() without a cluster");
  }
  auto job = on_pool(d_.pool, [cl, id, node, tenant = origin.caller.tenant] {
    return cl->place(id, tenant, node);
  });
  auto r = co_await std::move(job);
  if (r && !r->self) {
    spdlog::info("req={} session {}: placed on node {}", origin.request_id, id, r->node);
  }
  co_return r;
}

}  // namespace agentbox::service
