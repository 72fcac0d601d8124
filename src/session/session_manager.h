#pragma once
// Sessions (shared/DESIGN.md, "Sessions"): create-or-get by id, one live Sandbox per running
// session, workspaces under data_dir/workspaces/<id>. Thread-safe: every public method may be
// called from any thread. Nothing here knows about HTTP.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "image/store.h"
#include "net/proxy.h"
#include "sandbox/process_table.h"
#include "sandbox/sandbox.h"
#include "session/events.h"
#include "workspace/workspaces.h"

namespace agentbox::session {

class TemplateManager;  // session/template_manager.h

struct NetworkSpec {
  std::string mode = "none";  // none | allowlist | open
  std::vector<std::string> allow;
};

struct MountSpec {
  std::string host_path;
  std::string mount_path;
  std::string mode = "rw";  // rw | ro | none
};

// Everything a client may set at creation (API.md "Sessions"); all optional.
struct SessionSpec {
  std::string backend;  // "" = the daemon's default
  std::string template_name;
  // The template's snapshot the session started on (resolved at create; kept for its life):
  // its workspace is an overlay over it (session/template_manager.h). "" = a plain workspace.
  std::string snapshot;
  std::uint64_t template_version = 0;
  std::string runner;  // backend "remote": the runner user serving the session
  std::vector<MountSpec> mounts;
  // Seed 002's primary mount as the client gave it (host_path "" = none; session/host_workspace.h).
  // With mount_path /workspace and mode rw|ro the host dir *is* the workspace; elsewhere it is
  // also one of `mounts`; mode none mounts nothing (the session has its own workspace).
  MountSpec primary;
  std::map<std::string, std::string> skills;  // name -> host dir, at /workspace/.skills/<name>
  std::set<std::string> read_only_skills;     // skills mounted ro; the others rw (seed 002)
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> labels;
  sandbox::Limits limits;
  NetworkSpec network;
  std::optional<std::int64_t> ttl_sec;  // idle seconds before the reaper acts; 0 = never
  // API.md "Images": the image the box's root is made of, as asked and as resolved at create
  // (kept for the session's life); "" = the host's root. read_only_rootfs false: the session
  // has a writable root layer of its own (session_images.cc).
  std::string image_ref;
  std::string image_digest;
  bool read_only_rootfs = true;
};

enum class State { kRunning, kSuspended };
std::string_view state_name(State s);

struct SessionInfo {
  std::string id;
  State state = State::kRunning;
  std::string backend;
  std::string workspace;  // as commands see it
  std::chrono::system_clock::time_point created_at;
  std::chrono::system_clock::time_point last_used_at;
  SessionSpec spec;
  std::optional<uid_t> uid;
  std::string tenant;  // who created it (Caller::tenant)
};

// Who is asking (DESIGN.md "tenant"). A session belongs to the tenant that created it; a
// non-admin caller sees only its own, and another tenant's session is to it exactly a session
// that does not exist (ENOENT, same message). Ids stay one global namespace (one workspace dir,
// one uid each), so creating an id another tenant holds fails with EEXIST ("already in use"),
// which says nothing about the owner (docs/architecture.md, "Tenants").
//
// SECURITY: there is no default caller (no default constructor, no `= {}` arguments): every
// call names who asks, so a route that forgets the caller does not compile (fail closed).
struct Caller {
  Caller(std::string tenant_name, bool is_admin, std::size_t max)
      : tenant(std::move(tenant_name)), admin(is_admin), max_sessions(max) {}
  // The daemon acting on its own account (internals, the reaper, tests): an admin whose
  // sessions belong to tenant "default", the tenant of a daemon without a tenants list.
  static Caller daemon() { return Caller("default", true, 0); }

  std::string tenant;
  bool admin;
  std::size_t max_sessions;  // sessions this tenant may hold; 0 = no limit
};

// Session ids: [A-Za-z0-9._-]{1,128}, not "." or "..".
Status validate_id(std::string_view id);
// Renders a scope template: "{name}" -> vars[name], a missing variable -> "unknown"; the result
// must be a valid id (EINVAL naming the template otherwise).
Result<std::string> render_scope(std::string_view tmpl,
                                 const std::map<std::string, std::string>& vars);
// The first uid probe (seed 001): FNV32(id) % 60000 + 10000, with FNV-1 (Go's fnv.New32).
uid_t first_uid_probe(std::string_view id);

struct ManagerConfig {
  std::string data_dir;  // exists; workspaces go under data_dir/workspaces/
  // Absolute: workspaces at workspaces_dir/<id> instead (seed 001's --workdir). "" = default.
  std::string workspaces_dir;
  std::string default_backend;
  // --default-runner: a spec without a backend gets backend "remote" and this runner ("" = none).
  std::string default_runner;
  std::map<std::string, std::shared_ptr<sandbox::Backend>> backends;  // by name
  // Mounted read-only into every box at /shared/<box_path> (box_path is the prefix of
  // --shared-dirs prefix:path); an absolute box_path is used as given.
  std::vector<sandbox::BindMount> shared_dirs;
  // SECURITY: a spec's mounts and skills may only name host paths under one of these (after
  // resolving symlinks); none configured means client-chosen host mounts are refused (EACCES).
  std::vector<std::string> allowed_mount_roots;
  // Seed 000 (xbot): every dir under global_skills_dir holding a SKILL.md appears read-only in
  // every box at /workspace/.skills/<name> (a session's own skill of that name wins), and
  // agents_dir read-only at /workspace/.agents. Read at each box start. "" = none.
  std::string global_skills_dir;
  std::string agents_dir;
  // Boxes up at once, all tenants together (0 = no limit): a create or resume past it is
  // EQUOTA. (Evicting an idle box instead needs suspend; not here yet.)
  std::size_t max_running_boxes = 0;
  // At max_running_boxes, suspend the least recently used idle box (no command running, no
  // request in flight) to make room instead of answering EQUOTA.
  bool evict_idle = false;
  // Bounds of POST /restore; archives are read only from data_dir/archives.
  workspace::ExtractLimits restore_limits;
  // Sessions live in data_dir/state.db and come back (suspended) after a restart or a crash.
  // false: in memory only (throwaway daemons; the persistence benchmark's baseline).
  bool persist = true;
  // The reaper: a session idle (no API use and no command running) for its ttl_sec, or this
  // default when its spec has none, is suspended, or destroyed when ttl_destroys. 0 = never.
  std::int64_t default_ttl_sec = 0;
  bool ttl_destroys = false;
  // Limits a session's spec leaves unset take these at create and at load, so the session
  // shows its effective limits (the daemon passes the config's default_limits over
  // sandbox/default_limits.h's built-in ones). Unset here: left unset.
  sandbox::Limits default_limits;
  // Every 403 of a session's egress proxy (network mode allowlist): session id, its tenant and
  // the denial. Called on the backend's proxy thread; must not block. Empty: not reported.
  std::function<void(const std::string& id, const std::string& tenant, const net::DenyEvent&)>
      on_net_deny;
  // Templates (session/template_manager.h): a spec's "template" is resolved there and its
  // workspace mounted as an overlay over the snapshot. Null: a "template" is ENOTSUP.
  std::shared_ptr<TemplateManager> templates;
  // The image store (API.md "Images"); null: a create naming `image` is ENOTSUP.
  std::shared_ptr<image::ImageStore> images;
  // The image of a new session that names no image and no template, on a backend that makes
  // image roots (config `default_image`, seed 003's docker mode); "" = the host's root.
  std::string default_image;
  // Called when a suspended session's box has started again (a resume, by any use), before the
  // box is handed to anyone, so the first command of that resume sees what it did (seed 004's
  // auto_repair: service/resume_repair.h). On the resuming thread, without the manager's lock;
  // the session stays "starting" meanwhile (other users of it wait). Blocking. Empty: none.
  std::function<void(const SessionInfo& info, const std::shared_ptr<sandbox::Sandbox>& box)>
      on_resume;
  // How often the reaper looks, and how often batched last-used times reach the database.
  std::chrono::milliseconds reaper_interval{1000};
};

class Store;

class SessionManager {
 public:
  static Result<std::unique_ptr<SessionManager>> open(ManagerConfig config);
  ~SessionManager();

  // Returns the session and whether it was created now. An existing id returns it unchanged.
  // Another tenant's id is EEXIST; past a quota EQUOTA naming it.
  Result<std::pair<SessionInfo, bool>> create_or_get(const std::string& id, const SessionSpec& spec,
                                                     const Caller& caller);
  Result<SessionInfo> get(const std::string& id, const Caller& caller);
  std::vector<SessionInfo> list(const Caller& caller);  // sorted by id; the caller's only
  // Tears the box down and deletes the workspace.
  Status destroy(const std::string& id, const Caller& caller);
  // Same, but first writes the workspace to data_dir/archives/<id>-<UTC time>.tar.zst (fsynced
  // before the workspace goes). Returns the archive's path. If archiving fails the session stays
  // (suspended) with its workspace.
  Result<std::string> destroy_archived(const std::string& id, const Caller& caller);
  // Makes session `id` from an archive under data_dir/archives (absolute path, or relative to
  // that dir): EEXIST if the id exists (any tenant), EACCES if the archive lies elsewhere,
  // EINVAL if it is missing or not a tar.zst, EACCES/ETOOBIG for hostile content (archive.h).
  // A failed restore leaves no session and no workspace.
  Result<SessionInfo> restore(const std::string& id, const std::string& archive,
                              const Caller& caller);
  // Where archives are written and restored from.
  std::string archives_dir() const { return config_.data_dir + "/archives"; }

  // The live sandbox of a session for exec and file work; creates the session with default
  // spec first when create_if_missing (exec routes), else ENOENT. Marks the session used.
  // Another tenant's session is ENOENT even with create_if_missing. A session made or resumed
  // here is told to the subscribers (kCreated / kResumed, cause kApi).
  Result<std::shared_ptr<sandbox::Sandbox>> acquire(const std::string& id, bool create_if_missing,
                                                    const Caller& caller);

  // running -> suspended: the box goes down (its processes die), the workspace and the uid stay.
  // Suspending a suspended session is a no-op. The next use resumes it.
  Result<SessionInfo> suspend(const std::string& id, const Caller& caller);
  // acquire() of a session that is running, without ever blocking (callable on a network
  // thread): nullptr when that would wait or do work (not running, mid-transition, not visible,
  // or the manager's lock is busy); then call acquire() from a thread that may block.
  std::shared_ptr<sandbox::Sandbox> try_acquire_running(const std::string& id,
                                                        const Caller& caller);
  // acquire() of a session that is running, else nullptr (never resumes it); may block.
  std::shared_ptr<sandbox::Sandbox> acquire_running(const std::string& id, const Caller& caller);
  // suspended -> running (a running session is returned as it is).
  Result<SessionInfo> resume(const std::string& id, const Caller& caller);

  // Managed processes (API.md "Processes and terminals"): their specs are part of the session's
  // state (in the database with it), so that they run again in every box the session gets: the
  // server starts them when the session resumes (a kResumed event), and resume_managed() resumes
  // the sessions that have some when the daemon starts. Keyed by ProcessSpec::key; a session's
  // go with it. ENOENT for an unknown session. Blocking (a durable write).
  Status save_managed(const std::string& id, const sandbox::ProcessSpec& spec);
  Status forget_managed(const std::string& id, const std::string& key);
  std::vector<sandbox::ProcessSpec> managed_specs(const std::string& id);
  // Resumes every suspended session that has managed processes (events kResumed, cause
  // kStartup); returns how many came up. Called once, when the daemon starts serving.
  std::size_t resume_managed();
  // Marks the session used now, extending its TTL, without resuming it.
  Result<SessionInfo> keepalive(const std::string& id, const Caller& caller);

  // One reaper pass (the background thread runs it every reaper_interval); returns how many
  // sessions it suspended or destroyed. Exposed for tests.
  std::size_t reap_idle();
  // Writes batched last-used times to the database (the reaper does this every interval).
  void flush_used();

  // POST /v1/sessions/{id}/network: a new mode or allowlist for a session (running or
  // suspended), stored in the spec. A running box switches mode live (Sandbox::set_network:
  // new connections follow the new mode, what it no longer allows is cut) or its proxy takes
  // the new allowlist. EINVAL naming a malformed entry; ENOTSUP (naming network.mode) from a
  // backend that cannot switch live; nothing half-applied. An event kUpdated ("network").
  Result<SessionInfo> set_network(const std::string& id, const NetworkSpec& network,
                                  const Caller& caller);
  // POST /v1/sessions/{id}/mounts: more mounts and skills (`add`: its mounts, skills and
  // read_only_skills) for an existing session. Checked as at create (EINVAL, EACCES outside the
  // allowed roots, ENOENT for a missing host path), plus: a target the session has already (a
  // mount, a skill, a shared dir) is EINVAL, and the backend must be able to bind each one now
  // (Backend::check_mounts: a rw mount it cannot idmap fails here, not at the next start).
  // Then recorded in the spec (kept across suspend/resume, restarts and archives) and, if the
  // box runs, put into it when that can be done safely. Nothing half-applied: on an error the
  // spec and the box are as before.
  struct MountsAdded {
    SessionInfo info;
    bool live = false;  // in the running box now; else from its next start
  };
  Result<MountsAdded> add_mounts(const std::string& id, const SessionSpec& add,
                                 const Caller& caller);

  // PATCH /v1/sessions/{id} (API.md "Live changes to a session"): what is set changes, the rest
  // stays. limits: the fields given over the session's effective ones (EINVAL naming the field
  // when out of range, or when tmp_mb would exceed half of memory_mb); a running box gets
  // memory_mb, cpu_percent and max_pids in its cgroup now and cpu_time_sec for its next
  // commands (Sandbox::set_limits); tmp_mb and max_open_files are ENOTSUP naming the field on a
  // running session (they are fixed when the box starts: a suspended one takes them at resume);
  // disk_mb is ENOTSUP whenever it differs (the workspace's disk is sized when it is made).
  // Stored in the database (resume and restart keep it); nothing half-applied; an event
  // kUpdated naming what changed. Blocking.
  struct Update {
    std::optional<sandbox::Limits> limits;
    std::optional<std::int64_t> ttl_sec;
    std::optional<std::map<std::string, std::string>> labels;  // replaces the labels
    std::string limits_field = "limits";  // names the limits in errors (seed 001: "cgroup")
  };
  Result<SessionInfo> update(const std::string& id, const Update& update, const Caller& caller);

  // What a session uses now (API.md "Usage"): its box's memory, CPU time and tasks while it runs
  // (`box` nullopt while suspended), and what the files under its workspace take on disk
  // (`workspace_bytes`, nullopt for a workspace that is a host dir: seed 002's primary mount).
  // Never resumes the session and is not a use of it (a dashboard watching a session does not
  // keep it alive). ENOENT as get(); ENOTSUP naming the backend when it does not measure
  // usage (Backend::measures_usage). Blocking: reads cgroup files and walks the workspace.
  struct Usage {
    SessionInfo info;
    std::optional<sandbox::BoxUsage> box;
    std::optional<std::uint64_t> workspace_bytes;
  };
  Result<Usage> usage(const std::string& id, const Caller& caller);

  // The egress proxy counters of every running session that has one, by session id.
  std::map<std::string, net::ProxyCounters> egress_counters();

  // Counts for /metrics.
  std::map<std::string, std::size_t> count_by_state();
  // For GET /healthz (LangBot's liveness "resources"): sessions, running boxes and managed
  // (restartable) processes. Never blocks: while the manager is busy it answers the counts it
  // last took.
  struct Liveness {
    std::size_t sessions = 0;
    std::size_t running = 0;
    std::size_t managed_processes = 0;
  };
  Liveness liveness();

  // Kills every box (daemon shutdown) and unmounts the capped (disk_mb) workspaces, whose
  // images stay. Workspaces stay.
  void shutdown_all();

  const ManagerConfig& config() const { return config_; }

  // Every later lifecycle event (events.h) goes to `fn` until the returned handle is dropped.
  // Thread-safe; subscribers are called in the order they subscribed.
  [[nodiscard]] std::shared_ptr<void> subscribe(EventSubscriber fn);

 private:
  SessionManager(ManagerConfig config, workspace::Workspaces workspaces);
  struct Entry;
  struct BoxStart;
  struct Lease;
  Result<std::shared_ptr<sandbox::Sandbox>> acquire_impl(const std::string& id,
                                                         bool create_if_missing,
                                                         const Caller& caller, EventCause cause);
  // Loads the database into sessions_ (all suspended) and reports what does not match the disk.
  Status load_locked();
  // Removes temp files of writes a crash interrupted (older than this daemon) from workspaces.
  void sweep_temp_files();
  void reaper_loop();
  // Whether e may be reaped or evicted now: settled, no lease out, unused for ttl. mu_ held.
  bool idle_locked(const Entry& e, std::int64_t now_ms, std::int64_t ttl_ms) const;
  // Takes a running, settled entry's box down; unlocks mu_ while it waits. mu_ held on entry
  // and exit.
  void suspend_locked(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Entry>& e);
  // suspend_locked() on the daemon's own account (reaper, eviction), then the subscribers are
  // told `cause` and `reason` with mu_ released. mu_ held on entry and exit.
  void suspend_for_locked(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Entry>& e,
                          EventCause cause, std::string_view reason);
  // Under max_running_boxes, evicting idle boxes if configured, else EQUOTA. May unlock mu_.
  Status make_room_locked(std::unique_lock<std::mutex>& lk, const std::string& id);
  // A lease on a running box: what acquire() hands out. mu_ held.
  std::shared_ptr<sandbox::Sandbox> lease_locked(const std::shared_ptr<Entry>& e);
  // Checks quotas, allocates the uid and registers a kCreating entry. mu_ held.
  Result<std::shared_ptr<Entry>> create_locked(const std::string& id, const SessionSpec& spec,
                                               const Caller& caller);
  static bool visible(const Entry& e, const Caller& caller);
  // Boxes up or starting (max_running_boxes counts these). mu_ held.
  std::size_t running_locked() const;
  Status check_running_quota_locked(const std::string& id) const;
  // if_idle_ttl_ms > 0: only if the session is still idle for that long (the reaper), which
  // passes cause kReaper and its reason (the event's detail; an archive's path otherwise).
  Result<std::string> destroy_impl(const std::string& id, const Caller& caller, bool archive,
                                   std::int64_t if_idle_ttl_ms, EventCause cause,
                                   std::string_view reason);
  SessionInfo info_locked(const Entry& e) const;
  // The binds of a spec's own mounts and skills, host paths resolved and checked against the
  // allowed roots; each named by its field ("mounts[0]", "skills.web") for errors.
  Result<std::vector<sandbox::BindMount>> spec_binds(const SessionSpec& spec) const;
  // The daemon's global skills and agents dir (ManagerConfig) a box with `spec` gets.
  std::vector<sandbox::BindMount> global_binds(const SessionSpec& spec) const;
  // The network mode `net` as a box takes it (policy parsed, the deny hook naming e's session).
  Result<sandbox::NetworkMode> network_mode(const Entry& e, const NetworkSpec& net) const;
  // Creates (or finds) the workspace and asks the backend for a box. Slow: called without mu_,
  // on an entry that no other thread touches while it is kCreating.
  Result<BoxStart> start_box(const Entry& e);
  // Makes a created or resumed entry live, or drops it when starting failed. mu_ held.
  Result<std::shared_ptr<Entry>> finish_start_locked(const std::shared_ptr<Entry>& e,
                                                     Result<BoxStart> started, bool is_new);
  // Waits on cv_ until `id` is absent or settled (not mid-create/resume/destroy); returns it.
  std::shared_ptr<Entry> find_settled_locked(std::unique_lock<std::mutex>& lk,
                                             const std::string& id);
  uid_t allocate_uid_locked(const std::string& id);
  // Drops the quota disk (workspace/) and removes the tree without following a link in it.
  Status remove_workspace(const std::string& id);
  // Every change to what a session is (created, started, suspended, destroyed) goes through
  // these two: one durable transaction each (store.h). Last-used times are batched apart
  // (flush_used). mu_ held.
  Status record_locked(Entry& e);
  Status forget_locked(const Entry& e);
  // Tells the subscribers. Call with mu_ released.
  void publish(const SessionEvent& ev) const;
  // publish() of e as it is now, from under mu_: releases lk around the calls. The actor is
  // the caller's tenant for kApi/kRestore, "" for the daemon's own doings.
  void publish_locked(std::unique_lock<std::mutex>& lk, const Entry& e, EventKind kind,
                      EventCause cause, std::string_view actor, std::string_view detail = {});

  ManagerConfig config_;
  workspace::Workspaces workspaces_;  // data_dir/workspaces, disks and archives
  std::mutex mu_;
  std::mutex liveness_mu_;  // guards last_liveness_ (never held with mu_ waited on)
  Liveness last_liveness_;
  std::condition_variable cv_;  // an entry left kCreating/kDestroying, or was erased
  bool closed_ = false;         // shutdown_all() ran: no box is started again
  std::map<std::string, std::shared_ptr<Entry>> sessions_;
  std::map<uid_t, std::string> uids_;  // allocated uid -> session id
  std::unique_ptr<Store> store_;       // null when !config_.persist
  std::mutex mounts_mu_;               // one add_mounts() at a time (taken before mu_)
  std::mutex update_mu_;               // one update() / set_network() at a time (taken before mu_)
  std::chrono::system_clock::time_point started_at_;

  mutable std::mutex subs_mu_;
  std::vector<std::weak_ptr<EventSubscriber>> subs_;

  // The reaper thread; stop_ under reaper_mu_.
  std::mutex reaper_mu_;
  std::condition_variable reaper_cv_;
  bool stop_ = false;
  std::thread reaper_;
};

}  // namespace agentbox::session
