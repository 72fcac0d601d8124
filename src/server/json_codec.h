#pragma once
// The JSON wire layer (API.md): validating decoders for request bodies and encoders for
// replies. Decoders never throw and never use operator[] on input; a wrong type, a missing
// required field or an out-of-range value is EINVAL naming the field ("field 'timeout_sec' must
// be a number"). An unknown field of a /v1 body, nested objects included, is EINVAL naming it
// (check_known_fields; API.md "General"): a misspelt `limts` never makes a session with
// defaults. Seed 001's /exec and /workspace/* bodies, a dialect's, keep ignoring extra top-level
// fields (API.md lets a dialect take what its clients send). Encoders produce nlohmann::json;
// to_wire() dumps it with invalid UTF-8 replaced by U+FFFD (process output may be any bytes).

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "sandbox/process_table.h"
#include "sandbox/sandbox.h"
#include "session/session_manager.h"
#include "sandbox/installers.h"

namespace agentbox::server {

using nlohmann::json;

inline constexpr std::size_t kMaxOutputBytesLimit = 64u << 20;  // per stream, per exec
inline constexpr double kMaxTimeoutSec = 86400;

// Parses an untrusted body into a JSON object. Malformed JSON or a non-object is EINVAL. An
// empty body is {} when allow_empty (routes whose body is optional).
Result<json> parse_object(std::string_view body, bool allow_empty = false);

// API.md "General": every key of `obj` must be one of `known`, else EINVAL naming the first
// other one as "<where>.<key>" (just "<key>" when `where` is empty), with what the object takes.
// The one check every /v1 body decoder (and the surfaces' own small bodies) uses.
Status check_known_fields(const json& obj, std::initializer_list<std::string_view> known,
                          std::string_view where = {});

// Dumps for the wire: compact, invalid UTF-8 replaced.
std::string to_wire(const json& j);

// Fail closed (API.md "General"): a field or value this version does not implement is refused
// with ENOTSUP (501) naming it, never accepted and ignored; a malformed one is EINVAL (400).

// The network modes that work. The one place to extend when the egress proxy lands: the
// decoder, /readyz and /metrics all read it.
inline constexpr std::string_view kNetworkModesBuilt[] = {"none", "allowlist", "open"};
bool network_mode_built(std::string_view mode);

// The workspace as commands in an isolated box see it.
inline constexpr std::string_view kWorkspacePath = "/workspace";

// `limits` (or seed 001's `cgroup`) at obj[key]: memory_mb, cpu_percent, max_pids, disk_mb,
// max_open_files, cpu_time_sec, tmp_mb, each within its floor and ceiling (EINVAL naming
// "<key>.<name>"; common/validate.h). Absent: all unset. Also validates the config's
// default_limits. The rule between fields (tmp_mb at most half of memory_mb) is checked on
// the effective limits: sandbox::check_limits_together.
Result<sandbox::Limits> decode_limits(const json& obj, std::string_view key);

// `network`: mode none|allowlist|open (only kNetworkModesBuilt work, others ENOTSUP), allow
// (needs mode allowlist: EINVAL otherwise).
Status decode_network(const json& body, session::NetworkSpec* out);


// POST /v1/sessions: id | scope (+ variables, always type-checked), backend, mounts,
// extra_mounts (= mounts), host_path/mount_path/host_path_mode (seed 002's primary mount: one
// more mount; replacing /workspace itself is ENOTSUP; mode none mounts nothing), skills,
// skill_mode (rw|ro for those skills; default rw), limits, network, env, ttl_sec, labels.
// `template` is ENOTSUP.
struct CreateSessionRequest {
  std::string id;  // rendered and validated
  session::SessionSpec spec;
};
// `default_scope` is rendered when the body names neither id nor scope but has variables.
Result<CreateSessionRequest> decode_create_session(const json& body,
                                                   std::string_view default_scope = {});

// POST /v1/sessions/{id}/mounts: mounts (and extra_mounts), skills, skill_mode, as at create;
// at least one mount or skill (EINVAL otherwise). The result's mounts, skills and
// read_only_skills are what to add.
Result<session::SessionSpec> decode_add_mounts(const json& body);
// PATCH /v1/sessions/{id}: "limits" (the fields to change, bounds checked as at create),
// "ttl_sec", "labels" (replaces them); at least one, no other field (EINVAL naming it).
Result<session::SessionManager::Update> decode_session_patch(const json& body);
// POST /v1/sessions/{id}/packages {"manager": "pip|npm", "packages": [..], "persist", and for
// pip "index_url", "find_links", "no_index"; "timeout_sec"}: checked (sandbox::validate_install).
Result<sandbox::InstallRequest> decode_install(const json& body);

// POST /v1/sessions/{id}/exec and .../exec/stream: "command" or "argv" (exactly one), cwd, env,
// stdin, timeout_sec, max_output_bytes, artifact_dir (no NUL, no '..'; service::check_artifact_dir checks it against the box).
Result<sandbox::ExecSpec> decode_exec(const json& body);

// POST /exec and /exec-stream (seed 001): command (or argv), timeout_sec, max_output_bytes, env
// (env.AGENT_ID names the session unless agent_id is given), cgroup, artifact_dir.
struct SeedExecRequest {
  std::string session_id;
  sandbox::ExecSpec spec;
  sandbox::Limits limits;  // from "cgroup"; applied when the session is created
};
Result<SeedExecRequest> decode_seed_exec(const json& body);

// POST /workspace/read {"agent_id","path"} and /workspace/write {"agent_id","path","content"}.
struct SeedFileRequest {
  std::string session_id;
  std::string path;
  std::string content;  // write only
};
Result<SeedFileRequest> decode_seed_read(const json& body);
Result<SeedFileRequest> decode_seed_write(const json& body);
// The agent a seed 001 request names ("agent_id", or /exec's env.AGENT_ID), validated.
Result<std::string> decode_seed_agent(const json& body);

// POST .../mkdir {"path"} and .../rename {"from","to"}.
Result<std::string> decode_mkdir(const json& body);
struct RenameRequest {
  std::string from;
  std::string to;
};
Result<RenameRequest> decode_rename(const json& body);

// POST /v1/sessions/{id}/processes: "command" or "argv" (exactly one), cwd, env, tag, stdin
// (bool), pty {cols, rows} (1..1000 each), restart ("never", "on-failure", "always": managed).
Result<sandbox::ProcessSpec> decode_process_start(const json& body);
// POST .../processes/{ref}/signal {"signal": "SIGTERM" | "TERM" | 15}: the signal number.
Result<int> decode_signal(const json& body);
// POST .../processes/{ref}/resize {"cols", "rows"} (and the pty route's query), 1..1000 each.
Result<sandbox::PtySize> decode_pty_size(const json& body, std::string_view prefix = {});

// Encoders.
std::string rfc3339(std::chrono::system_clock::time_point t);
std::string rfc3339_ns(std::int64_t ns_since_epoch);
json encode_session(const session::SessionInfo& s);
// This daemon's node name, every session object's "node" (set once at startup, before serving).
void set_node_name(std::string name);
const std::string& node_name();
json encode_exec_result(const sandbox::ExecResult& r);
// API.md "Exec" killed_by: null, or "timeout" | "cpu_time" | "memory" | "pids".
json encode_killed_by(sandbox::KilledBy k);
// Seed 001's reply: stdout, stderr, exit_code, duration_ms, artifacts.
json encode_seed_exec_result(const sandbox::ExecResult& r);
json encode_artifacts(const std::vector<sandbox::Artifact>& artifacts);
json encode_file_info(const sandbox::FileInfo& f);
json encode_dir(const std::vector<sandbox::DirEntry>& entries);
// The process object of API.md "Processes and terminals".
json encode_process(const sandbox::ProcessInfo& p);

// The number of trailing bytes of `s` that are an incomplete (so far valid) UTF-8 sequence:
// streamed output holds them back until the next chunk, so a character split across two reads
// is not replaced by two U+FFFD.
std::size_t utf8_incomplete_tail(std::string_view s);

}  // namespace agentbox::server
