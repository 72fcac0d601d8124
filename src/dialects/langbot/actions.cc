// LangBot's Box runtime: the actions (PROTOCOLS.md 2.4-2.6). Each is the same operation of
// service/ that the REST routes call (Sessions, Exec, Processes), with LangBot's ids, shapes and
// error classes around it.

#include <boost/asio/co_spawn.hpp>
#include <string>
#include <vector>

#include "common/log.h"
#include "dialects/langbot/internal.h"
#include "server/internal/blocking.h"
#include "server/json_codec.h"
#include "service/services.h"

namespace agentbox::server::detail::langbot {

asio::awaitable<Result<std::vector<session::SessionInfo>>> list_prefixed(Context* ctx,
                                                                         service::Origin origin,
                                                                         std::string prefix) {
  auto all = co_await ctx->svc->sessions.list(origin);
  if (!all) co_return std::unexpected(all.error());
  std::vector<session::SessionInfo> out;
  for (auto& s : *all) {
    if (s.id.starts_with(prefix) && s.id.size() > prefix.size()) out.push_back(std::move(s));
  }
  co_return out;
}

namespace {

LbResult<std::string> data_key(const Act* a, const char* k) {
  auto it = a->data.find(k);
  if (it == a->data.end()) return lb_fail("KeyError", std::string("'") + k + "'");
  if (!it->is_string()) return lb_fail("BoxValidationError", std::string(k) + " must be a string");
  return it->get<std::string>();
}

// The physical id of the request's data.session_id (KeyError when missing).
LbResult<std::string> data_session(const Act* a) {
  auto sid = data_key(a, "session_id");
  if (!sid) return std::unexpected(sid.error());
  return physical_id(*a->place, *sid);
}

// The session of `spec` (runtime._get_or_create_session): made if missing; an existing one
// must have the same fields (BoxSessionConflictError naming the first that differs), except
// extra_mounts, whose change recreates it.
asio::awaitable<LbResult<session::SessionInfo>> ensure_session(Act* a, const BoxSpec& spec,
                                                               std::string physical) {
  service::Sessions& sessions = a->ctx->svc->sessions;
  auto have = co_await sessions.get(a->origin(), physical);
  if (have) {
    ojson old = stored_shape(*have);
    bool mounts_changed = false;
    for (auto it = spec.shape.begin(); it != spec.shape.end(); ++it) {
      if (!old.contains(it.key()) || old[it.key()] == it.value()) continue;
      if (it.key() == "extra_mounts") {
        mounts_changed = true;
        continue;
      }
      co_return lb_fail("BoxSessionConflictError", "Box session " + physical +
                                                       " already exists with " + it.key() + "=" +
                                                       py_str(old[it.key()]));
    }
    if (!mounts_changed) co_return *have;
    auto gone = co_await sessions.destroy(a->origin(), physical, false);
    if (!gone && gone.error().code != Code::kNotFound) {
      co_return std::unexpected(lb_error(gone.error(), About::kSession));
    }
  } else if (have.error().code != Code::kNotFound) {
    co_return std::unexpected(lb_error(have.error(), About::kSession));
  }
  auto want = session_spec(spec.shape);
  if (!want) co_return std::unexpected(want.error());
  auto made = co_await sessions.create(a->origin(), physical, std::move(*want));
  if (!made) co_return std::unexpected(lb_error(made.error(), About::kSession));
  co_return made->first;
}

// The live box of session `physical` (resumed when suspended).
asio::awaitable<LbResult<service::Lease>> lease_of(Act* a, std::string physical) {
  auto lease = co_await a->ctx->svc->sessions.lease(a->origin(), physical, false);
  if (!lease) co_return std::unexpected(session_error(lease.error(), physical));
  co_return std::move(*lease);
}

// The process table of session `physical`'s live box.
asio::awaitable<LbResult<service::ProcTarget>> target_of(Act* a, std::string physical) {
  auto t = co_await a->ctx->svc->processes.target(a->origin(), physical, false);
  if (!t && t.error().code == Code::kNotSupported) {
    co_return lb_fail("BoxBackendUnavailableError",
                      "the backend of session " + physical + " runs no managed processes");
  }
  if (!t) co_return std::unexpected(session_error(t.error(), physical));
  co_return std::move(*t);
}

std::string stderr_preview(sandbox::ProcessTable* t, const std::string& pid) {
  std::string err;
  std::optional<std::uint64_t> since;
  for (int i = 0; i < 64; ++i) {
    auto b = t->output(pid, since);
    if (!b || b->records.empty()) break;
    for (const auto& r : b->records) {
      if (r.type == sandbox::OutputRecord::Type::kStderr) err += r.data;
    }
    if (err.size() > 2 * kStderrPreview) err.erase(0, err.size() - kStderrPreview);
    if (b->ended) break;
    since = b->next;
  }
  if (err.size() > kStderrPreview) {
    std::size_t cut = err.size() - kStderrPreview;
    while (cut < err.size() && (static_cast<unsigned char>(err[cut]) & 0xC0) == 0x80) ++cut;
    err.erase(0, cut);
  }
  return err;
}

ojson process_info(Act* a, const std::string& physical, sandbox::ProcessTable* t,
                   const sandbox::ProcessInfo& p) {
  const std::string pid = std::to_string(p.pid);
  bool attached = false;
  if (p.state == sandbox::ProcessState::kRunning) {
    auto probe = t->attach(pid);  // released at once: only asks whether another holds it
    attached = !probe && probe.error().code == Code::kExists;
  }
  ojson env_keys = ojson::array();
  if (auto it = a->st->env_keys.find(physical + "/" + p.tag); it != a->st->env_keys.end()) {
    for (const auto& k : it->second) env_keys.push_back(k);
  }
  ojson args = ojson::array();
  for (std::size_t i = 1; i < p.argv.size(); ++i) args.push_back(p.argv[i]);
  ojson j = ojson::object();
  j["session_id"] = logical_id(*a->place, physical);
  j["process_id"] = p.tag;
  j["status"] = p.state == sandbox::ProcessState::kRunning ? "running" : "exited";
  j["command"] = p.argv.empty() ? p.command : p.argv[0];
  j["args"] = std::move(args);
  j["cwd"] = p.cwd;
  j["env_keys"] = std::move(env_keys);
  j["attached"] = attached;
  j["started_at"] = rfc3339(p.started_at);
  j["exited_at"] = p.ended_at ? ojson(rfc3339(*p.ended_at)) : ojson(nullptr);
  j["exit_code"] = p.exit_code && p.state != sandbox::ProcessState::kRunning ? ojson(*p.exit_code)
                                                                             : ojson(nullptr);
  j["stderr_preview"] = stderr_preview(t, pid);
  return j;
}

// ---- the actions

ActResult act_ping(Act*) {
  co_return ojson::object();
}

ActResult act_init(Act* a) {
  if (!a->data.is_object())
    co_return lb_fail("BoxValidationError", "box_init data must be an object");
  // LangBot's `box` config section (backend, local, limits, profile): agentboxd's own config
  // governs its boxes; the keys are logged, never taken as applied.
  std::string keys;
  for (auto it = a->data.begin(); it != a->data.end(); ++it)
    keys += (keys.empty() ? "" : ",") + it.key();
  spdlog::info("langbot: box_init (keys: {}); agentboxd's own config governs backend and limits",
               keys);
  ojson r = ojson::object();
  r["initialized"] = true;
  co_return r;
}

ActResult act_backend_info(Act* a) {
  std::shared_ptr<sandbox::Backend> backend = a->ctx->default_backend;
  auto job = run_blocking(a->ctx->pool, [backend]() -> Status {
    if (!backend) return fail(Code::kUnavailable, "no default backend");
    return backend->check_usable();
  });
  auto usable = co_await std::move(job);
  ojson r = ojson::object();
  r["name"] = backend ? ojson("agentbox-" + std::string(backend->name())) : ojson(nullptr);
  r["available"] = usable.has_value();
  co_return r;
}

ActResult act_status(Act* a) {
  auto list = co_await list_prefixed(a->ctx, a->origin(), a->place->prefix);
  if (!list) co_return std::unexpected(lb_error(list.error(), About::kSession));
  auto backend = co_await act_backend_info(a);
  ojson limits = ojson::object();
  limits["max_sessions"] = a->caller.max_sessions;
  limits["max_managed_processes"] = sandbox::ProcessTable::kMaxLive;
  limits["max_completed_processes"] = sandbox::ProcessTable::kMaxEnded;
  limits["max_admission_records"] = 0;
  limits["max_rpc_file_bytes"] = 0;
  ojson r = ojson::object();
  r["backend"] = *backend;
  r["active_sessions"] = list->size();
  r["managed_processes"] = 0;  // as the SDK at 02623a28 (PROTOCOLS.md 2.5)
  r["session_ttl_sec"] = a->ctx->svc->manager().config().default_ttl_sec;
  r["limits"] = std::move(limits);
  co_return r;
}

ActResult act_create_session(Act* a) {
  auto spec = decode_box_spec(a->data, false);
  if (!spec) co_return std::unexpected(spec.error());
  auto physical = physical_id(*a->place, spec->session_id);
  if (!physical) co_return std::unexpected(physical.error());
  auto info = co_await ensure_session(a, *spec, *physical);
  if (!info) co_return std::unexpected(info.error());
  auto box = co_await lease_of(a, *physical);  // the box is up, as the SDK's container
  if (!box) co_return std::unexpected(box.error());
  co_return session_info(*a->place, *info);
}

// Python's str.strip() of command output, and the SDK's cap with a clip notice.
std::string clip_output(std::string s, bool truncated) {
  s = py_strip(s);
  if (truncated) s += "\n... [output truncated at 1 MiB]";
  return s;
}

asio::awaitable<void> wait_stop(std::shared_ptr<LangbotAction> ctl, bool* gone) {
  co_await ctl->timer.async_wait(kTuple);
  if (ctl->stopped) *gone = true;
}

ActResult act_exec(Act* a) {
  auto spec = decode_box_spec(a->data, true);
  if (!spec) co_return std::unexpected(spec.error());
  auto physical = physical_id(*a->place, spec->session_id);
  if (!physical) co_return std::unexpected(physical.error());
  auto info = co_await ensure_session(a, *spec, *physical);
  if (!info) co_return std::unexpected(info.error());
  auto lease = co_await lease_of(a, *physical);
  if (!lease) co_return std::unexpected(lease.error());
  std::shared_ptr<sandbox::Sandbox> box = lease->box;
  {
    // As LangBot's runtime: a workdir that does not exist yet is made (as the session user)
    // before the command runs.
    std::shared_ptr<sandbox::Sandbox> b = box;
    std::string wd = spec->workdir;
    auto job = run_blocking(a->ctx->pool, [b, wd]() -> Status { return b->mkdir_all(wd); });
    auto made = co_await std::move(job);
    if (!made) co_return std::unexpected(lb_error(made.error(), About::kSession));
  }
  sandbox::ExecSpec es;
  es.command = spec->cmd;
  es.cwd = spec->workdir;
  es.env = spec->env;
  es.timeout = std::chrono::seconds(spec->timeout_sec);
  es.max_output_bytes = kExecOutputCap;
  bool gone = false;
  service::StopSignal stop{wait_stop(a->ctl, &gone), &gone};
  auto ran = co_await a->ctx->svc->exec.run(a->origin(), std::move(*lease), std::move(es), nullptr,
                                            std::move(stop));
  if (!ran)
    co_return lb_fail(
        "BoxError",
        "the command was stopped: its placement generation is stale or its connection closed");
  if (!*ran) co_return std::unexpected(lb_error(ran->error(), About::kSession));
  const sandbox::ExecResult& r = **ran;
  ojson j = ojson::object();
  j["session_id"] = logical_id(*a->place, *physical);
  j["backend_name"] = "agentbox-" + info->backend;
  j["status"] = r.timed_out ? "timed_out" : "completed";
  j["ok"] = !r.timed_out && r.exit_code == 0;
  j["exit_code"] = r.timed_out ? ojson(nullptr) : ojson(r.exit_code);
  j["stdout"] = clip_output(r.stdout_data, r.stdout_truncated);
  j["stderr"] = clip_output(r.stderr_data, r.stderr_truncated);
  j["stdout_truncated"] = r.stdout_truncated;
  j["stderr_truncated"] = r.stderr_truncated;
  j["duration_ms"] = r.duration.count();
  if (r.timed_out) {
    // As the SDK's runtime: a timed-out exec takes its session with it (the next exec starts a
    // fresh one).
    box.reset();
    auto gone_st = co_await a->ctx->svc->sessions.destroy(a->origin(), *physical, false);
    if (!gone_st)
      spdlog::warn("langbot: deleting timed-out session {}: {}", *physical,
                   gone_st.error().message);
  }
  co_return j;
}

ActResult act_get_session(Act* a) {
  auto physical = data_session(a);
  if (!physical) co_return std::unexpected(physical.error());
  auto info = co_await a->ctx->svc->sessions.get(a->origin(), *physical);
  if (!info) co_return std::unexpected(session_error(info.error(), *physical));
  ojson j = session_info(*a->place, *info);
  // The managed processes of a running box (a suspended one runs none).
  std::shared_ptr<sandbox::Sandbox> box =
      co_await a->ctx->svc->sessions.lease_running(a->origin(), *physical);
  if (box && box->processes() != nullptr) {
    sandbox::ProcessTable* t = box->processes();
    ojson procs = ojson::object();
    for (const auto& p : t->list()) {
      if (p.tag.empty()) continue;
      auto gone = a->st->stopped.find(*physical + "/" + p.tag);
      if (gone != a->st->stopped.end() && gone->second == p.pid) continue;
      procs[p.tag] = process_info(a, *physical, t, p);  // newest last: it wins
    }
    if (!procs.empty()) {
      if (procs.contains("default")) j["managed_process"] = procs["default"];
      j["managed_processes"] = std::move(procs);
    }
  }
  co_return j;
}

ActResult act_get_sessions(Act* a) {
  auto list = co_await list_prefixed(a->ctx, a->origin(), a->place->prefix);
  if (!list) co_return std::unexpected(lb_error(list.error(), About::kSession));
  ojson arr = ojson::array();
  for (const auto& s : *list) arr.push_back(session_info(*a->place, s));
  ojson r = ojson::object();
  r["sessions"] = std::move(arr);
  co_return r;
}

ActResult act_delete_session(Act* a) {
  auto sid = data_key(a, "session_id");
  if (!sid) co_return std::unexpected(sid.error());
  auto physical = physical_id(*a->place, *sid);
  if (!physical) co_return std::unexpected(physical.error());
  auto st = co_await a->ctx->svc->sessions.destroy(a->origin(), *physical, false);
  if (!st) co_return std::unexpected(session_error(st.error(), *physical));
  for (auto it = a->st->env_keys.lower_bound(*physical + "/");
       it != a->st->env_keys.end() && it->first.starts_with(*physical + "/");) {
    it = a->st->env_keys.erase(it);
  }
  for (auto it = a->st->stopped.lower_bound(*physical + "/");
       it != a->st->stopped.end() && it->first.starts_with(*physical + "/");) {
    it = a->st->stopped.erase(it);
  }
  ojson r = ojson::object();
  r["deleted"] = *sid;
  co_return r;
}

// The session's table and process `process_id` of a get/stop.
struct Found {
  service::ProcTarget target;
  std::string process_id;
  sandbox::ProcessInfo info;
};

ActResult act_start_process(Act* a) {
  auto physical = data_session(a);
  if (!physical) co_return std::unexpected(physical.error());
  auto it = a->data.find("spec");
  if (it == a->data.end()) co_return lb_fail("KeyError", "'spec'");
  auto spec = decode_proc_spec(*it);
  if (!spec) co_return std::unexpected(spec.error());
  auto target = co_await target_of(a, *physical);
  if (!target) co_return std::unexpected(target.error());
  sandbox::ProcessTable* table = target->table;
  sandbox::ProcessSpec ps;
  ps.argv = spec->argv;
  ps.cwd = spec->cwd;
  ps.env = spec->env;
  ps.tag = spec->process_id;
  ps.stdin_open = true;
  auto started =
      co_await a->ctx->svc->processes.start(a->origin(), std::move(*target), std::move(ps));
  if (!started) {
    if (started.error().code == Code::kExists) {
      co_return lb_fail(
          "BoxManagedProcessConflictError",
          "managed process " + spec->process_id + " is already running in session " + *physical);
    }
    co_return std::unexpected(lb_error(started.error(), About::kProcess));
  }
  std::vector<std::string> keys;
  for (const auto& kv : spec->env) keys.push_back(kv.first);  // std::map: sorted
  a->st->env_keys[*physical + "/" + spec->process_id] = std::move(keys);
  a->st->stopped.erase(*physical + "/" + spec->process_id);
  co_return process_info(a, *physical, table, *started);
}

asio::awaitable<LbResult<Found>> find_process(Act* a) {
  auto physical = data_session(a);
  if (!physical) co_return std::unexpected(physical.error());
  auto pit = a->data.find("process_id");
  if (pit == a->data.end()) co_return lb_fail("KeyError", "'process_id'");
  auto pid = process_id_of(*pit);
  if (!pid) co_return std::unexpected(pid.error());
  auto target = co_await target_of(a, *physical);
  if (!target) co_return std::unexpected(target.error());
  auto info = target->table->get(*pid);
  auto gone = a->st->stopped.find(*physical + "/" + *pid);
  if (!info || (gone != a->st->stopped.end() && gone->second == info->pid)) {
    co_return lb_fail("BoxManagedProcessNotFoundError",
                      "managed process " + *pid + " not found in session " + *physical);
  }
  Found f;
  f.target = std::move(*target);
  f.process_id = *pid;
  f.info = *info;
  co_return f;
}

ActResult act_get_process(Act* a) {
  auto f = co_await find_process(a);
  if (!f) co_return std::unexpected(f.error());
  co_return process_info(a, f->target.lease.id, f->target.table, f->info);
}

ActResult act_stop_process(Act* a) {
  auto f = co_await find_process(a);
  if (!f) co_return std::unexpected(f.error());
  const std::string key = f->target.lease.id + "/" + f->process_id;
  auto info = co_await a->ctx->svc->processes.kill(a->origin(), std::move(f->target),
                                                   std::to_string(f->info.pid));
  if (!info) co_return std::unexpected(lb_error(info.error(), About::kProcess));
  a->st->stopped[key] = f->info.pid;
  ojson r = ojson::object();
  r["stopped"] = f->process_id;
  co_return r;
}

// box_shutdown: the runtime stops its boxes. Here: LangBot's running sessions are suspended
// (their workspaces stay; the next use resumes them).
ActResult act_shutdown(Act* a) {
  service::Sessions& sessions = a->ctx->svc->sessions;
  auto all = co_await sessions.list(a->origin());
  std::vector<std::string> running;
  if (all) {
    for (const auto& s : *all) {
      if (s.id.starts_with("ws-") && s.state == session::State::kRunning) running.push_back(s.id);
    }
  }
  std::size_t n = 0;
  for (const std::string& id : running) {
    auto done = co_await sessions.suspend(a->origin(), id);
    if (done) ++n;
  }
  spdlog::info("langbot: box_shutdown suspended {} session(s)", n);
  co_return ojson::object();
}

ActResult act_skill_store(Act* a) {
  co_return lb_fail("BoxError", a->action +
                                    " is not built in agentbox: there is no skill store (mount "
                                    "skills into sessions with extra_mounts)");
}

ActResult act_admission(Act* a) {
  co_return lb_fail("BoxError", a->action +
                                    " is not built in agentbox: admission grants are "
                                    "not supported (quotas are agentboxd's tenants)");
}

ActResult act_file_chunk(Act*) {
  co_return lb_fail("BoxError",
                    "__file_chunk is not built in agentbox: file uploads serve only "
                    "the skill store, which is not built");
}

constexpr ActionDef kActions[] = {
    {"__ping", false, act_ping},
    {"__file_chunk", false, act_file_chunk},
    {"box_health", false, act_backend_info},
    {"box_get_backend_info", false, act_backend_info},
    {"box_init", false, act_init},
    {"box_upsert_sandbox_admission_grant", false, act_admission},
    {"box_revoke_sandbox_admission_grant", false, act_admission},
    {"box_verify_shared_workspace", false, act_admission},
    {"box_shutdown", false, act_shutdown},
    {"box_status", true, act_status},
    {"box_create_session", true, act_create_session},
    {"box_exec", true, act_exec},
    {"box_get_session", true, act_get_session},
    {"box_get_sessions", true, act_get_sessions},
    {"box_delete_session", true, act_delete_session},
    {"box_start_managed_process", true, act_start_process},
    {"box_get_managed_process", true, act_get_process},
    {"box_stop_managed_process", true, act_stop_process},
    {"box_list_skills", true, act_skill_store},
    {"box_get_skill", true, act_skill_store},
    {"box_create_skill", true, act_skill_store},
    {"box_update_skill", true, act_skill_store},
    {"box_delete_skill", true, act_skill_store},
    {"box_scan_skill_directory", true, act_skill_store},
    {"box_list_skill_files", true, act_skill_store},
    {"box_read_skill_file", true, act_skill_store},
    {"box_write_skill_file", true, act_skill_store},
    {"box_preview_skill_zip", true, act_skill_store},
    {"box_install_skill_zip", true, act_skill_store},
};

}  // namespace

const ActionDef* find_action(std::string_view name) {
  for (const ActionDef& d : kActions) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

}  // namespace agentbox::server::detail::langbot
