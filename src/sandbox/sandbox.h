#pragma once
// The Sandbox interface (shared/DESIGN.md, "The Sandbox interface"): what every backend (host,
// ns, later remote and docker) implements for one session's box. Paths are in-box paths:
// absolute ("/workspace/a.txt", "/tmp/x") or relative to workspace(). Nothing here knows about
// HTTP, session ids or tenants.
//
// Threading: exec() runs on the caller's Asio executor (it is a coroutine). The file operations
// are blocking syscalls; the server calls them from a worker pool, so they must be safe to call
// concurrently with each other and with exec().

#include <sys/types.h>

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "net/policy.h"
#include "net/proxy.h"

namespace agentbox::sandbox {

namespace asio = boost::asio;

inline constexpr std::size_t kDefaultMaxOutputBytes = 131072;
inline constexpr std::chrono::seconds kDefaultExecTimeout{120};

struct ExecSpec {
  std::vector<std::string> argv;           // run directly (PATH lookup) when non-empty ...
  std::string command;                     // ... else run as /bin/sh -c command
  std::string cwd;                         // in-box path; empty means workspace()
  std::map<std::string, std::string> env;  // added to the box's base environment
  std::string stdin_data;                  // fed to the command, then stdin is closed
  std::chrono::milliseconds timeout = kDefaultExecTimeout;
  std::size_t max_output_bytes = kDefaultMaxOutputBytes;  // per stream
  std::string artifact_dir;  // in-box dir; files new or modified there are reported; "" = none
};

struct Artifact {
  std::string path;  // in-box path
  std::uint64_t size = 0;
  std::string mime_type;
};

// Why a command was stopped (API.md "Exec": killed_by); kNone when it ended on its own.
enum class KilledBy { kNone, kTimeout, kCpuTime, kMemory, kPids };

// The wire name ("timeout", "cpu_time", "memory", "pids"); "" for kNone.
inline std::string_view killed_by_name(KilledBy k) {
  switch (k) {
    case KilledBy::kNone: return "";
    case KilledBy::kTimeout: return "timeout";
    case KilledBy::kCpuTime: return "cpu_time";
    case KilledBy::kMemory: return "memory";
    case KilledBy::kPids: return "pids";
  }
  return "";
}

struct ExecResult {
  std::string stdout_data;  // raw bytes; the wire layer replaces invalid UTF-8
  std::string stderr_data;
  // The command's exit status; 127 when it could not be started; 128+N when killed by signal N;
  // -1 on timeout.
  int exit_code = 0;
  std::optional<int> signal;
  bool timed_out = false;
  // What stopped it: the timeout, its CPU-time limit, an OOM kill or a refused fork in its box
  // (backends without such limits report only kTimeout).
  KilledBy killed_by = KilledBy::kNone;
  bool stdout_truncated = false;
  bool stderr_truncated = false;
  std::chrono::milliseconds duration{0};
  std::vector<Artifact> artifacts;
};

enum class StreamKind { kStdout, kStderr };

// Receives output as it is produced (streaming exec). Called on the exec's executor, one call at a
// time, in order. With a sink, ExecResult's stdout/stderr stay empty (but the truncated flags and
// the cap still apply to what is forwarded).
class OutputSink {
 public:
  virtual ~OutputSink() = default;
  // Returns false when the consumer is gone (client disconnected): the command is killed.
  virtual asio::awaitable<bool> on_output(StreamKind kind, std::string data) = 0;
};

struct FileInfo {
  std::string name;  // last component
  std::string path;  // in-box path as given (normalised)
  std::uint64_t size = 0;
  std::uint32_t mode = 0;        // st_mode (type and permission bits)
  std::int64_t mod_time_ns = 0;  // since the Unix epoch
  bool is_dir = false;
  bool is_symlink = false;
  uid_t uid = 0;  // owner, as the host sees it
  gid_t gid = 0;
  std::string symlink_target;  // what a symlink holds (readlink), "" otherwise
};

struct DirEntry {
  std::string name;
  bool is_dir = false;
  bool is_symlink = false;
  std::uint64_t size = 0;
  std::uint32_t mode = 0;
  std::int64_t mod_time_ns = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// An open regular file for streaming out.
class FileFeed;  // sandbox/file_feed.h

struct FileReader {
  UniqueFd fd;
  std::uint64_t size = 0;
  // Only from open_file_streamed(): the bytes are still arriving in `fd` (wait on the feed).
  std::shared_ptr<FileFeed> feed;
};

struct WriteOptions {
  bool mkdirs = false;                     // create missing parents (else ENOENT)
  std::optional<std::uint32_t> mode;       // permission bits; default 0644 (or the old file's)
  std::uint64_t max_bytes = 500ull << 20;  // write() past this fails with kTooBig
};

// An in-progress atomic write: data goes to a temp file in the target's directory; commit()
// fsyncs it, renames it over the target and fsyncs the directory. Destroying an uncommitted
// writer removes the temp file and leaves the target untouched.
class FileWriter {
 public:
  virtual ~FileWriter() = default;
  virtual Status write(std::string_view chunk) = 0;
  virtual Result<std::uint64_t> commit() = 0;  // returns the size written
};

// A host path bound into the box. A read-write one is writable by the session user without
// chowning the host path (ns: an idmapped mount; linux/host_binds.h).
struct BindMount {
  std::string host_path;
  std::string box_path;
  bool read_only = true;
  std::string what;  // names it in errors ("mounts[0]", "skills.web"); "" = by box_path
};

class ProcessTable;  // sandbox/process_table.h
struct Limits;       // below

// A network mode for a running box (API.md "Network"; Sandbox::set_network).
struct NetworkMode {
  std::shared_ptr<const net::Policy> egress_policy;  // set: "allowlist" with this policy
  net::ProxyHooks egress_hooks;                      // with egress_policy
  bool open = false;                                 // "open"; neither set: "none"
};

// What a running box uses now (API.md "Usage"), from its cgroup: memory charged, CPU time of
// every process it ran since it started (nullopt where the host does not count it), tasks
// (threads included, as the max_pids limit counts them).
struct BoxUsage {
  std::uint64_t memory_bytes = 0;
  std::optional<std::uint64_t> cpu_usec;
  std::uint64_t pids = 0;
};

class Sandbox {
 public:
  virtual ~Sandbox() = default;

  virtual std::string_view name() const = 0;  // the backend: "host", "ns", ...
  // The workspace path as commands in the box see it ("/workspace" for ns, the host dir for host).
  virtual std::string workspace() const = 0;
  // The uid commands run as, when the backend has one per session.
  virtual std::optional<uid_t> uid() const { return std::nullopt; }

  // Runs one command. Expected failures of the command itself (non-zero exit, no such binary,
  // timeout) are an ExecResult, not an Error; an Error means the box could not run anything.
  // Cancelling the awaiting coroutine (its cancellation slot; e.g. it is the losing side of
  // `exec || watch_disconnect`) kills the command and everything it started, promptly, also
  // when the command prints nothing; exec then completes normally with the killed result (it
  // does not throw operation_aborted). Blocking steps (artifact scans) run off the caller's
  // thread where the backend was given a pool for them.
  virtual asio::awaitable<Result<ExecResult>> exec(ExecSpec spec, OutputSink* sink) = 0;

  // The box's processes (API.md "Processes and terminals"; sandbox/process_table.h: start, list,
  // get by tag or pid, output with offsets and follow, stdin, signal, resize, kill, attach).
  // Owned by the sandbox, valid until it is destroyed; shutdown() ends every process. nullptr
  // when the backend has none (the wire answers 501 ENOTSUP).
  virtual ProcessTable* processes() { return nullptr; }

  // Network mode "allowlist" (API.md "Network"): new proxy connections use `policy`. ENOTSUP on
  // a box without an egress proxy (mode none, or a backend without one).
  virtual Status set_egress_policy(std::shared_ptr<const net::Policy> policy) {
    (void)policy;
    return fail(Code::kNotSupported, "network policy: this box has no egress proxy");
  }
  // Switches a running box to `mode` for new connections, without stopping it (API.md "Network"):
  // none <-> allowlist <-> open. What the old mode allowed and the new one does not is cut:
  // leaving allowlist stops the proxy and closes its connections; leaving open removes the
  // box's route out and aborts the connections that used it. An allowlist box that stays one
  // only takes the new policy. Commands started afterwards get the proxy variables exactly when
  // the mode is allowlist. On an error the box is in mode "none" or its old mode (the error
  // says). Blocking. ENOTSUP naming network.mode on a backend that cannot.
  virtual Status set_network(const NetworkMode& mode) {
    (void)mode;
    return fail(Code::kNotSupported, "field 'network.mode': changing the mode of a running " +
                                         std::string(name()) + " session");
  }
  // Writes new limits (the effective ones: every field set) to the running box: memory_mb,
  // cpu_percent and max_pids into its cgroup, cpu_time_sec for commands started afterwards; the
  // other fields must be as the box was made with (the caller checks). Lowering memory below
  // what the box uses lets the kernel reclaim or OOM-kill (linux/cgroup.h set_limits). Blocking.
  // ENOTSUP on a backend that cannot (the caller names the field).
  virtual Status set_limits(const Limits& limits) {
    (void)limits;
    return fail(Code::kNotSupported,
                "changing the limits of a running " + std::string(name()) + " session");
  }

  // The egress proxy's counters (for /metrics), nullopt without one.
  virtual std::optional<net::ProxyCounters> egress_counters() const { return std::nullopt; }
  // Its usage now (blocking: reads cgroup files). ENOTSUP from a backend that does not measure
  // it (Backend::measures_usage()), EUNAVAILABLE once the box is shut down.
  virtual Result<BoxUsage> usage() {
    return fail(Code::kNotSupported, "usage on the " + std::string(name()) + " backend");
  }

  // Adds host binds to the running box (API.md "Sessions", POST .../mounts), all or none:
  // true when they are there for the next command; false when they cannot be added to this box
  // safely now (nothing changed: they come with the next start); an Error for a bad bind
  // (nothing changed). The backend's check_mounts() has accepted them. Blocking.
  virtual Result<bool> add_mounts(const std::vector<BindMount>& mounts) {
    (void)mounts;
    return false;
  }

  virtual Result<FileReader> open_file(const std::string& path) = 0;
  // As open_file, but the reader may come back before the whole file is there (its `feed` set):
  // for a reader that waits on the feed (server/files.cc send_file). Default: open_file.
  virtual Result<FileReader> open_file_streamed(const std::string& path) { return open_file(path); }
  virtual Result<std::unique_ptr<FileWriter>> create_file(const std::string& path,
                                                          WriteOptions opts) = 0;
  virtual Result<FileInfo> stat(const std::string& path) = 0;
  virtual Result<std::vector<DirEntry>> read_dir(const std::string& path) = 0;  // sorted by name
  virtual Status mkdir_all(const std::string& path) = 0;
  virtual Status remove(const std::string& path) = 0;  // file or empty dir
  virtual Status remove_all(const std::string& path) = 0;
  virtual Status rename(const std::string& from, const std::string& to) = 0;
  // An fd of the directory at `path`, resolved as the calls above resolve paths (what a
  // DirWatch watches, sandbox/dir_watch.h). ENOTSUP on a backend without one.
  virtual Result<UniqueFd> open_dir(const std::string& path) {
    (void)path;
    return fail(Code::kNotSupported,
                "watching directories on the " + std::string(name()) + " backend");
  }

  // Kills every process of the box and releases its resources (box torn down). The workspace
  // stays on disk. Idempotent. The Sandbox is unusable afterwards.
  virtual void shutdown() = 0;

  // Convenience forms on top of the streaming ones.
  Result<std::string> read_file(const std::string& path, std::uint64_t max_bytes);
  Result<std::uint64_t> write_file(const std::string& path, std::string_view data,
                                   WriteOptions opts);
};

// Resource limits of a box. Unset fields take the backend's defaults.
struct Limits {
  std::optional<std::uint64_t> memory_mb;
  std::optional<std::uint32_t> cpu_percent;
  std::optional<std::uint32_t> max_pids;
  std::optional<std::uint64_t> disk_mb;
  std::optional<std::uint32_t> max_open_files;
  // CPU seconds per command (RLIMIT_CPU of each process it starts); unset: no limit.
  std::optional<std::uint32_t> cpu_time_sec;
  // Size of the box's /tmp (a tmpfs: in memory, charged to memory_mb).
  std::optional<std::uint64_t> tmp_mb;

  bool operator==(const Limits&) const = default;
};

// What a backend needs to make one box. `key` is an opaque, filesystem-safe unique name for the
// box (used for cgroup and runtime dir names); the session layer supplies it.
struct BoxConfig {
  std::string key;
  std::string workspace_dir;  // host path of the workspace; exists
  // workspace_dir is a client's host dir (seed 002's host_path over /workspace), not a dir of
  // the daemon's: bound like a mount (ns: idmapped for the session user when writable), never
  // chowned. workspace_read_only: the box cannot write it (a backend that cannot enforce that
  // fails create() with ENOTSUP).
  bool workspace_on_host = false;
  bool workspace_read_only = false;
  Limits limits;
  std::map<std::string, std::string> env;
  std::vector<BindMount> mounts;  // extra mounts, shared dirs, skills
  uid_t uid = 0;                  // session uid/gid (ns backend); 0 = backend decides
  gid_t gid = 0;
  // Network mode "allowlist": the box gets an egress proxy at 127.0.0.1:3128 with this policy
  // (and the proxy variables in its environment) for as long as it runs. Null: no egress (mode
  // "none"). A backend that cannot serve it fails create() with ENOTSUP.
  std::shared_ptr<const net::Policy> egress_policy;
  net::ProxyHooks egress_hooks;  // on_deny: called on the proxy's thread for every 403
  // Network mode "open" (net/open_egress.h): routed outbound TCP/UDP from the box's own netns.
  // Exclusive with egress_policy. A backend that cannot serve it fails create() with ENOTSUP.
  bool open_network = false;
  // Backend "remote" (remote/remote_backend.h): the runner user that serves the box, and the
  // session's tenant (the runner must be configured for it).
  std::string runner;
  std::string tenant;
  // API.md "Images": the box's root is an overlay of these layer dirs (lowest first; on disk
  // owned by root_id_base + the image's ids, linux/image_root.h) instead of the host's system
  // dirs, over the upper and work dirs the session layer keeps: two existing dirs named
  // root_upper and root_work in root_dir, all three owned by root_id_base. Only a backend whose
  // supports_image_root() says so takes them.
  std::vector<std::string> root_layers;
  std::string root_dir;
  std::string root_upper;
  std::string root_work;
  std::uint32_t root_id_base = 0;
  std::uint32_t root_id_count = 0;
  bool root_writable = false;  // read_only_rootfs false: "/" stays writable
  // Non-zero (a template build on an image): this box uid acts for the image's root on the root
  // layers (linux/image_root.h ImageRootSpec::owner).
  std::uint32_t root_owner = 0;
};

// What a session asks of its box, as Backend::check_spec sees it: at create and at every later
// change of the session (its network, its limits), whether its box runs or not.
struct SpecRequest {
  std::string network_mode = "none";  // none | allowlist | open
  Limits limits;       // what the session asks for: its set fields (not the daemon's defaults)
  std::string runner;  // backend "remote": the runner user serving the session
  std::string tenant;  // the session's tenant
};

// The wire names of the set fields of `l` ("memory_mb", ...), with their values, in API.md's
// order.
std::vector<std::pair<std::string, std::uint64_t>> set_limits(const Limits& l);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Whether boxes of this backend isolate their commands from the host and from each other (own
  // namespaces, a per-session uid, limits enforced). Policy that depends on isolation (chowning
  // the workspace to the session uid, warning an operator before running unconfined) asks this,
  // never compares name() with "host". A backend that does not say is taken not to isolate:
  // the safe assumption (the operator is warned, nothing is handed to a per-session uid).
  virtual bool isolated() const { return false; }
  // Whether this backend can make boxes on this host; the error names what is missing.
  virtual Status check_usable() = 0;
  // Whether create() could bind `mounts` for a box of uid/gid: the host paths exist, and a
  // read-write one can be made writable for the session user on its filesystem. What a mount
  // added to a session is checked with before it is recorded, so a bad one fails the request,
  // not the next start. Blocking. ENOTSUP for a backend that binds no host paths.
  virtual Status check_mounts(const std::vector<BindMount>& mounts, uid_t uid, gid_t gid) {
    (void)mounts;
    (void)uid;
    (void)gid;
    return fail(Code::kNotSupported,
                "mounts and skills on the " + std::string(name()) + " backend");
  }
  // Whether this backend can give a box what `req` asks: a network mode or a limit it would
  // not enforce is ENOTSUP naming the field ("network", "limits.memory_mb"), so that the request
  // asking for it (create, POST /network, a change of limits) fails instead of being ignored.
  // Cheap and non-blocking (the session manager calls it under its lock). Default: everything.
  virtual Status check_spec(const SpecRequest& req) {
    (void)req;
    return {};
  }
  // Whether a session of this backend takes the daemon's default limits
  // (session::ManagerConfig::default_limits) for what it leaves unset. false: its box has only
  // the limits the session asks for (a remote runner's machine is not the daemon's to budget).
  virtual bool takes_default_limits() const { return true; }
  // Whether its boxes measure their usage (Sandbox::usage): a cgroup per box.
  virtual bool measures_usage() const { return false; }
  // Whether create() can make a box's root of an image (BoxConfig::root_layers). false: a session
  // naming `image` is refused ENOTSUP naming the field and the backend.
  virtual bool supports_image_root() const { return false; }
  virtual Result<std::unique_ptr<Sandbox>> create(BoxConfig config) = 0;
};

}  // namespace agentbox::sandbox
