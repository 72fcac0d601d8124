#pragma once
// Processes of one box (API.md "Processes and terminals"): commands that outlive the request that
// started them (dev servers, watchers, MCP stdio servers, shells on a pty). Shared by every
// backend: a backend only starts the command (ProcessLauncher: the ns box's init forks it, the
// host backend posix_spawns it) and hands back a Process (process.h); the table does the rest.
//
// What the table keeps per process: its ProcessInfo, its output in an OutputRing (at least the
// last 1 MiB of each stream, byte offsets across streams), a stdin queue, one attacher. Processes
// that ended stay listed for kKeepEnded (bounded to kMaxEnded), so a late client still learns the
// exit code. A process is its whole tree: kill() and the end of the leader kill everything it
// started (ns: the per-process cgroup; host: the process group).
//
// Threading and I/O: no thread per process. start() binds the process's pipes (or pty master) to
// the executor of the coroutine that calls it; the readers, the exit watcher and the stdin writer
// run there. All calls on one table must come from that one executor (the daemon's network
// thread): follow() waiters and the stdin writer are plain Asio objects of that executor. The
// synchronous calls (list, get, output, signal, resize, kill, attach, write_stdin) never block.
//
// Refs: a process is named by its tag or by its pid (decimal, the pid as the box sees it). Tags
// match [A-Za-z0-9._-]{1,64} and are not all digits, so the two never collide; a tag is unique
// among live processes. A pid names the live process with that pid, else the newest ended one.
//
// Managed processes (ProcessSpec::restart other than kNever; API.md, issue 11 part 3): the table
// supervises them. An end the policy wants restarted (on-failure: exit code other than 0 or a
// signal; always: any end) is followed, after a backoff on a timer of the table's executor (1 s,
// doubling to 60 s, back to 1 s after an incarnation that ran a good minute), by a new
// incarnation: a new pid, the same tag, `restarts` one more. No thread and no busy loop per
// process: a crash-looping one costs one launch per backoff. kill() ends the supervision (also
// while it waits out a backoff); shutdown() ends it for this box (the caller keeps the spec to
// start it again in the next box). While supervised, a managed process holds `keepalive` (given
// to start(): the table's owner, so that a restart never outlives the box, and for the session
// layer a lease that keeps the session from being reaped as idle); it is let go when the
// supervision ends.
//
// Exit hook: ExitCallback runs once per incarnation, after its exit record, with the final info
// and how it ended (ProcessEnd); for a managed process killed during a backoff, once more with
// the last incarnation's info, requested and not restarting.

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "sandbox/output_ring.h"
#include "sandbox/process.h"

namespace agentbox::sandbox {

struct PtySize {
  std::uint16_t cols = 80;
  std::uint16_t rows = 24;
};

struct ProcessSpec {
  std::vector<std::string> argv;  // run directly (PATH lookup) when non-empty ...
  std::string command;            // ... else /bin/sh -c command
  std::string cwd;                // in-box path; "" = the workspace
  std::map<std::string, std::string> env;  // added to the box's base environment
  std::string tag;                         // "" = none
  bool stdin_open = false;  // a stdin the API writes to (write_stdin); else /dev/null
  // A terminal: stdin, stdout and stderr are its slave (the command's controlling terminal);
  // the output is one "pty" stream and write_stdin types into it. Implies stdin.
  std::optional<PtySize> pty;
  // Managed when not kNever (see the header comment).
  enum class Restart { kNever, kOnFailure, kAlways };
  Restart restart = Restart::kNever;
  // Managed: the name its supervision goes by (the caller's storage key; the tag when it has
  // one). A second managed process with the same key is EEXIST while the first is supervised.
  std::string key;
  std::uint32_t restarts = 0;  // the first incarnation's count (ProcessInfo::restarts)
};
// "never", "on-failure", "always".
std::string_view restart_name(ProcessSpec::Restart r);

enum class ProcessState { kRunning, kExited, kKilled };
std::string_view state_name(ProcessState s);  // "running", "exited", "killed"

struct ProcessInfo {
  int pid = 0;  // as the box sees it (host backend: the host pid)
  std::string tag;
  std::vector<std::string> argv;  // as given (empty when started from `command`)
  std::string command;
  std::string cwd;  // as given ("" = the workspace)
  ProcessState state = ProcessState::kRunning;
  std::optional<int> exit_code;  // when ended: the exit status, 128+N when killed by signal N
  std::optional<int> signal;     // when killed: N
  std::chrono::system_clock::time_point started_at;
  std::optional<std::chrono::system_clock::time_point> ended_at;
  std::uint32_t restarts = 0;
  bool managed = false;
  std::optional<PtySize> pty;
  bool stdin_open = false;  // stdin can still be written
};

struct OutputRecord {
  enum class Type { kStdout, kStderr, kPty, kExit };
  Type type = Type::kStdout;
  std::uint64_t offset = 0;  // kExit: the total output size
  std::string data;          // raw bytes; empty for kExit
  int exit_code = 0;         // kExit
  std::optional<int> signal;  // kExit
};
std::string_view record_type_name(OutputRecord::Type t);  // "stdout", "stderr", "pty", "exit"

struct OutputBatch {
  std::vector<OutputRecord> records;
  std::uint64_t next = 0;  // pass as `since` to continue
  bool ended = false;      // the exit record is in `records`: nothing follows
};

// The backend's part: starting one command (see the header comment).
struct Launched {
  std::unique_ptr<Process> proc;  // stdio pipes (none with a pty), wait, kill_tree, signal
  int pid = 0;                    // as the box sees it
  UniqueFd pty_master;            // with ProcessSpec::pty
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  // Starts `spec` (argv/command, cwd, env, stdin, pty already checked for shape by the table;
  // the backend resolves cwd and env). Returns once the command's pid is known. Runs on the
  // table's executor.
  virtual boost::asio::awaitable<Result<Launched>> launch(ProcessSpec spec) = 0;
};

// The signals the API may send (API.md): SIGINT SIGTERM SIGKILL SIGHUP SIGUSR1 SIGUSR2, by name
// ("SIGTERM" or "TERM") or number. nullopt for anything else (the caller answers 400 EINVAL).
std::optional<int> parse_signal(std::string_view name);

namespace detail {
struct ProcEntry;
struct Managed;
}

// How an incarnation ended, for the exit hook.
struct ProcessEnd {
  bool requested = false;   // kill() or shutdown() ended it
  bool shutdown = false;    // the box went down (shutdown())
  bool restarting = false;  // managed: a new incarnation follows after the backoff
};

// Holds the one attachment a process allows (attach()); released when destroyed.
class AttachLease {
 public:
  AttachLease() = default;
  explicit AttachLease(std::shared_ptr<detail::ProcEntry> e) : e_(std::move(e)) {}
  AttachLease(AttachLease&&) noexcept = default;
  AttachLease& operator=(AttachLease&& o) noexcept;
  ~AttachLease();

 private:
  void release();
  std::shared_ptr<detail::ProcEntry> e_;
};

class ProcessTable {
 public:
  using ExitCallback = std::function<void(const ProcessInfo& info, const ProcessEnd& end)>;

  static constexpr std::size_t kMaxLive = 256;
  static constexpr std::size_t kMaxEnded = 32;
  static constexpr std::chrono::minutes kKeepEnded{10};
  static constexpr std::size_t kMaxStdinQueued = 1 << 20;  // bytes written but not yet taken
  static constexpr std::size_t kDefaultBatchBytes = 256 * 1024;
  static constexpr std::chrono::seconds kFirstBackoff{1};
  static constexpr std::chrono::seconds kMaxBackoff{60};
  static constexpr std::chrono::seconds kGoodRun{60};  // uptime that resets the backoff

  explicit ProcessTable(ProcessLauncher& launcher) : launcher_(launcher) {}
  ~ProcessTable();  // shutdown()
  ProcessTable(const ProcessTable&) = delete;
  ProcessTable& operator=(const ProcessTable&) = delete;

  // Starts a process. EINVAL: no argv/command, a bad tag, a pty size of 0 or over 1000;
  // EEXIST: the tag names a live process; ETOOBIG: kMaxLive live processes; EUNAVAILABLE after
  // shutdown(); what the launcher says (ENOENT cwd, ...). A command that does not exist still
  // starts (exit 127 and a message on stderr), as in exec. A managed spec needs `keepalive`
  // (EINVAL without); EEXIST when its key is supervised already.
  boost::asio::awaitable<Result<ProcessInfo>> start(ProcessSpec spec, ExitCallback on_exit = {},
                                                    std::shared_ptr<void> keepalive = {});
  // Whether a managed process is supervised (running or waiting out a backoff).
  bool supervising();
  // EEXIST when `tag` is held by a live process or a supervised one (which keeps its tag through
  // its backoffs); "" is free.
  Status check_tag(std::string_view tag);

  // Live ones and those that ended in the last kKeepEnded, oldest first.
  std::vector<ProcessInfo> list();
  Result<ProcessInfo> get(std::string_view ref);  // ENOENT for an unknown ref
  // A process with this tag is being launched (not listed, not found by get() yet).
  bool starting(std::string_view ref);

  // What is kept from `since` on (nullopt: from the oldest byte kept), at most about max_bytes;
  // includes the exit record once the reader is at the end of an ended process.
  Result<OutputBatch> output(std::string_view ref, std::optional<std::uint64_t> since,
                             std::size_t max_bytes = kDefaultBatchBytes);
  // As output(), but waits until there is at least one record (output or exit). Cancelling the
  // awaiting coroutine (the client left) completes it with an empty batch.
  boost::asio::awaitable<Result<OutputBatch>> follow(std::string ref,
                                                     std::optional<std::uint64_t> since,
                                                     std::size_t max_bytes = kDefaultBatchBytes);

  // Queues `data` for the process's stdin (written asynchronously, in order); `close` then
  // closes it (on a pty: sends ^D). EEXIST (HTTP 409) when the process has ended or its stdin is
  // closed; EINVAL when it was started without stdin; ETOOBIG when more than kMaxStdinQueued bytes
  // wait (the process does not read).
  Status write_stdin(std::string_view ref, std::string_view data, bool close = false);

  // A signal (parse_signal's set) to the process's leader. EINVAL for another signal; EEXIST
  // when it has ended.
  Status signal(std::string_view ref, int signo);
  // Terminal size of a pty process; EINVAL for a process without a pty or a size of 0 / > 1000.
  Status resize(std::string_view ref, PtySize size);
  // SIGKILL to the process and everything it started, and the end of its supervision when
  // managed. A no-op on an ended process that is not supervised.
  Status kill(std::string_view ref);
  // The one attacher a process may have: EEXIST when another holds it. The lease does not keep
  // the process alive; let it go when the attacher leaves.
  Result<AttachLease> attach(std::string_view ref);

  // Kills every live process (their ends are reported as requested and shutdown) and ends
  // every supervision; later start()s fail with EUNAVAILABLE. Idempotent; any thread.
  void shutdown();

 private:
  using EntryPtr = std::shared_ptr<detail::ProcEntry>;
  using ManagedPtr = std::shared_ptr<detail::Managed>;
  Result<EntryPtr> find_locked(std::string_view ref);
  void prune_locked();
  // start() after the checks of the spec's shape; `m` set for a managed process (first start
  // and restarts alike).
  boost::asio::awaitable<Result<ProcessInfo>> start_entry(ProcessSpec spec, ExitCallback on_exit,
                                                          ManagedPtr m);
  // A managed process's next incarnation, after `delay`; runs on the table's executor and may
  // outlive the table (it touches the table only while holding the supervision's keepalive).
  static boost::asio::awaitable<void> restart_after(ManagedPtr m, std::chrono::milliseconds delay);
  // Waits for a process's leader, ends its tree, records the exit, then (managed) decides on a
  // restart.
  static boost::asio::awaitable<void> supervise(EntryPtr e);
  // The backoff before the next incarnation, or nullopt when the policy wants none. m->mu held.
  static std::optional<std::chrono::seconds> next_backoff_locked(detail::Managed& m,
                                                                 const ProcessInfo& ended);

  ProcessLauncher& launcher_;
  std::mutex mu_;
  std::vector<EntryPtr> entries_;  // start order; guarded by mu_
  std::vector<ManagedPtr> managed_;  // supervisions (stopped ones pruned); guarded by mu_
  bool shut_down_ = false;         // guarded by mu_
};

}  // namespace agentbox::sandbox
