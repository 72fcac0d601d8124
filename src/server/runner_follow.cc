// A remote session's ownership follows its runner (API.md "Cluster", internal/runner_follow.h).
// A remote session (backend "remote") is served by the node holding its runner's connection;
// when the runner reconnects to another node, the node that owns the session hands it over:
//   0. the node where the runner registered writes runners/<user> = {"node": N}, bound to its
//      lease (gone with the node); the node where a connection ends removes the record only
//      while it still names that node (an old socket dying late never removes a newer record);
//   1. the owner M, in its pass, finds a local remote session whose runner is not connected to
//      it while runners/<user> names another up node N, and reads the session's catalog entry
//      from etcd: it must name M;
//   2. M asks N to adopt it (POST /v1/cluster/sessions/{id}/adopt, signed, under the session's
//      tenant, the session's spec as the body): N makes the session row from the spec when the
//      runner is connected to it (the catalog still names M: no claim);
//   3. M switches the catalog entry from itself to N (one compare-and-swap): from now on every
//      node sends the session's requests to N. If the switch fails, M tells N to drop what it
//      adopted (?cancel=1) and leaves things as they were;
//   4. M drops its own row (a remote session's row is a binding: its files are the runner's and
//      its processes died with the runner's connection; the catalog entry, N's now, stays).
// Killed between 3 and 4, M drops the row in a later pass (the catalog gives the session to
// another node); N drops a row it adopted whose switch never came the same way (after 60 s).
// A node that is down keeps its remote sessions (503 naming it, as any dead node's) until it
// returns; its first pass then hands them over.

#include "server/internal/runner_follow.h"

#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <mutex>

#include "common/log.h"
#include "remote/runner_hub.h"
#include "server/internal/blocking.h"
#include "server/internal/forward.h"
#include "server/internal/transport.h"
#include "service/services.h"
#include "session/store.h"

namespace agentbox::server::detail {

class RunnerFollow {
 public:
  // One writer of this node's runners/ records at a time (pool threads): each write reads the
  // hub as it is then, so a late job never undoes what a newer one wrote.
  std::mutex records_mu;
  // A runner came or went here (a record was written): the next pass is due now.
  std::atomic<bool> kicked{false};
};

namespace {

using namespace std::chrono_literals;

constexpr char kKind[] = "runners";
// A pass at least this often (the records' watch may have been missed: etcd away).
constexpr auto kPassEvery = 10s;
constexpr auto kTick = 500ms;
// A local remote session the catalog gives to another node is dropped only when older than
// this: one adopted a moment ago waits for the hand-over's switch to reach the cache.
constexpr auto kStaleAfter = 60s;

// The node a runners/ record or a catalog entry names ("" when it is not one).
std::string node_named(const std::string& value) {
  auto j = json::parse(value, nullptr, false);
  if (!j.is_object()) return {};
  auto it = j.find("node");
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool connected_here(remote::RunnerHub& hub, const std::string& user) {
  auto conn = hub.find(user);
  return conn && conn->open();
}

// runners/<user> made true for this node: while the user's runner is connected here it names
// this node (`registered`: always, a registration here being the newest; otherwise only when
// there is no record: another node's record is a newer registration there); with no connection
// here, a record naming this node goes. Blocking (etcd).
Status sync_record(cluster::Cluster& cl, remote::RunnerHub& hub, RunnerFollow& rf,
                   const std::string& user, bool registered) {
  std::lock_guard lock(rf.records_mu);
  const bool here = connected_here(hub, user);
  const std::string mine = json{{"node", cl.node()}}.dump();
  // A compare-and-swap that lost to another node's write is tried again on the new value.
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string cur = AB_TRY(cl.read_record(kKind, user));
    const std::string named = node_named(cur);
    if (here && !registered && !cur.empty()) return {};
    if (!here && named != cl.node()) return {};
    // Rewritten even when it names this node already: bound to this node's lease of now (a
    // node started again within its old lease finds its old record).
    const std::string to = here ? mine : std::string();
    if (AB_TRY(cl.swap_record(kKind, user, cur, to, /*leased=*/here))) {
      spdlog::debug("cluster: runners/{} {}", user, here ? "names this node" : "removed");
      return {};
    }
  }
  return fail(Code::kUnavailable,
              "the catalog record runners/" + user + " changed under every write; tried 3 times");
}

// The records of this node's runners as the cache has them, made true where they are not
// (a write that failed, etcd away, a lapsed lease). Blocking (etcd, only for those).
void sync_records(cluster::Cluster& cl, remote::RunnerHub& hub, RunnerFollow& rf) {
  for (const remote::RunnerHub::Listed& l : hub.list("")) {
    auto rec = cl.record(kKind, l.user);
    const bool here = connected_here(hub, l.user);
    const bool true_now = here ? rec.has_value() : (!rec || node_named(*rec) != cl.node());
    if (true_now) continue;
    if (auto st = sync_record(cl, hub, rf, l.user, /*registered=*/false); !st) {
      spdlog::debug("cluster: runners/{}: {}", l.user, st.error().message);
    }
  }
}

// The message of a node's error reply ({"error": {"message"}}), or its status.
std::string reply_message(const Reply& r) {
  auto j = json::parse(r.body, nullptr, false);
  std::string msg = "HTTP " + std::to_string(r.status);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    msg = j["error"].value("message", msg);
  }
  return msg;
}

service::Origin origin_for(const std::string& tenant) {
  return service::Origin(session::Caller(tenant, false, 0), 0, service::Surface::kRunner);
}

// Steps 1 to 4 of the file comment for session `s`, to node `to`.
asio::awaitable<void> hand_over(Context* ctx, session::SessionInfo s, cluster::NodeState to) {
  cluster::Cluster* cl = ctx->opts.cluster.get();
  const std::string id = s.id, self = cl->node(), user = s.spec.runner;
  // 1. The catalog as etcd has it (the cache may lag): the session is this node's.
  auto job_read = run_blocking(ctx->pool, [cl, id] { return cl->entry(id); });
  auto old = co_await std::move(job_read);
  if (!old) {
    spdlog::warn("session {} stays on this node for now (its runner is on node {}): {}", id,
                 to.name, old.error().message);
    co_return;
  }
  auto entry = json::parse(*old, nullptr, false);
  if (!entry.is_object() || entry.value("node", "") != self) co_return;  // not ours (any more)
  // 2. The runner's node makes the session.
  const session::Caller as_tenant(s.tenant, false, 0);
  const std::string post = "POST", target = "/v1/cluster/sessions/" + id + "/adopt";
  const std::string spec = session::encode_spec(s.spec);
  Reply adopted = co_await forward_small(ctx, to.advertise, post, target, spec, as_tenant);
  if (adopted.status != 200 && adopted.status != 201) {
    spdlog::warn("session {} stays on this node for now: node {} did not adopt it: {}", id, to.name,
                 reply_message(adopted));
    co_return;
  }
  // 3. The catalog names the runner's node.
  entry["node"] = to.name;
  const std::string moved = entry.dump();
  auto job_swap =
      run_blocking(ctx->pool, [cl, id, o = *old, moved] { return cl->swap_entry(id, o, moved); });
  auto swapped = co_await std::move(job_swap);
  if (!swapped || !*swapped) {
    const std::string cancel = target + "?cancel=1", none;
    Reply undone = co_await forward_small(ctx, to.advertise, post, cancel, none, as_tenant);
    spdlog::warn(
        "session {} stays on this node for now: its catalog entry was not switched to node {} "
        "({}); the node's adopted copy {}",
        id, to.name, swapped ? "it changed meanwhile" : swapped.error().message,
        undone.status == 200 ? "was dropped"
                             : "stays until it finds it stale: " + reply_message(undone));
    co_return;
  }
  // 4. This node's row goes (the entry is the other node's now: forget() leaves it).
  const service::Origin origin = origin_for(s.tenant);
  auto dropped = co_await ctx->svc->sessions.destroy(origin, id, false);
  if (!dropped) {
    spdlog::error(
        "session {} was handed over to node {}, but its row here was not dropped ({}); a later "
        "pass drops it",
        id, to.name, dropped.error().message);
  }
  const service::Fields fields = {{"from", self}, {"to", to.name}, {"runner", user}};
  ctx->svc->bus().emit("session.follow", origin, id, fields);
  spdlog::info("session {} followed its runner {} to node {}", id, user, to.name);
}

// Step 4 of a hand-over that did not finish here (see the file comment): session `s` goes when
// etcd confirms that the catalog gives it to another node.
asio::awaitable<void> drop_stale(Context* ctx, session::SessionInfo s) {
  cluster::Cluster* cl = ctx->opts.cluster.get();
  const std::string id = s.id;
  auto job_read = run_blocking(ctx->pool, [cl, id] { return cl->entry(id); });
  auto cur = co_await std::move(job_read);
  if (!cur || cur->empty()) co_return;
  const std::string named = node_named(*cur);
  if (named.empty() || named == cl->node()) co_return;
  const service::Origin origin = origin_for(s.tenant);
  auto dropped = co_await ctx->svc->sessions.destroy(origin, id, false);
  if (!dropped) {
    spdlog::warn("session {}: the catalog gives it to node {}; dropping its row here failed: {}",
                 id, named, dropped.error().message);
    co_return;
  }
  spdlog::info(
      "session {}: the catalog gives it to node {} (a hand-over to its runner that was not "
      "finished here): its row here was dropped",
      id, named);
}

asio::awaitable<void> follow_pass(Context* ctx) {
  cluster::Cluster* cl = ctx->opts.cluster.get();
  std::shared_ptr<remote::RunnerHub> hub = ctx->opts.runners;
  std::shared_ptr<RunnerFollow> rf = ctx->runner_follow;
  auto job_records = run_blocking(ctx->pool, [cl, hub, rf]() -> Status {
    sync_records(*cl, *hub, *rf);
    return {};
  });
  co_await std::move(job_records);
  session::SessionManager* sm = ctx->sessions;
  auto job_list = run_blocking(ctx->pool, [sm]() -> Result<std::vector<session::SessionInfo>> {
    auto all = sm->list(session::Caller::daemon());
    std::erase_if(all, [](const session::SessionInfo& s) { return s.backend != "remote"; });
    return all;
  });
  auto remote_sessions = co_await std::move(job_list);
  if (!remote_sessions) co_return;
  const auto now = std::chrono::system_clock::now();
  for (session::SessionInfo& s : *remote_sessions) {
    if (ctx->stopping) co_return;
    // Served here while its runner is connected here, whatever the records say.
    if (connected_here(*hub, s.spec.runner)) continue;
    auto owner = cl->owner(s.id);
    if (!owner) continue;  // not in the catalog (yet): entered as this node's when etcd is reached
    if (!owner->self) {
      if (now - s.created_at > kStaleAfter) co_await drop_stale(ctx, std::move(s));
      continue;
    }
    auto rec = cl->record(kKind, s.spec.runner);
    const std::string to = rec ? node_named(*rec) : std::string();
    if (to.empty() || to == cl->node()) continue;  // the runner is nowhere: the session waits
    for (const cluster::NodeState& n : cl->peers_up()) {
      if (n.name != to) continue;
      co_await hand_over(ctx, std::move(s), n);
      break;
    }
  }
}

}  // namespace

std::string runner_record_node(const std::string& value) {
  return node_named(value);
}

void make_runner_follow(Context* ctx) {
  if (!ctx->opts.cluster || !ctx->opts.runners) return;
  ctx->runner_follow = std::make_shared<RunnerFollow>();
}

void runner_changed(Context* ctx, std::string user, bool registered) {
  if (!ctx->runner_follow) return;
  asio::post(*ctx->pool, [cl = ctx->opts.cluster, hub = ctx->opts.runners, rf = ctx->runner_follow,
                          user = std::move(user), registered] {
    if (auto st = sync_record(*cl, *hub, *rf, user, registered); !st) {
      // The pass writes it again (sync_records) once etcd answers.
      spdlog::warn("cluster: the catalog record of runner {} was not written: {}", user,
                   st.error().message);
    }
    rf->kicked = true;
  });
}

asio::awaitable<void> follow_runners(Context* ctx) {
  if (!ctx->runner_follow) co_return;
  cluster::Cluster* cl = ctx->opts.cluster.get();
  RunnerFollow* rf = ctx->runner_follow.get();
  std::uint64_t seen = cl->records_generation() - 1;  // a first pass right away
  auto last = std::chrono::steady_clock::now();
  while (!ctx->stopping) {
    asio::steady_timer t(co_await asio::this_coro::executor, kTick);
    co_await t.async_wait(kTuple);
    const std::uint64_t gen = cl->records_generation();
    const bool kicked = rf->kicked.exchange(false);
    const auto now = std::chrono::steady_clock::now();
    if (gen == seen && !kicked && now - last < kPassEvery) continue;
    seen = gen;
    last = now;
    co_await follow_pass(ctx);
  }
}

asio::awaitable<Reply> adopt_session(Context* ctx, Request* req) {
  if (!req->forwarded || req->caller.tenant.empty()) {
    co_return error_reply(Error::make(Code::kAccess,
                                      "POST /v1/cluster/sessions/{id}/adopt is for the nodes of "
                                      "a cluster, not for clients"));
  }
  auto id = session_param(*req);
  if (!id) co_return error_reply(id.error());
  cluster::Cluster* cl = ctx->opts.cluster.get();
  std::shared_ptr<remote::RunnerHub> hub = ctx->opts.runners;
  if (cl == nullptr || !hub) {
    co_return error_reply(Error::make(
        Code::kInvalid, "this node is not in a cluster with runners: it adopts no sessions"));
  }
  const std::string tenant = req->caller.tenant;
  const service::Origin origin(session::Caller(tenant, false, 0), req->id, service::Surface::kV1);
  auto job_read = run_blocking(ctx->pool, [cl, sid = *id] { return cl->entry(sid); });
  auto entry = co_await std::move(job_read);
  if (!entry) co_return error_reply(entry.error());
  const std::string named = node_named(*entry);
  if (req->query.contains("cancel")) {
    if (auto st = empty_body(req); !st) co_return error_reply(st.error());
    // A cancel comes from a hand-over whose switch failed: a session the catalog gives to this
    // node is not a cancelled adoption, and stays.
    if (named == cl->node()) {
      co_return error_reply(Error::make(Code::kExists,
                                        "the session catalog names this node for "
                                        "session " +
                                            *id + ": it is not dropped"));
    }
    auto had = co_await ctx->svc->sessions.get(origin, *id);
    bool dropped = false;
    if (had && had->backend == "remote") {
      auto gone = co_await ctx->svc->sessions.destroy(origin, *id, false);
      if (!gone) co_return error_reply(gone.error());
      dropped = true;
    } else if (had) {
      co_return error_reply(Error::make(
          Code::kExists, "session " + *id + " here is not a remote session: it is not dropped"));
    }
    json done = {{"id", *id}, {"dropped", dropped}};
    co_return json_reply(200, done);
  }
  auto spec = session::decode_spec(req->body);
  if (!spec) co_return error_reply(spec.error());
  if (spec->backend != "remote" || spec->runner.empty()) {
    co_return error_reply(Error::make(Code::kInvalid,
                                      "adopt: only a remote session (backend remote, a runner) "
                                      "follows its runner; session " +
                                          *id + " has backend '" + spec->backend + "'"));
  }
  // SECURITY (T8): only a runner of the session's tenant serves it (as the remote backend says).
  if (!hub->knows(spec->runner) || hub->tenant_of(spec->runner) != tenant) {
    co_return error_reply(Error::make(
        Code::kNotFound, "runner: no runner \"" + spec->runner + "\" on node " + cl->node()));
  }
  if (!connected_here(*hub, spec->runner)) {
    co_return error_reply(Error::make(
        Code::kUnavailable, "runner " + spec->runner + " is not connected to node " + cl->node()));
  }
  if (entry->empty()) {
    co_return error_reply(
        Error::make(Code::kNotFound, "the session catalog has no session " + *id));
  }
  // A row of it here from an earlier stay that was not dropped (this node stopped mid-way) is a
  // placeholder like the one the owner drops: the owner's spec, which may have changed since
  // (labels, TTL), replaces it. The same spec again is a retry of this adoption: kept.
  if (named != cl->node()) {
    auto had = co_await ctx->svc->sessions.get(origin, *id);
    if (had && had->backend == "remote" && had->spec.runner == spec->runner &&
        session::encode_spec(had->spec) != session::encode_spec(*spec)) {
      auto gone = co_await ctx->svc->sessions.destroy(origin, *id, false);
      if (!gone) co_return error_reply(gone.error());
    }
  }
  auto made = co_await ctx->svc->sessions.adopt(origin, *id, std::move(*spec));
  if (!made) co_return error_reply(made.error());
  co_return json_reply(made->second ? 201 : 200, encode_session(made->first));
}

}  // namespace agentbox::server::detail
