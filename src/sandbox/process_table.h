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
// Supervision hook: ExitCallback runs once per process, after its exit record, with the final
// info and whether the end was asked for (kill(), shutdown()): a supervisor restarts with backoff
// on the unrequested ones (managed processes, issue 11 part 3).

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
  bool managed = false;      // informational (ProcessInfo::managed); supervision is the caller's
  std::uint32_t restarts = 0;  // informational: how often a supervisor restarted this one
};

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
}

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
  using ExitCallback = std::function<void(const ProcessInfo& info, bool requested)>;

  static constexpr std::size_t kMaxLive = 256;
  static constexpr std::size_t kMaxEnded = 32;
  static constexpr std::chrono::minutes kKeepEnded{10};
  static constexpr std::size_t kMaxStdinQueued = 1 << 20;  // bytes written but not yet taken
  static constexpr std::size_t kDefaultBatchBytes = 256 * 1024;

  explicit ProcessTable(ProcessLauncher& launcher) : launcher_(launcher) {}
  ~ProcessTable();  // shutdown()
  ProcessTable(const ProcessTable&) = delete;
  ProcessTable& operator=(const ProcessTable&) = delete;

  // Starts a process. EINVAL: no argv/command, a bad tag, a pty size of 0 or over 1000;
  // EEXIST: the tag names a live process; ETOOBIG: kMaxLive live processes; EUNAVAILABLE after
  // shutdown(); what the launcher says (ENOENT cwd, ...). A command that does not exist still
  // starts (exit 127 and a message on stderr), as in exec.
  boost::asio::awaitable<Result<ProcessInfo>> start(ProcessSpec spec, ExitCallback on_exit = {});

  // Live ones and those that ended in the last kKeepEnded, oldest first.
  std::vector<ProcessInfo> list();
  Result<ProcessInfo> get(std::string_view ref);  // ENOENT for an unknown ref

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
  // SIGKILL to the process and everything it started. A no-op on an ended process.
  Status kill(std::string_view ref);
  // The one attacher a process may have: EEXIST when another holds it. The lease does not keep
  // the process alive; let it go when the attacher leaves.
  Result<AttachLease> attach(std::string_view ref);

  // Kills every live process (their ends are reported as requested); later start()s fail with
  // EUNAVAILABLE. Idempotent.
  void shutdown();

 private:
  using EntryPtr = std::shared_ptr<detail::ProcEntry>;
  Result<EntryPtr> find_locked(std::string_view ref);
  void prune_locked();

  ProcessLauncher& launcher_;
  std::mutex mu_;
  std::vector<EntryPtr> entries_;  // start order; guarded by mu_
  bool shut_down_ = false;         // guarded by mu_
};

}  // namespace agentbox::sandbox
