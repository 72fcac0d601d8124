#pragma once
// xbot's remote-runner protocol (shared/PROTOCOLS.md part 1), byte for byte, plus agentbox's
// `version: 1` extension (docs/runner-protocol.md: chunked transfer of big files). Shared by
// agentbox-runner (src/runner/) and agentboxd's /ws/{user} endpoint; no I/O here, only the
// frames: the envelope, every body of PROTOCOLS.md 1.3 with its JSON encoding and decoding, the
// error codes, Go's os.FileMode bits, base64.
//
// Encoding follows Go's encoding/json as xbot marshals: struct field order, `omitempty` where
// xbot has it, compact output, `<` `>` `&` U+2028 U+2029 escaped as \u003c..., invalid UTF-8
// replaced by U+FFFD. Decoding follows Go's json.Unmarshal into those structs: a missing or
// `null` field is the zero value, unknown fields are ignored, a field of the wrong JSON type is
// EINVAL naming it; a request without `body` is EINVAL, a `null` body is all zero values.
// Nothing throws: every decoder returns a Result whose error names the bad field.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base64.h"
#include "common/error.h"

namespace agentbox::runner::proto {

// Keys keep their insertion order, so frames come out in Go's field order.
using Json = nlohmann::ordered_json;

// ---- agentbox's extension (docs/runner-protocol.md) ----
// `register.body.version` and `register_ok.body.version`: each side sends the highest version it
// speaks; agentboxd's register_ok says the lower of the two (negotiate()), and that one is in
// force; 0 (absent) is xbot's plain form.
inline constexpr int kProtocolVersion = 3;
// Version 1: chunked files. Version 2: version 1 plus process streams (stderr, eof, signals, pid,
// exit signal; docs/runner-protocol.md "Process streams"). Version 3: version 2 plus binary
// chunks (each chunk's bytes in a binary WebSocket frame, binary_chunk(); a bigger window; an
// upload's size may be unknown at file_begin) and EISDIR/ENOTDIR/ENOTEMPTY sent as themselves.
inline constexpr int kChunkedVersion = 1;
inline constexpr int kStreamsVersion = 2;
inline constexpr int kBinaryVersion = 3;
// What register_ok answers a runner that said `runner_version`: min(theirs, ours), 0 if none.
int negotiate(int runner_version, int ours = kProtocolVersion);
// Files strictly larger than this travel in chunks (when both peers speak version 1).
inline constexpr std::int64_t kChunkThreshold = 4 << 20;
// Raw bytes per file_chunk (the last one may be shorter).
inline constexpr std::int64_t kChunkSize = 1 << 20;
// A sender has at most this many unacknowledged chunk bytes in flight.
inline constexpr std::int64_t kWindowBytes = 8 << 20;
// The largest file either side accepts in the chunked form (500 MB, seed 003).
inline constexpr std::int64_t kMaxFileSize = 500'000'000;
// Version 3: raw bytes per binary chunk frame, and the unacknowledged bytes a sender may have
// in flight (the receiver's memory is bounded by it).
inline constexpr std::int64_t kBinaryChunkSize = 1 << 20;
inline constexpr std::int64_t kBinaryWindowBytes = 16 << 20;
// Version 3: file_begin of an upload may say this size: not known yet (the sender streams what
// it receives); file_end says the size, and the receiver enforces kMaxFileSize as chunks come.
inline constexpr std::int64_t kSizeUnknown = -1;

// ---- message types ----
namespace type {
inline constexpr std::string_view kRegister = "register";
inline constexpr std::string_view kRegisterOk = "register_ok";
inline constexpr std::string_view kError = "error";
inline constexpr std::string_view kOk = "ok";
inline constexpr std::string_view kExec = "exec";
inline constexpr std::string_view kExecResult = "exec_result";
inline constexpr std::string_view kReadFile = "read_file";
inline constexpr std::string_view kFileContent = "file_content";
inline constexpr std::string_view kWriteFile = "write_file";
inline constexpr std::string_view kStat = "stat";
inline constexpr std::string_view kFileInfo = "file_info";
inline constexpr std::string_view kReadDir = "read_dir";
inline constexpr std::string_view kDirEntries = "dir_entries";
inline constexpr std::string_view kMkdirAll = "mkdir_all";
inline constexpr std::string_view kRemove = "remove";
inline constexpr std::string_view kRemoveAll = "remove_all";
inline constexpr std::string_view kDownloadFile = "download_file";
inline constexpr std::string_view kBgExec = "bg_exec";
inline constexpr std::string_view kBgStarted = "bg_started";
inline constexpr std::string_view kBgStatus = "bg_status";
inline constexpr std::string_view kBgOutput = "bg_output";
inline constexpr std::string_view kBgKill = "bg_kill";
inline constexpr std::string_view kStdioStart = "stdio_start";
inline constexpr std::string_view kStdioWrite = "stdio_write";
inline constexpr std::string_view kStdioClose = "stdio_close";
inline constexpr std::string_view kStdioData = "stdio_data";
inline constexpr std::string_view kStdioExit = "stdio_exit";
inline constexpr std::string_view kPtyCreate = "pty_create";
inline constexpr std::string_view kPtyStdin = "pty_stdin";
inline constexpr std::string_view kPtyResize = "pty_resize";
inline constexpr std::string_view kPtyClose = "pty_close";
inline constexpr std::string_view kPtyData = "pty_data";
inline constexpr std::string_view kPtyExit = "pty_exit";
inline constexpr std::string_view kStdioSignal = "stdio_signal";  // version 2 only
inline constexpr std::string_view kLlmGenerate = "llm_generate";
inline constexpr std::string_view kLlmResponse = "llm_response";
inline constexpr std::string_view kLlmModels = "llm_models";
inline constexpr std::string_view kLlmModelsResponse = "llm_models_response";
// version 1 only
inline constexpr std::string_view kFileBegin = "file_begin";
inline constexpr std::string_view kFileChunk = "file_chunk";
inline constexpr std::string_view kFileEnd = "file_end";
inline constexpr std::string_view kAck = "ack";
}  // namespace type

// Pushes are routed by type before id (PROTOCOLS.md 1.1): stdio_data/exit, pty_data/exit.
bool is_push(std::string_view type);

// ---- error codes (the `code` of an `error` body) ----
namespace code {
inline constexpr std::string_view kInvalid = "EINVAL";
inline constexpr std::string_view kPerm = "EPERM";
inline constexpr std::string_view kNotFound = "ENOENT";
inline constexpr std::string_view kExists = "EEXIST";
inline constexpr std::string_view kIO = "EIO";
inline constexpr std::string_view kNotSupported = "ENOTSUP";
inline constexpr std::string_view kIsDir = "EISDIR";    // in xbot's decode table, never sent
inline constexpr std::string_view kNotDir = "ENOTDIR";  // in xbot's decode table, never sent
inline constexpr std::string_view kTooBig = "ETOOBIG";  // version 1: over kMaxFileSize
inline constexpr std::string_view kNotEmpty = "ENOTEMPTY";  // version 3 (xbot: EEXIST)
}  // namespace code

// xbot's ProtoErrorCode: ENOENT->ENOENT; EEXIST and ENOTEMPTY->EEXIST; EACCES/EPERM->EPERM;
// everything else EIO. agentbox-runner adds EXDEV/ELOOP (openat2 refusing an escape) -> EPERM.
std::string_view code_for_errno(int err);
// Version 3's table: xbot's, except EISDIR, ENOTDIR and ENOTEMPTY, sent as themselves.
std::string_view code_for_errno_exact(int err);
// The wire code as one of agentbox's Codes, for agentboxd's remote backend: ENOENT->kNotFound,
// EEXIST->kExists, EPERM->kAccess, EINVAL->kInvalid, EISDIR->kIsDir, ENOTDIR->kNotDir,
// ENOTSUP->kNotSupported, ETOOBIG->kTooBig, anything else (EIO, unknown, empty)->kInternal.
Code to_code(std::string_view wire_code);
// to_code, and for EIO/EEXIST (what xbot's runner and versions < 3 send for every other errno)
// the errno that Go's message ends with: "...: is a directory" -> kIsDir, "...: not a
// directory" -> kNotDir, "...: directory not empty" -> kNotEmpty. ENOTEMPTY -> kNotEmpty.
Code to_code(std::string_view wire_code, std::string_view message);

// ---- the envelope ----
// {"id","type","user_id","body"}; id, user_id and body are omitempty.
struct Envelope {
  std::string id;  // "" -> omitted
  std::string type;
  std::string user_id;       // "" -> omitted
  std::optional<Json> body;  // nullopt -> omitted; a JSON null is kept as null
  // Never encoded: a version 3 binary chunk handed on as a file_chunk envelope (body {"offset"})
  // carries its bytes here rather than base64 in the body.
  std::optional<std::string> binary;
};

// One frame's text.
std::string encode(const Envelope& e);
// Frames from parts; `body` may be nullopt (omitted).
std::string frame(std::string_view id, std::string_view type, std::optional<Json> body);
// A file_chunk frame (version 1), the same bytes as encode() of {id, "file_chunk", user_id,
// to_json(FileChunk{offset, data})}, without copying the base64 text through a Json value and
// its escaper (they held 1 MiB chunks to tens of MB/s).
std::string chunk_frame(std::string_view id, std::string_view user_id, std::int64_t offset,
                        std::string_view data);
// Version 3: one chunk of a transfer as a binary WebSocket frame:
//   byte 0        1 (the kind: a file chunk)
//   byte 1        L, the length of the request id (1..255)
//   bytes 2..L+1  the request id
//   8 bytes       the chunk's offset in the file, unsigned big-endian
//   the rest      the chunk's raw bytes (0..kBinaryChunkSize)
inline constexpr std::uint8_t kBinaryChunkKind = 1;
std::size_t binary_chunk_header_size(std::string_view id);
// The frame; `data` copied once after the header.
std::string binary_chunk(std::string_view id, std::int64_t offset, std::string_view data);
// Only the header, with room for `data_size` bytes after it (the caller fills them: a pread
// straight into the frame).
std::string binary_chunk_header(std::string_view id, std::int64_t offset, std::size_t data_size);
struct BinaryChunk {
  std::string_view id;
  std::int64_t offset = 0;
  std::string_view data;  // views into the frame
};
// EINVAL naming what is wrong: too short, another kind, an empty id, an offset over 2^63.
Result<BinaryChunk> decode_binary_chunk(std::string_view frame);

// {"id":id,"type":"error","body":{"message":m,"code":c}} (id omitted when empty).
std::string error_frame(std::string_view id, std::string_view wire_code, std::string_view message);
// Parses one text frame. EINVAL: not JSON, not an object, `type` missing or not a string, `id`
// or `user_id` not a string.
Result<Envelope> decode(std::string_view text);

// "req_" + 16 lowercase hex digits from 8 random bytes, as xbot's server generates.
std::string generate_id();

// ---- bodies ----
// Each has `Json to_json(const T&)` (Go's marshalling) and `Status from_json(const
// std::optional<Json>& body, T& out)` (Go's unmarshalling of the envelope's body, so a missing
// body is EINVAL); body_as<T>(envelope) wraps the latter.

struct RegisterBody {
  std::string user_id, auth_token, workspace, shell;
  std::string llm_provider, llm_model;  // omitempty
  int version = 0;                      // omitempty; agentbox sends kProtocolVersion
  // omitempty; agentbox's extension: what the runner enforces (enforce:: names below)
  std::vector<std::string> enforces;
};
struct RegisterOk {
  std::string status = "ok";
  int version = 0;  // omitempty; agentboxd sends kProtocolVersion
};
struct ErrorBody {
  std::string message;
  std::string code;  // omitempty
};
struct ExecRequest {
  std::string command;
  std::vector<std::string> args;  // omitempty
  bool shell = false;
  std::string dir;               // omitempty
  std::vector<std::string> env;  // omitempty, "KEY=VALUE"
  std::string stdin_data;        // "stdin", omitempty
  std::int64_t timeout = 0;      // seconds; <=0 or >3600 means 60
  std::string run_as_user;       // omitempty
};
struct ExecResult {
  std::string stdout_data;  // "stdout"
  std::string stderr_data;  // "stderr"
  int exit_code = 0;
  bool timed_out = false;
};
// read_file, stat, read_dir, remove_all; remove (perm accepted and ignored).
struct PathRequest {
  std::string path;
};
struct FileContent {
  std::string data;  // base64 on the wire; raw bytes here
};
struct WriteFileRequest {
  std::string path;
  std::string data;        // base64 on the wire; raw bytes here (bad base64 is EIO, as xbot)
  std::uint32_t perm = 0;  // Go FileMode
};
struct MkdirAllRequest {
  std::string path;
  std::uint32_t perm = 0;  // omitempty
};
struct FileInfo {
  std::string name;
  std::int64_t size = 0;
  std::uint32_t mode = 0;  // Go FileMode
  std::string mod_time;    // RFC 3339, local zone, seconds
  bool is_dir = false;
};
struct DirEntry {
  std::string name;
  bool is_dir = false;
  std::int64_t size = 0;
};
struct DirEntries {
  std::vector<DirEntry> entries;  // [] when empty, never null
};
struct DownloadRequest {
  std::string url, output_path;
};
struct SizeBody {  // download_file's ok body
  std::int64_t size = 0;
};
struct BgExecRequest {
  std::string task_id, command;
  std::vector<std::string> args;  // omitempty
  bool shell = false;
  std::string dir;               // omitempty
  std::vector<std::string> env;  // omitempty
  std::string stdin_data;        // "stdin", omitempty
};
struct TaskRequest {  // bg_status, bg_kill; also bg_started's body
  std::string task_id;
};
struct BgOutput {
  std::string task_id, status;  // running|completed|failed|killed
  int exit_code = 0;            // omitempty
  std::string stdout_data, stderr_data;
};
struct StdioStart {
  std::string stream_id, command;
  std::vector<std::string> args, env;  // omitempty
  std::string dir;                     // omitempty
  bool stderr_pipe = false;            // "stderr", omitempty; version 2: stderr is pushed too
};
struct StreamData {  // stdio_write, stdio_data, pty_stdin, pty_data
  std::string stream_id;
  std::string data;        // base64 on the wire; raw bytes here
  bool is_stderr = false;  // "stderr", omitempty; version 2: stdio_data of the stderr pipe
  bool eof = false;        // omitempty; version 2: stdio_write closes stdin after `data`
};
struct StreamRequest {  // stdio_close, pty_close; also the ok body of stdio_start/pty_create
  std::string stream_id;
  int pid = 0;  // omitempty; version 2: the ok body carries the child's pid (= its pgid)
};
struct StreamExit {  // stdio_exit, pty_exit
  std::string stream_id;
  int exit_code = 0;
  std::string error;  // omitempty
  int signal = 0;     // omitempty; version 2: the signal that ended the child
};
struct StreamSignal {  // stdio_signal (version 2), for stdio and pty streams alike
  std::string stream_id;
  int signal = 0;
  bool group = false;  // omitempty: to the child's whole process group, else to the child
};
struct PtyCreate {
  std::string stream_id, command;
  std::vector<std::string> args, env;  // omitempty
  std::string dir;                     // omitempty
  std::uint16_t cols = 0, rows = 0;    // 0: 80x24
};
struct PtyResize {
  std::string stream_id;
  std::uint16_t cols = 0, rows = 0;
};
struct LlmModels {
  std::vector<std::string> models;
};
// version 1: chunked files (docs/runner-protocol.md).
struct FileBegin {
  std::string path;        // omitempty: set on an upload (server -> runner), empty on a download
  std::uint32_t perm = 0;  // with path only
  std::int64_t size = 0;
};
struct FileChunk {
  std::int64_t offset = 0;
  std::string data;  // base64 on the wire; raw bytes here
};
struct FileEnd {
  std::int64_t size = 0;
};
struct Ack {
  std::int64_t offset = 0;  // bytes received and stored so far
};

Json to_json(const RegisterBody&);
Json to_json(const RegisterOk&);
Json to_json(const ErrorBody&);
Json to_json(const ExecRequest&);
Json to_json(const ExecResult&);
Json to_json(const PathRequest&);
Json to_json(const FileContent&);
Json to_json(const WriteFileRequest&);
Json to_json(const MkdirAllRequest&);
Json to_json(const FileInfo&);
Json to_json(const DirEntries&);
Json to_json(const DownloadRequest&);
Json to_json(const SizeBody&);
Json to_json(const BgExecRequest&);
Json to_json(const TaskRequest&);
Json to_json(const BgOutput&);
Json to_json(const StdioStart&);
Json to_json(const StreamData&);
Json to_json(const StreamRequest&);
Json to_json(const StreamExit&);
Json to_json(const PtyCreate&);
Json to_json(const PtyResize&);
Json to_json(const StreamSignal&);
Json to_json(const LlmModels&);
Json to_json(const FileBegin&);
Json to_json(const FileChunk&);
Json to_json(const FileEnd&);
Json to_json(const Ack&);

Status from_json(const std::optional<Json>& body, RegisterBody& out);
Status from_json(const std::optional<Json>& body, RegisterOk& out);
Status from_json(const std::optional<Json>& body, ErrorBody& out);
Status from_json(const std::optional<Json>& body, ExecRequest& out);
Status from_json(const std::optional<Json>& body, ExecResult& out);
Status from_json(const std::optional<Json>& body, PathRequest& out);
Status from_json(const std::optional<Json>& body, FileContent& out);
Status from_json(const std::optional<Json>& body, WriteFileRequest& out);
Status from_json(const std::optional<Json>& body, MkdirAllRequest& out);
Status from_json(const std::optional<Json>& body, FileInfo& out);
Status from_json(const std::optional<Json>& body, DirEntries& out);
Status from_json(const std::optional<Json>& body, DownloadRequest& out);
Status from_json(const std::optional<Json>& body, SizeBody& out);
Status from_json(const std::optional<Json>& body, BgExecRequest& out);
Status from_json(const std::optional<Json>& body, TaskRequest& out);
Status from_json(const std::optional<Json>& body, BgOutput& out);
Status from_json(const std::optional<Json>& body, StdioStart& out);
Status from_json(const std::optional<Json>& body, StreamData& out);
Status from_json(const std::optional<Json>& body, StreamRequest& out);
Status from_json(const std::optional<Json>& body, StreamExit& out);
Status from_json(const std::optional<Json>& body, PtyCreate& out);
Status from_json(const std::optional<Json>& body, PtyResize& out);
Status from_json(const std::optional<Json>& body, StreamSignal& out);
Status from_json(const std::optional<Json>& body, LlmModels& out);
Status from_json(const std::optional<Json>& body, FileBegin& out);
Status from_json(const std::optional<Json>& body, FileChunk& out);
Status from_json(const std::optional<Json>& body, FileEnd& out);
Status from_json(const std::optional<Json>& body, Ack& out);

template <typename T>
Result<T> body_as(const Envelope& e) {
  T out{};
  if (auto s = from_json(e.body, out); !s) return std::unexpected(std::move(s).error());
  return out;
}

// ---- agentbox's extension: limits (docs/runner-protocol.md "Limits") ----
// The names of `register.body.enforces`: what the runner enforces on the commands it runs.
// "timeout" and "output_cap" are per request (every exec's timeout; output kept up to a cap);
// the others are the session limits of API.md's `limits` object, which the runner enforces when
// a request carries them (BoxLimits). A runner without `enforces` (xbot's) enforces none of the
// session limits: agentboxd refuses them for its sessions (501).
namespace enforce {
inline constexpr std::string_view kTimeout = "timeout";
inline constexpr std::string_view kOutputCap = "output_cap";
inline constexpr std::string_view kMemoryMb = "memory_mb";
inline constexpr std::string_view kMaxPids = "max_pids";
}  // namespace enforce
// On `exec`, `stdio_start` and `pty_create` to a runner that enforces session limits: the box
// the command belongs to (the runner keeps one cgroup per box, so the limits bound the
// session's commands together) and the limits it enforces, by the names of enforce::. Fields
// "box" and "limits" of the request body, both omitted when empty (so an xbot runner never
// sees them).
struct BoxLimits {
  std::string box;
  std::map<std::string, std::uint64_t> limits;
};
// Adds "box" and "limits" to a request body (nothing when empty).
void add_box_limits(Json& body, const BoxLimits& b);
// Reads them from a request body; EINVAL naming a field of the wrong type, a bad box name
// ([A-Za-z0-9._-]{1,128}, not "." or "..") or a limit that is not a positive integer.
Status from_json(const std::optional<Json>& body, BoxLimits& out);

// decode(), and seed 003's flat form of a frame (its fields beside id and type, no `body`:
// {"id":"r","type":"exec_result","stdout":"..",...}): every key but id and type becomes the
// body. A frame with a `body`, or with nothing but id/type/user_id, is decoded as decode() does.
// agentboxd reads runner frames with it.
Result<Envelope> decode_flat_or_envelope(std::string_view text);

// ---- Go os.FileMode ----
namespace gomode {
inline constexpr std::uint32_t kDir = 1u << 31;
inline constexpr std::uint32_t kAppend = 1u << 30;
inline constexpr std::uint32_t kExclusive = 1u << 29;
inline constexpr std::uint32_t kTemporary = 1u << 28;
inline constexpr std::uint32_t kSymlink = 1u << 27;
inline constexpr std::uint32_t kDevice = 1u << 26;
inline constexpr std::uint32_t kNamedPipe = 1u << 25;
inline constexpr std::uint32_t kSocket = 1u << 24;
inline constexpr std::uint32_t kSetuid = 1u << 23;
inline constexpr std::uint32_t kSetgid = 1u << 22;
inline constexpr std::uint32_t kCharDevice = 1u << 21;
inline constexpr std::uint32_t kSticky = 1u << 20;
inline constexpr std::uint32_t kIrregular = 1u << 19;
inline constexpr std::uint32_t kPerm = 0777;
}  // namespace gomode

// A POSIX st_mode as Go's os.FileMode (what `stat`'s `mode` carries): 0755 dir -> 2147484141.
std::uint32_t go_mode_from_st_mode(mode_t st_mode);
// Go's FileMode as a POSIX st_mode (type and permission bits), for agentboxd's /v1 shapes.
mode_t st_mode_from_go_mode(std::uint32_t go_mode);
// The bits of a `perm` that reach open(2)/mkdir(2): permissions, setuid, setgid, sticky.
mode_t perm_from_go(std::uint32_t go_perm);
// The inverse, for a sender: POSIX permission bits (incl. 07000) as a Go FileMode.
std::uint32_t go_perm_from_mode(mode_t mode);

// `mod_time` as xbot formats it: RFC 3339 in the local zone, seconds ("Z" for offset 0).
std::string format_mod_time(std::int64_t unix_seconds);
// Parses an RFC 3339 time (any offset, optional fraction) to Unix seconds; EINVAL otherwise.
Result<std::int64_t> parse_mod_time(std::string_view text);

// ---- base64: Go's StdEncoding (common/base64.h) ----
using agentbox::base64_decode;
using agentbox::base64_encode;

}  // namespace agentbox::runner::proto
