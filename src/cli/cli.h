#pragma once
// The agentbox CLI: one function per command, each returning the process exit code. They talk
// to agentboxd only through client::Client (the CLI never links isolation code). Errors go to
// stderr as "agentbox: CODE: message".

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client/client.h"
#include "common/error.h"

namespace agentbox::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;       // API or I/O error
inline constexpr int kExitUsage = 2;       // bad command line
inline constexpr int kExitTimedOut = 124;  // the command timed out (as coreutils timeout)

struct Globals {
  std::string server = "http://127.0.0.1:9090";
  std::string token;
  client::ClientOptions options() const;
};

// ---- helpers (util.cc) ----

// Prints "agentbox: CODE: message" and returns kExitError.
int report(const Error& e);
// Prints the API error of a non-2xx reply (or its status and body) and returns kExitError.
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

// Writes all of `data` to fd; false on error (errno set).
bool write_all(int fd, std::string_view data);

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
  std::vector<std::string> env;
  std::vector<std::string> labels;
  std::optional<std::uint64_t> memory_mb;
  std::optional<std::uint32_t> cpu_percent;
  std::optional<std::uint32_t> max_pids;
  std::optional<std::uint64_t> disk_mb;
  std::optional<std::int64_t> ttl_sec;
  std::vector<std::string> mounts;  // HOST:BOX[:ro|rw]
  std::vector<std::string> skills;  // NAME=DIR
  bool quiet = false;
};
int session_create(const Globals& g, const SessionCreateArgs& a);
int session_ls(const Globals& g, bool json);
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

int cp(const Globals& g, const std::string& from, const std::string& to, bool parents);
int ls(const Globals& g, const std::string& target, bool long_format);
int cat(const Globals& g, const std::string& target);
int rm(const Globals& g, const std::string& target, bool recursive);
int mkdir(const Globals& g, const std::string& target);

}  // namespace agentbox::cli
