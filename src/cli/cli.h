#pragma once
// The agentbox CLI: one function per command, each returning the process exit code. They talk
// to agentboxd only through client::Client (the CLI never links isolation code). Errors go to
// stderr as "agentbox: CODE: message".

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "client/client.h"
#include "common/error.h"

namespace agentbox::cli {

// Exit codes by cause, the same for every command (`agentbox --help` lists them; kExitCodesHelp).
// `exec` exits with the command's own status instead when the command ran; its own failures
// (the session, the server) use these codes, told apart by the "agentbox: " line on stderr.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;         // any other error: a value the server refused, I/O
inline constexpr int kExitUsage = 2;         // bad command line (nothing was sent)
inline constexpr int kExitNotFound = 3;      // ENOENT: no such session, file or directory
inline constexpr int kExitAuth = 4;          // EUNAUTHORIZED: token missing or wrong
inline constexpr int kExitUnreachable = 5;   // no reply (connect, timeout), EUNAVAILABLE
inline constexpr int kExitQuota = 6;         // EQUOTA, ETOOBIG: over a quota or size cap
inline constexpr int kExitConflict = 7;      // EEXIST, ENOTEMPTY, ENOTDIR, EISDIR
inline constexpr int kExitDenied = 8;        // EACCES: path escapes, read-only, denied mount
inline constexpr int kExitNotSupported = 9;  // ENOTSUP (501), 422, a route this server lacks
inline constexpr int kExitServerError = 10;  // EINTERNAL and other 5xx
inline constexpr int kExitUnhealthy = 11;    // health/repair answered, some check failed
inline constexpr int kExitTimedOut = 124;    // exec: the command timed out (as coreutils timeout)

// The exit-code table as `--help` prints it.
extern const char kExitCodesHelp[];

// The exit code for an error of ours (a client or local I/O error).
int exit_code_for(Code code);
// The exit code for a non-2xx reply: by its wire code ("ENOENT"), else by its HTTP status.
// 422 and 501 mean "not built in this server" whatever the code says; a 404 whose message is
// the router's "no such route" is the server lacking the route (older than this CLI), not a
// missing session.
int exit_code_for(std::string_view api_code, int http_status, std::string_view message = {});

struct Globals {
  std::string server = "http://127.0.0.1:9090";
  std::string token;
  client::ClientOptions options() const;
};

// ---- helpers (util.cc) ----

// Prints "agentbox: CODE: message" and returns exit_code_for(e.code).
int report(const Error& e);
// Prints the API error of a non-2xx reply (or its status and body) and returns its exit code.
int report(const client::Response& r);
// Prints "agentbox: message" and returns kExitUsage.
int usage(std::string_view message);

// "/v1/sessions/<id>", the id percent-encoded as one path segment.
std::string session_target(std::string_view id);
// "k=v" arguments of a repeatable flag into a map; EINVAL naming the flag and argument.
Result<std::map<std::string, std::string>> parse_pairs(const std::vector<std::string>& args,
                                                       std::string_view flag);

// SESSION:PATH. An argument is remote when it has a ':' and no '/' before it (session ids
// cannot contain '/', so "./a:b" and "/tmp/a:b" stay local paths), as scp decides.
struct RemotePath {
  std::string session;
  std::string path;  // may be empty ("SESSION:")
};
std::optional<RemotePath> parse_remote(std::string_view arg);

// A --mount argument, "HOST:BOX[:ro|rw]" (mode default rw); EINVAL naming the argument.
struct MountSpec {
  std::string host_path;
  std::string mount_path;
  std::string mode;
};
Result<MountSpec> parse_mount(const std::string& spec);
// A --host-path argument, "DIR[:ro|rw]" (mode default rw; mount_path /workspace): the session's
// workspace is that host dir. EINVAL naming the argument.
Result<MountSpec> parse_host_path(const std::string& spec);

// `agentbox wait`'s target: the URL argument, else $WAIT_FOR_SIDECAR, else --server; seed 001
// writes "localhost:9090", so a URL without a scheme is http, and a trailing "/healthz" is
// dropped (it is what is polled). The timeout: --timeout, else $WAIT_FOR_SIDECAR_TIMEOUT
// (whole seconds), else 60. EINVAL naming what is malformed.
struct WaitTarget {
  std::string base_url;  // http://host:port
  std::uint32_t timeout_sec = 60;
};
inline constexpr std::uint32_t kDefaultWaitSec = 60;
Result<WaitTarget> resolve_wait_target(const std::string& url_arg,
                                       std::optional<std::uint32_t> timeout_arg,
                                       const char* env_url, const char* env_timeout,
                                       const std::string& server);

// Writes all of `data` to fd; false on error (errno set).
bool write_all(int fd, std::string_view data);

// "/v1/sessions/<id>/processes/<ref>", both percent-encoded as path segments.
std::string process_target(std::string_view session, std::string_view ref);

// argv as one /bin/sh command line: words with nothing special kept as they are, the rest in
// single quotes ("ls -l 'a b' 'it'\''s'").
std::string shell_join(const std::vector<std::string>& argv);

// The exit code a terminal's close reason carries: "exit N" -> N, "signal N" -> 128+N; nullopt
// for any other reason.
std::optional<int> exit_code_of_close(std::string_view reason);

// The records of GET .../processes/{ref}/output (NDJSON {"type","data","offset"} and a last
// {"type":"exit"}), fed as the bytes arrive, over as many connections as it takes: it tracks
// the offset to resume at (`since`) and drops any byte it has already passed on, so a client
// that reconnects neither loses nor repeats output.
class OutputRecords {
 public:
  // Gets each record's data ("stdout", "stderr" or "pty"); false stops (our stdout is gone).
  using Sink = std::function<bool(std::string_view type, std::string_view data)>;
  explicit OutputRecords(Sink sink) : sink_(std::move(sink)) {}

  // False once the sink refused.
  bool feed(std::string_view chunk);
  // A connection ended: a half-received line is dropped (the next request asks for it again).
  void connection_ended() { pending_.clear(); }

  // The offset to ask for next (since=N); nullopt before any record.
  std::optional<std::uint64_t> next() const { return next_; }
  // The exit record, once it came.
  struct Exit {
    int exit_code = 0;
    std::optional<int> signal;
  };
  const std::optional<Exit>& exit() const { return exit_; }
  // A line that was not a record (the server's or a proxy's fault), for the error message.
  const std::string& bad_line() const { return bad_line_; }

 private:
  bool line(std::string_view l);
  Sink sink_;
  std::string pending_;
  std::optional<std::uint64_t> next_;
  std::optional<Exit> exit_;
  std::string bad_line_;
};

// Rows as left-aligned columns, two spaces apart, on stdout (`ps`, `session list`).
void print_table(const std::vector<std::vector<std::string>>& rows);

// Human-readable byte count: "512 B", "1.5 KiB", "12.0 MiB".
std::string human_bytes(std::uint64_t n);

// One frame of the progress bar, without the leading "\r" and the trailing erase-to-end-of-line:
// "a.bin [==========>                   ]  33% 1.0 MiB / 3.0 MiB  512.0 KiB/s". `final` (the
// last frame) draws no '>' head.
std::string progress_line(std::string_view label, std::uint64_t done, std::uint64_t total,
                          std::uint64_t bytes_per_sec, bool final);

// Whether a transfer of `total` bytes shows a progress bar when stderr is a terminal: over 1 MiB.
bool wants_progress(std::uint64_t total);

// A one-line progress bar on stderr, redrawn at most ~10 times a second. Inactive (prints
// nothing) unless stderr is a terminal and wants_progress(total).
class Progress {
 public:
  Progress(std::string label, std::uint64_t total);
  ~Progress();
  void update(std::uint64_t done);
  void finish();

 private:
  void draw(bool final);
  std::string label_;
  std::uint64_t total_;
  std::uint64_t done_ = 0;
  bool active_ = false;
  bool finished_ = false;
  std::int64_t start_ms_ = 0;
  std::int64_t last_draw_ms_ = 0;
};

// ---- commands ----

struct SessionCreateArgs {
  std::string id;
  std::string scope;
  std::vector<std::string> vars;
  std::string backend;
  std::string runner;  // --runner USER: backend remote on that runner
  std::vector<std::string> env;
  std::vector<std::string> labels;
  std::optional<std::uint64_t> memory_mb;
  std::optional<std::uint32_t> cpu_percent;
  std::optional<std::uint32_t> max_pids;
  std::optional<std::uint64_t> disk_mb;
  std::optional<std::uint32_t> cpu_time_sec;
  std::optional<std::uint64_t> tmp_mb;
  std::optional<std::uint32_t> max_open_files;
  std::string network;             // --network none|allowlist|open ("" = the server's default)
  std::vector<std::string> allow;  // --allow DOMAIN (repeatable): network allowlist
  std::optional<std::int64_t> ttl_sec;
  std::vector<std::string> mounts;  // HOST:BOX[:ro|rw]
  std::vector<std::string> skills;  // NAME=DIR
  std::string host_path;            // --host-path DIR[:ro|rw]: the workspace is that host dir
  bool quiet = false;
  std::string template_ref;  // --template NAME[@VERSION]
  std::string image;         // --image REF: the box's root (API.md "Images")
  bool writable_root = false;  // --writable-root: read_only_rootfs false
};
int session_create(const Globals& g, const SessionCreateArgs& a);
// Templates (session_cmd.cc): push a YAML file ('-' = stdin; warnings to stderr), list, build
// (follows the log; exit 0 when it made a snapshot), rollback to a version, remove.
int template_push(const Globals& g, const std::string& file);
int template_ls(const Globals& g, bool json);
int template_build(const Globals& g, const std::string& name);
int template_rollback(const Globals& g, const std::string& name, std::uint64_t version);
int template_rm(const Globals& g, const std::string& name);
int session_ls(const Globals& g, bool json);
// Images (image_cmd.cc): pull by reference (prints "REF DIGEST"), list, inspect (JSON), remove
// by digest (refused while a session uses it).
int image_pull(const Globals& g, const std::string& ref);
int image_ls(const Globals& g, bool json);
int image_inspect(const Globals& g, const std::string& ref);
int image_rm(const Globals& g, const std::string& digest);
// `agentbox runners`: GET /v1/runners as a table (or its JSON).
int runners_ls(const Globals& g, bool json);
int session_show(const Globals& g, const std::string& id);
int session_rm(const Globals& g, const std::string& id, bool archive);
// POST /v1/sessions/{id}/restore {"archive": archive}; prints the new session as JSON.
int session_restore(const Globals& g, const std::string& id, const std::string& archive);
// POST /v1/sessions/{id}/{suspend|resume|keepalive}; prints "ID STATE".
int session_lifecycle(const Globals& g, const std::string& id, const std::string& action);

struct ExecArgs {
  std::string session;
  std::vector<std::string> argv;
  std::string command;  // -c: run by /bin/sh -c
  std::string cwd;
  std::vector<std::string> env;
  std::optional<std::uint32_t> timeout_sec;
  bool send_stdin = false;
};
int exec(const Globals& g, const ExecArgs& a);

// POST /v1/sessions/{id}/health or /repair: one line per check, then "ID: healthy|unhealthy";
// kExitUnhealthy when a check failed. `json`: the server's reply as it came.
int session_check(const Globals& g, const std::string& id, const std::string& action, bool json);

struct InstallArgs {
  std::string id;
  std::string manager;  // pip | npm
  std::vector<std::string> packages;
  bool no_persist = false;
  std::string index_url;
  std::vector<std::string> find_links;
  bool no_index = false;
  bool json = false;
};
// POST /v1/sessions/{id}/packages: prints the installer's output and what was recorded; exits
// with the installer's exit status (kExitTimedOut when it timed out).
int install(const Globals& g, const InstallArgs& a);

struct MountsAddArgs {
  std::string id;
  std::vector<std::string> mounts;  // HOST:BOX[:ro|rw]
  std::vector<std::string> skills;  // NAME=DIR
  std::string skill_mode;           // ro|rw; empty: the server's default (rw)
  bool json = false;
};
// POST /v1/sessions/{id}/mounts; says whether the mounts are live or come at the next start.
int session_mounts_add(const Globals& g, const MountsAddArgs& a);

// agentbox session limits SESSION --memory-mb N ...: PATCH /v1/sessions/{id} {"limits"}; prints
// the limits now in force (the server's JSON with --json). No limit given: a usage error.
struct SessionLimitsArgs {
  std::string id;
  std::optional<std::uint64_t> memory_mb;
  std::optional<std::uint32_t> cpu_percent;
  std::optional<std::uint32_t> max_pids;
  std::optional<std::uint32_t> cpu_time_sec;
  std::optional<std::uint64_t> tmp_mb;
  std::optional<std::uint32_t> max_open_files;
  std::optional<std::uint64_t> disk_mb;
  bool json = false;
};
int session_limits(const Globals& g, const SessionLimitsArgs& a);

// agentbox network SESSION MODE [--allow DOMAIN ...]: POST /v1/sessions/{id}/network; a running
// session switches live. Prints the mode now in force (the server's JSON with --json).
struct NetworkArgs {
  std::string id;
  std::string mode;                // none | allowlist | open
  std::vector<std::string> allow;  // with allowlist
  bool json = false;
};
int network(const Globals& g, const NetworkArgs& a);

// Polls GET /healthz until it answers 200 (exit 0) or the timeout passes (kExitUnreachable).
int wait(const Globals& g, const std::string& url_arg, std::optional<std::uint32_t> timeout_sec);

int cp(const Globals& g, const std::string& from, const std::string& to, bool parents);
// An empty directory prints nothing on stdout and "(empty)" on stderr.
int ls(const Globals& g, const std::string& target, bool long_format);
int cat(const Globals& g, const std::string& target);
int rm(const Globals& g, const std::string& target, bool recursive);
int mkdir(const Globals& g, const std::string& target);
// GET /stat: "key: value" lines (path, type, size, mode, modified); `json`: the server's reply.
int stat(const Globals& g, const std::string& target, bool json);
// POST /rename. `to` is SESSION:PATH of the same session or a bare in-box path; into an
// existing directory (or a path ending in '/') the name is kept, as mv(1) does.
int mv(const Globals& g, const std::string& from, const std::string& to);

// ---- processes (process_cmd.cc) and terminals (terminal_cmd.cc) ----

struct StartArgs {
  std::string session;
  std::vector<std::string> argv;
  std::string command;  // -c: a shell command line
  std::string tag;
  std::string restart;  // never | on-failure | always; empty: the server's default (never)
  std::string cwd;
  std::vector<std::string> env;
  bool pty = false;
  bool send_stdin = false;  // keep the process's stdin open (attach, POST .../stdin)
  bool quiet = false;       // print only the pid
};
// POST /v1/sessions/{id}/processes; prints the process object (JSON), or only its pid.
int start(const Globals& g, const StartArgs& a);
// GET /v1/sessions/{id}/processes as a table: PID TAG STATUS EXIT COMMAND.
int ps(const Globals& g, const std::string& session, bool json);
// GET .../output: stdout and pty bytes to our stdout, stderr to our stderr. `follow`: until the
// process ends, reconnecting (with since=) after a dropped connection.
int logs(const Globals& g, const std::string& session, const std::string& ref, bool follow);
// No signal: DELETE (the whole tree, waits for the end). A signal: POST .../signal.
int kill(const Globals& g, const std::string& session, const std::string& ref,
         const std::string& signal);
// GET /v1/sessions/{id}/pty over WebSocket as an interactive terminal; exits with the shell's
// exit code (128+N when killed by signal N).
int shell(const Globals& g, const std::string& session, const std::vector<std::string>& argv);
// GET .../processes/{ref}/attach: a pty process as a terminal, another in line mode (stdin
// lines -> text frames, frames -> stdout lines). Exits with the process's exit code when it
// ends, 0 when detached.
int attach(const Globals& g, const std::string& session, const std::string& ref);

// agentbox mcp SESSION (mcp_cmd.cc): the session's MCP tools served over stdio (one JSON-RPC
// message per line on in_fd, the replies on out_fd) through POST /v1/sessions/{id}/mcp, until
// the end of in_fd.
int mcp_stdio(const Globals& g, const std::string& session, int in_fd, int out_fd);

}  // namespace agentbox::cli
