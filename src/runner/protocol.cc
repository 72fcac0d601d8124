#include "runner/protocol.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>

namespace agentbox::runner::proto {
namespace {

// ---- encoding ----

// Go's encoding/json escapes these for HTML safety; they can only occur inside JSON strings, so a
// pass over the dumped text is exact.
std::string go_escape(std::string text) {
  std::size_t extra = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '<' || c == '>' || c == '&') {
      extra += 5;
    } else if (c == '\xE2' && i + 2 < text.size() && text[i + 1] == '\x80' &&
               (text[i + 2] == '\xA8' || text[i + 2] == '\xA9')) {
      extra += 3;
    }
  }
  if (extra == 0) return text;
  std::string out;
  out.reserve(text.size() + extra);
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '<') {
      out += "\\u003c";
    } else if (c == '>') {
      out += "\\u003e";
    } else if (c == '&') {
      out += "\\u0026";
    } else if (c == '\xE2' && i + 2 < text.size() && text[i + 1] == '\x80' &&
               (text[i + 2] == '\xA8' || text[i + 2] == '\xA9')) {
      out += text[i + 2] == '\xA8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

std::string dump(const Json& j) {
  return go_escape(j.dump(-1, ' ', false, Json::error_handler_t::replace));
}

Json strings(const std::vector<std::string>& v) {
  Json a = Json::array();
  for (const auto& s : v) a.push_back(s);
  return a;
}

// ---- decoding, as Go's json.Unmarshal into a struct ----

const Json& empty_object() {
  static const Json kEmpty = Json::object();
  return kEmpty;
}

// The body's object; a null body reads as an empty one (all zero values).
Result<const Json*> object_of(const std::optional<Json>& body) {
  if (!body) return fail(Code::kInvalid, "missing body: unexpected end of JSON input");
  if (body->is_null()) return &empty_object();
  if (!body->is_object()) return fail(Code::kInvalid, "body must be a JSON object");
  return &*body;
}

const Json* field(const Json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

std::unexpected<Error> bad(const char* key, const char* want) {
  return fail(Code::kInvalid, std::string("body field '") + key + "' must be " + want);
}

Status get(const Json& o, const char* key, std::string& out) {
  const Json* v = field(o, key);
  if (!v) return {};
  if (!v->is_string()) return bad(key, "a string");
  out = v->get<std::string>();
  return {};
}

Status get(const Json& o, const char* key, bool& out) {
  const Json* v = field(o, key);
  if (!v) return {};
  if (!v->is_boolean()) return bad(key, "a boolean");
  out = v->get<bool>();
  return {};
}

// Integers in [lo, hi]; Go refuses fractions and out-of-range values for a sized int.
Status get_int(const Json& o, const char* key, std::int64_t lo, std::uint64_t hi,
               std::int64_t& out) {
  const Json* v = field(o, key);
  if (!v) return {};
  if (v->is_number_unsigned()) {
    auto u = v->get<std::uint64_t>();
    if (u > hi) return bad(key, "an integer in range");
    out = static_cast<std::int64_t>(u);
    return {};
  }
  if (v->is_number_integer()) {
    auto i = v->get<std::int64_t>();
    if (i < lo || (i >= 0 && static_cast<std::uint64_t>(i) > hi)) {
      return bad(key, "an integer in range");
    }
    out = i;
    return {};
  }
  return bad(key, "an integer");
}

Status get(const Json& o, const char* key, std::int64_t& out) {
  return get_int(o, key, INT64_MIN, INT64_MAX, out);
}
Status get(const Json& o, const char* key, int& out) {
  std::int64_t v = out;
  AB_TRY(get_int(o, key, INT32_MIN, INT32_MAX, v));
  out = static_cast<int>(v);
  return {};
}
Status get(const Json& o, const char* key, std::uint32_t& out) {
  std::int64_t v = out;
  AB_TRY(get_int(o, key, 0, UINT32_MAX, v));
  out = static_cast<std::uint32_t>(v);
  return {};
}
Status get(const Json& o, const char* key, std::uint16_t& out) {
  std::int64_t v = out;
  AB_TRY(get_int(o, key, 0, UINT16_MAX, v));
  out = static_cast<std::uint16_t>(v);
  return {};
}

Status get(const Json& o, const char* key, std::vector<std::string>& out) {
  const Json* v = field(o, key);
  if (!v) return {};
  if (!v->is_array()) return bad(key, "an array of strings");
  out.clear();
  for (const auto& e : *v) {
    if (e.is_null()) {
      out.emplace_back();
      continue;
    }
    if (!e.is_string()) return bad(key, "an array of strings");
    out.push_back(e.get<std::string>());
  }
  return {};
}

// A base64 field, decoded. xbot reports bad base64 in write_file as EIO; as data it is EINVAL.
Status get_b64(const Json& o, const char* key, std::string& out, Code code = Code::kInvalid) {
  std::string text;
  AB_TRY(get(o, key, text));
  auto raw = base64_decode(text);
  if (!raw) return fail(code, std::string("body field '") + key + "' is not valid base64");
  out = std::move(*raw);
  return {};
}

}  // namespace

bool is_push(std::string_view t) {
  return t == type::kStdioData || t == type::kStdioExit || t == type::kPtyData ||
         t == type::kPtyExit;
}

std::string_view code_for_errno(int err) {
  switch (err) {
    case ENOENT: return code::kNotFound;
    case EEXIST:
    case ENOTEMPTY: return code::kExists;
    case EACCES:
    case EPERM:
    case EXDEV:  // openat2 RESOLVE_BENEATH refusing to leave the workspace
    case ELOOP:  // a symlink where none may be followed
      return code::kPerm;
    default: return code::kIO;
  }
}

std::string_view code_for_errno_exact(int err) {
  switch (err) {
    case EISDIR: return code::kIsDir;
    case ENOTDIR: return code::kNotDir;
    case ENOTEMPTY: return code::kNotEmpty;
    default: return code_for_errno(err);
  }
}

int negotiate(int runner_version, int ours) {
  if (runner_version <= 0) return 0;
  return runner_version < ours ? runner_version : ours;
}

Code to_code(std::string_view c, std::string_view message) {
  if (c == code::kNotEmpty) return Code::kNotEmpty;
  if (c == code::kIO || c == code::kExists || c.empty()) {
    // Go's *PathError text: "<op> <path>: <strerror>", as xbot's runner (and agentbox-runner
    // before version 3) put it in the message of an EIO (or, for ENOTEMPTY, an EEXIST).
    if (c != code::kExists && message.ends_with(": is a directory")) return Code::kIsDir;
    if (c != code::kExists && message.ends_with(": not a directory")) return Code::kNotDir;
    if (message.ends_with(": directory not empty")) return Code::kNotEmpty;
  }
  return to_code(c);
}

Code to_code(std::string_view c) {
  if (c == code::kNotFound) return Code::kNotFound;
  if (c == code::kExists) return Code::kExists;
  if (c == code::kPerm) return Code::kAccess;
  if (c == code::kInvalid) return Code::kInvalid;
  if (c == code::kIsDir) return Code::kIsDir;
  if (c == code::kNotDir) return Code::kNotDir;
  if (c == code::kNotSupported) return Code::kNotSupported;
  if (c == code::kTooBig) return Code::kTooBig;
  return Code::kInternal;
}

// ---- envelope ----

std::string encode(const Envelope& e) {
  Json j = Json::object();
  if (!e.id.empty()) j["id"] = e.id;
  j["type"] = e.type;
  if (!e.user_id.empty()) j["user_id"] = e.user_id;
  if (e.body) j["body"] = *e.body;
  return dump(j);
}

std::string frame(std::string_view id, std::string_view t, std::optional<Json> body) {
  Envelope e;
  e.id = std::string(id);
  e.type = std::string(t);
  e.body = std::move(body);
  return encode(e);
}

std::string chunk_frame(std::string_view id, std::string_view user_id, std::int64_t offset,
                        std::string_view data) {
  Envelope e;
  e.id = std::string(id);
  e.type = std::string(type::kFileChunk);
  e.user_id = std::string(user_id);
  Json body = Json::object();
  body["offset"] = offset;
  body["data"] = "";
  e.body = std::move(body);
  std::string head = encode(e);  // ...,"body":{"offset":N,"data":""}}
  constexpr std::string_view kTail = "\"}}";
  head.resize(head.size() - kTail.size());
  std::string b64 = base64_encode(data);  // [A-Za-z0-9+/=]: nothing to escape
  std::string out;
  out.reserve(head.size() + b64.size() + kTail.size());
  out.append(head).append(b64).append(kTail);
  return out;
}

std::size_t binary_chunk_header_size(std::string_view id) { return 2 + id.size() + 8; }

std::string binary_chunk_header(std::string_view id, std::int64_t offset, std::size_t data_size) {
  std::string out;
  out.resize(binary_chunk_header_size(id) + data_size);
  out[0] = static_cast<char>(kBinaryChunkKind);
  out[1] = static_cast<char>(static_cast<unsigned char>(id.size() > 255 ? 255 : id.size()));
  std::memcpy(out.data() + 2, id.data(), static_cast<unsigned char>(out[1]));
  auto off = static_cast<std::uint64_t>(offset);
  char* p = out.data() + 2 + static_cast<unsigned char>(out[1]);
  for (int i = 7; i >= 0; --i) {
    p[i] = static_cast<char>(off & 0xff);
    off >>= 8;
  }
  return out;
}

std::string binary_chunk(std::string_view id, std::int64_t offset, std::string_view data) {
  std::string out = binary_chunk_header(id, offset, data.size());
  if (!data.empty()) std::memcpy(out.data() + binary_chunk_header_size(id), data.data(), data.size());
  return out;
}

Result<BinaryChunk> decode_binary_chunk(std::string_view f) {
  if (f.size() < 2) return fail(Code::kInvalid, "binary frame: shorter than its header");
  if (static_cast<unsigned char>(f[0]) != kBinaryChunkKind) {
    return fail(Code::kInvalid, "binary frame: unknown kind " +
                                    std::to_string(static_cast<unsigned char>(f[0])));
  }
  const std::size_t n = static_cast<unsigned char>(f[1]);
  if (n == 0) return fail(Code::kInvalid, "binary frame: empty request id");
  if (f.size() < 2 + n + 8) return fail(Code::kInvalid, "binary frame: shorter than its header");
  std::uint64_t off = 0;
  for (std::size_t i = 0; i < 8; ++i) off = (off << 8) | static_cast<unsigned char>(f[2 + n + i]);
  if (off > static_cast<std::uint64_t>(INT64_MAX)) {
    return fail(Code::kInvalid, "binary frame: offset out of range");
  }
  return BinaryChunk{f.substr(2, n), static_cast<std::int64_t>(off), f.substr(2 + n + 8)};
}

std::string error_frame(std::string_view id, std::string_view wire_code, std::string_view message) {
  ErrorBody b{std::string(message), std::string(wire_code)};
  return frame(id, type::kError, to_json(b));
}

Result<Envelope> decode(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail(Code::kInvalid, "frame is not valid JSON");
  if (!j.is_object()) return fail(Code::kInvalid, "frame is not a JSON object");
  Envelope e;
  const Json& o = j;
  auto str = [&](const char* key, std::string& out) -> Status {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return {};
    if (!it->is_string()) {
      return fail(Code::kInvalid, std::string("frame field '") + key + "' must be a string");
    }
    out = it->get<std::string>();
    return {};
  };
  AB_TRY(str("id", e.id));
  AB_TRY(str("type", e.type));
  AB_TRY(str("user_id", e.user_id));
  if (e.type.empty()) return fail(Code::kInvalid, "frame has no 'type'");
  if (auto it = j.find("body"); it != j.end()) e.body = std::move(*it);
  return e;
}

std::string generate_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uint64_t v = rng();
  char buf[24];
  std::snprintf(buf, sizeof buf, "req_%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- bodies: encoding ----

Json to_json(const RegisterBody& b) {
  Json j = Json::object();
  j["user_id"] = b.user_id;
  j["auth_token"] = b.auth_token;
  j["workspace"] = b.workspace;
  j["shell"] = b.shell;
  if (!b.llm_provider.empty()) j["llm_provider"] = b.llm_provider;
  if (!b.llm_model.empty()) j["llm_model"] = b.llm_model;
  if (b.version != 0) j["version"] = b.version;
  if (!b.enforces.empty()) j["enforces"] = strings(b.enforces);
  return j;
}

Json to_json(const RegisterOk& b) {
  Json j = Json::object();
  j["status"] = b.status;
  if (b.version != 0) j["version"] = b.version;
  return j;
}

Json to_json(const ErrorBody& b) {
  Json j = Json::object();
  j["message"] = b.message;
  if (!b.code.empty()) j["code"] = b.code;
  return j;
}

Json to_json(const ExecRequest& b) {
  Json j = Json::object();
  j["command"] = b.command;
  if (!b.args.empty()) j["args"] = strings(b.args);
  j["shell"] = b.shell;
  if (!b.dir.empty()) j["dir"] = b.dir;
  if (!b.env.empty()) j["env"] = strings(b.env);
  if (!b.stdin_data.empty()) j["stdin"] = b.stdin_data;
  j["timeout"] = b.timeout;
  if (!b.run_as_user.empty()) j["run_as_user"] = b.run_as_user;
  return j;
}

Json to_json(const ExecResult& b) {
  Json j = Json::object();
  j["stdout"] = b.stdout_data;
  j["stderr"] = b.stderr_data;
  j["exit_code"] = b.exit_code;
  j["timed_out"] = b.timed_out;
  return j;
}

Json to_json(const PathRequest& b) {
  return Json{{"path", b.path}};
}
Json to_json(const FileContent& b) {
  return Json{{"data", base64_encode(b.data)}};
}

Json to_json(const WriteFileRequest& b) {
  Json j = Json::object();
  j["path"] = b.path;
  j["data"] = base64_encode(b.data);
  j["perm"] = b.perm;
  return j;
}

Json to_json(const MkdirAllRequest& b) {
  Json j = Json::object();
  j["path"] = b.path;
  if (b.perm != 0) j["perm"] = b.perm;
  return j;
}

Json to_json(const FileInfo& b) {
  Json j = Json::object();
  j["name"] = b.name;
  j["size"] = b.size;
  j["mode"] = b.mode;
  j["mod_time"] = b.mod_time;
  j["is_dir"] = b.is_dir;
  return j;
}

Json to_json(const DirEntries& b) {
  Json a = Json::array();
  for (const auto& e : b.entries) {
    Json j = Json::object();
    j["name"] = e.name;
    j["is_dir"] = e.is_dir;
    j["size"] = e.size;
    a.push_back(std::move(j));
  }
  Json j = Json::object();
  j["entries"] = std::move(a);
  return j;
}

Json to_json(const DownloadRequest& b) {
  Json j = Json::object();
  j["url"] = b.url;
  j["output_path"] = b.output_path;
  return j;
}

Json to_json(const SizeBody& b) {
  return Json{{"size", b.size}};
}

Json to_json(const BgExecRequest& b) {
  Json j = Json::object();
  j["task_id"] = b.task_id;
  j["command"] = b.command;
  if (!b.args.empty()) j["args"] = strings(b.args);
  j["shell"] = b.shell;
  if (!b.dir.empty()) j["dir"] = b.dir;
  if (!b.env.empty()) j["env"] = strings(b.env);
  if (!b.stdin_data.empty()) j["stdin"] = b.stdin_data;
  return j;
}

Json to_json(const TaskRequest& b) {
  return Json{{"task_id", b.task_id}};
}

Json to_json(const BgOutput& b) {
  Json j = Json::object();
  j["task_id"] = b.task_id;
  j["status"] = b.status;
  if (b.exit_code != 0) j["exit_code"] = b.exit_code;
  j["stdout"] = b.stdout_data;
  j["stderr"] = b.stderr_data;
  return j;
}

Json to_json(const StdioStart& b) {
  Json j = Json::object();
  j["stream_id"] = b.stream_id;
  j["command"] = b.command;
  if (!b.args.empty()) j["args"] = strings(b.args);
  if (!b.env.empty()) j["env"] = strings(b.env);
  if (!b.dir.empty()) j["dir"] = b.dir;
  if (b.stderr_pipe) j["stderr"] = true;
  return j;
}

Json to_json(const StreamData& b) {
  Json j = Json::object();
  j["stream_id"] = b.stream_id;
  j["data"] = base64_encode(b.data);
  if (b.is_stderr) j["stderr"] = true;
  if (b.eof) j["eof"] = true;
  return j;
}

Json to_json(const StreamRequest& b) {
  Json j = Json{{"stream_id", b.stream_id}};
  if (b.pid != 0) j["pid"] = b.pid;
  return j;
}

Json to_json(const StreamExit& b) {
  Json j = Json::object();
  j["stream_id"] = b.stream_id;
  j["exit_code"] = b.exit_code;
  if (!b.error.empty()) j["error"] = b.error;
  if (b.signal != 0) j["signal"] = b.signal;
  return j;
}

Json to_json(const StreamSignal& b) {
  Json j = Json::object();
  j["stream_id"] = b.stream_id;
  j["signal"] = b.signal;
  if (b.group) j["group"] = true;
  return j;
}

Json to_json(const PtyCreate& b) {
  Json j = Json::object();
  j["stream_id"] = b.stream_id;
  j["command"] = b.command;
  if (!b.args.empty()) j["args"] = strings(b.args);
  if (!b.env.empty()) j["env"] = strings(b.env);
  if (!b.dir.empty()) j["dir"] = b.dir;
  j["cols"] = b.cols;
  j["rows"] = b.rows;
  return j;
}

Json to_json(const PtyResize& b) {
  Json j = Json::object();
  j["stream_id"] = b.stream_id;
  j["cols"] = b.cols;
  j["rows"] = b.rows;
  return j;
}

Json to_json(const LlmModels& b) {
  return Json{{"models", strings(b.models)}};
}

Json to_json(const FileBegin& b) {
  Json j = Json::object();
  if (!b.path.empty()) {
    j["path"] = b.path;
    j["perm"] = b.perm;
  }
  j["size"] = b.size;
  return j;
}

Json to_json(const FileChunk& b) {
  Json j = Json::object();
  j["offset"] = b.offset;
  j["data"] = base64_encode(b.data);
  return j;
}

Json to_json(const FileEnd& b) {
  return Json{{"size", b.size}};
}
Json to_json(const Ack& b) {
  return Json{{"offset", b.offset}};
}

// ---- bodies: decoding ----

#define AB_BODY(body) const Json& o = *AB_TRY(object_of(body))

Status from_json(const std::optional<Json>& body, RegisterBody& out) {
  AB_BODY(body);
  AB_TRY(get(o, "user_id", out.user_id));
  AB_TRY(get(o, "auth_token", out.auth_token));
  AB_TRY(get(o, "workspace", out.workspace));
  AB_TRY(get(o, "shell", out.shell));
  AB_TRY(get(o, "llm_provider", out.llm_provider));
  AB_TRY(get(o, "llm_model", out.llm_model));
  AB_TRY(get(o, "version", out.version));
  AB_TRY(get(o, "enforces", out.enforces));
  return {};
}

Status from_json(const std::optional<Json>& body, RegisterOk& out) {
  AB_BODY(body);
  out.status.clear();
  AB_TRY(get(o, "status", out.status));
  AB_TRY(get(o, "version", out.version));
  return {};
}

Status from_json(const std::optional<Json>& body, ErrorBody& out) {
  AB_BODY(body);
  AB_TRY(get(o, "message", out.message));
  AB_TRY(get(o, "code", out.code));
  return {};
}

Status from_json(const std::optional<Json>& body, ExecRequest& out) {
  AB_BODY(body);
  AB_TRY(get(o, "command", out.command));
  AB_TRY(get(o, "args", out.args));
  AB_TRY(get(o, "shell", out.shell));
  AB_TRY(get(o, "dir", out.dir));
  AB_TRY(get(o, "env", out.env));
  AB_TRY(get(o, "stdin", out.stdin_data));
  AB_TRY(get(o, "timeout", out.timeout));
  AB_TRY(get(o, "run_as_user", out.run_as_user));
  return {};
}

Status from_json(const std::optional<Json>& body, ExecResult& out) {
  AB_BODY(body);
  AB_TRY(get(o, "stdout", out.stdout_data));
  AB_TRY(get(o, "stderr", out.stderr_data));
  AB_TRY(get(o, "exit_code", out.exit_code));
  AB_TRY(get(o, "timed_out", out.timed_out));
  return {};
}

Status from_json(const std::optional<Json>& body, PathRequest& out) {
  AB_BODY(body);
  AB_TRY(get(o, "path", out.path));
  std::uint32_t perm = 0;  // remove's perm: accepted and ignored, but typed
  AB_TRY(get(o, "perm", perm));
  return {};
}

Status from_json(const std::optional<Json>& body, FileContent& out) {
  AB_BODY(body);
  return get_b64(o, "data", out.data);
}

Status from_json(const std::optional<Json>& body, WriteFileRequest& out) {
  AB_BODY(body);
  AB_TRY(get(o, "path", out.path));
  AB_TRY(get(o, "perm", out.perm));
  return get_b64(o, "data", out.data, Code::kInternal);  // xbot: EIO
}

Status from_json(const std::optional<Json>& body, MkdirAllRequest& out) {
  AB_BODY(body);
  AB_TRY(get(o, "path", out.path));
  AB_TRY(get(o, "perm", out.perm));
  return {};
}

Status from_json(const std::optional<Json>& body, FileInfo& out) {
  AB_BODY(body);
  AB_TRY(get(o, "name", out.name));
  AB_TRY(get(o, "size", out.size));
  AB_TRY(get(o, "mode", out.mode));
  AB_TRY(get(o, "mod_time", out.mod_time));
  AB_TRY(get(o, "is_dir", out.is_dir));
  return {};
}

Status from_json(const std::optional<Json>& body, DirEntries& out) {
  AB_BODY(body);
  out.entries.clear();
  const Json* a = field(o, "entries");
  if (!a) return {};
  if (!a->is_array()) return bad("entries", "an array");
  for (const auto& e : *a) {
    DirEntry d;
    if (!e.is_null()) {
      if (!e.is_object()) return bad("entries", "an array of objects");
      AB_TRY(get(e, "name", d.name));
      AB_TRY(get(e, "is_dir", d.is_dir));
      AB_TRY(get(e, "size", d.size));
    }
    out.entries.push_back(std::move(d));
  }
  return {};
}

Status from_json(const std::optional<Json>& body, DownloadRequest& out) {
  AB_BODY(body);
  AB_TRY(get(o, "url", out.url));
  AB_TRY(get(o, "output_path", out.output_path));
  return {};
}

Status from_json(const std::optional<Json>& body, SizeBody& out) {
  AB_BODY(body);
  return get(o, "size", out.size);
}

Status from_json(const std::optional<Json>& body, BgExecRequest& out) {
  AB_BODY(body);
  AB_TRY(get(o, "task_id", out.task_id));
  AB_TRY(get(o, "command", out.command));
  AB_TRY(get(o, "args", out.args));
  AB_TRY(get(o, "shell", out.shell));
  AB_TRY(get(o, "dir", out.dir));
  AB_TRY(get(o, "env", out.env));
  AB_TRY(get(o, "stdin", out.stdin_data));
  return {};
}

Status from_json(const std::optional<Json>& body, TaskRequest& out) {
  AB_BODY(body);
  return get(o, "task_id", out.task_id);
}

Status from_json(const std::optional<Json>& body, BgOutput& out) {
  AB_BODY(body);
  AB_TRY(get(o, "task_id", out.task_id));
  AB_TRY(get(o, "status", out.status));
  AB_TRY(get(o, "exit_code", out.exit_code));
  AB_TRY(get(o, "stdout", out.stdout_data));
  AB_TRY(get(o, "stderr", out.stderr_data));
  return {};
}

Status from_json(const std::optional<Json>& body, StdioStart& out) {
  AB_BODY(body);
  AB_TRY(get(o, "stream_id", out.stream_id));
  AB_TRY(get(o, "command", out.command));
  AB_TRY(get(o, "args", out.args));
  AB_TRY(get(o, "env", out.env));
  AB_TRY(get(o, "dir", out.dir));
  AB_TRY(get(o, "stderr", out.stderr_pipe));
  return {};
}

Status from_json(const std::optional<Json>& body, StreamData& out) {
  AB_BODY(body);
  AB_TRY(get(o, "stream_id", out.stream_id));
  AB_TRY(get(o, "stderr", out.is_stderr));
  AB_TRY(get(o, "eof", out.eof));
  return get_b64(o, "data", out.data);
}

Status from_json(const std::optional<Json>& body, StreamRequest& out) {
  AB_BODY(body);
  AB_TRY(get(o, "pid", out.pid));
  return get(o, "stream_id", out.stream_id);
}

Status from_json(const std::optional<Json>& body, StreamExit& out) {
  AB_BODY(body);
  AB_TRY(get(o, "stream_id", out.stream_id));
  AB_TRY(get(o, "exit_code", out.exit_code));
  AB_TRY(get(o, "error", out.error));
  AB_TRY(get(o, "signal", out.signal));
  return {};
}

Status from_json(const std::optional<Json>& body, StreamSignal& out) {
  AB_BODY(body);
  AB_TRY(get(o, "stream_id", out.stream_id));
  AB_TRY(get(o, "signal", out.signal));
  AB_TRY(get(o, "group", out.group));
  return {};
}

Status from_json(const std::optional<Json>& body, PtyCreate& out) {
  AB_BODY(body);
  AB_TRY(get(o, "stream_id", out.stream_id));
  AB_TRY(get(o, "command", out.command));
  AB_TRY(get(o, "args", out.args));
  AB_TRY(get(o, "env", out.env));
  AB_TRY(get(o, "dir", out.dir));
  AB_TRY(get(o, "cols", out.cols));
  AB_TRY(get(o, "rows", out.rows));
  return {};
}

Status from_json(const std::optional<Json>& body, PtyResize& out) {
  AB_BODY(body);
  AB_TRY(get(o, "stream_id", out.stream_id));
  AB_TRY(get(o, "cols", out.cols));
  AB_TRY(get(o, "rows", out.rows));
  return {};
}

Status from_json(const std::optional<Json>& body, LlmModels& out) {
  AB_BODY(body);
  return get(o, "models", out.models);
}

Status from_json(const std::optional<Json>& body, FileBegin& out) {
  AB_BODY(body);
  AB_TRY(get(o, "path", out.path));
  AB_TRY(get(o, "perm", out.perm));
  AB_TRY(get(o, "size", out.size));
  if (out.size < kSizeUnknown) return bad("size", "non-negative, or -1 (not known yet)");
  return {};
}

Status from_json(const std::optional<Json>& body, FileChunk& out) {
  AB_BODY(body);
  AB_TRY(get(o, "offset", out.offset));
  if (out.offset < 0) return bad("offset", "non-negative");
  return get_b64(o, "data", out.data);
}

Status from_json(const std::optional<Json>& body, FileEnd& out) {
  AB_BODY(body);
  AB_TRY(get(o, "size", out.size));
  if (out.size < 0) return bad("size", "non-negative");
  return {};
}

Status from_json(const std::optional<Json>& body, Ack& out) {
  AB_BODY(body);
  return get(o, "offset", out.offset);
}

#undef AB_BODY

}  // namespace agentbox::runner::proto
