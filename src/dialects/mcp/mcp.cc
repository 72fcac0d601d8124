// The MCP surface: POST|DELETE /v1/sessions/{id}/mcp, one MCP server per agentbox session
// over MCP's streamable HTTP transport, as the stock @modelcontextprotocol/sdk client speaks it
// (shared/E2B-MCP.md part 7). Every request is one JSON-RPC message and its reply is plain
// JSON. There is no GET route: the transport's 405 (with Allow) is what the client takes as "no
// server-initiated messages".
//
// `initialize` issues an Mcp-Session-Id bound to the agentbox session of the URL and to the
// caller's tenant; every later request must carry it (400 without, 404 for an unknown or foreign
// one). A request from a browser page (an Origin not in allowed_origins) is refused by the
// transport, as WebSocket upgrades are. The ids live in memory: after a daemon restart a client gets 404 and initializes again,
// as the MCP specification asks of it.
//
// The tools are the REST routes' operations on the session's sandbox (same paths, same rules,
// same audit lines); a command that ran is a result whatever its exit code, a failed file
// operation an `isError` result whose text starts with the agentbox error code.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/text_codec.h"
#include "server/internal/blocking.h"
#include "server/internal/exec.h"
#include "server/internal/processes.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "dialects/mcp/mcp_message.h"
#include "dialects/mcp/mcp_tools.h"

namespace agentbox::server::detail {
namespace {

constexpr std::string_view kFallbackProtocol = "2025-06-18";  // E2B-MCP.md 7.1
constexpr std::array<std::string_view, 4> kProtocols = {"2025-11-25", "2025-06-18", "2025-03-26",
                                                       "2024-11-05"};

// JSON-RPC error codes (the others: mcp_message.h).
constexpr int kInvalidRequest = kMcpInvalidRequest;
constexpr int kMethodNotFound = kMcpMethodNotFound;
constexpr int kSessionNotFound = -32001;  // the SDK's own servers answer an unknown session so

constexpr std::size_t kReadDefault = 256u << 10;
constexpr std::size_t kReadMax = 4u << 20;
constexpr std::size_t kEditMax = 16u << 20;
constexpr int kExecTimeoutDefault = 120;
constexpr int kExecTimeoutMax = 3600;

bool supported_protocol(std::string_view v) {
  return std::find(kProtocols.begin(), kProtocols.end(), v) != kProtocols.end();
}

// 128 random bits, hex.
std::string new_session_id() { return random_hex(16); }

Reply rpc_reply(int status, const json& id, json result) {
  json j = {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
  return json_reply(status, j);
}

Reply rpc_error(int status, const json& id, int code, std::string message) {
  json j = {{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}};
  return json_reply(status, j);
}

// ---- tool results

json text_block(std::string text) { return {{"type", "text"}, {"text", std::move(text)}}; }

// A successful tool result: the structured content, and the same JSON as text.
json tool_ok(json structured) {
  return {{"content", json::array({text_block(to_wire(structured))})},
          {"structuredContent", std::move(structured)},
          {"isError", false}};
}

// A failed tool: text only (the client validates structuredContent even on errors).
json tool_error(const Error& e) {
  return {{"content", json::array({text_block(std::string(code_name(e.code)) + ": " +
                                              e.message)})},
          {"isError", true}};
}

// ---- tool arguments

// Refuses arguments the tool does not take: an agent's typo must not be ignored.
Status only_known(const json& args, std::span<const std::string_view> known) {
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) {
      return fail(Code::kNotSupported, "argument '" + it.key() + "' is not taken by this tool");
    }
  }
  return {};
}

Result<std::string> str_arg(const json& args, const char* name, bool required,
                            std::string fallback = "") {
  auto it = args.find(name);
  if (it == args.end() || it->is_null()) {
    if (required) return fail(Code::kInvalid, std::string("argument '") + name + "' is required");
    return fallback;
  }
  if (!it->is_string()) return fail(Code::kInvalid, std::string("argument '") + name + "' must be a string");
  return it->get<std::string>();
}

Result<bool> bool_arg(const json& args, const char* name, bool fallback) {
  auto it = args.find(name);
  if (it == args.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return fail(Code::kInvalid, std::string("argument '") + name + "' must be a boolean");
  return it->get<bool>();
}

Result<std::int64_t> int_arg(const json& args, const char* name, std::int64_t fallback,
                             std::int64_t lo, std::int64_t hi) {
  auto it = args.find(name);
  if (it == args.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) {
    return fail(Code::kInvalid, std::string("argument '") + name + "' must be an integer");
  }
  auto v = it->get<std::int64_t>();
  if (v < lo || v > hi) {
    return fail(Code::kInvalid, std::string("argument '") + name + "' must be from " +
                                    std::to_string(lo) + " to " + std::to_string(hi));
  }
  return v;
}

Result<bool> base64_encoding(const json& args) {
  std::string enc = AB_TRY(str_arg(args, "encoding", false, "utf-8"));
  if (enc == "utf-8" || enc == "utf8") return false;
  if (enc == "base64") return true;
  return fail(Code::kInvalid, "argument 'encoding' must be \"utf-8\" or \"base64\"");
}

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

// ---- the tools

struct ToolCall {
  Call* call;
  std::string session;
  std::shared_ptr<sandbox::Sandbox> box;
  json args;
};

service::Origin origin_of(ToolCall* tc) {
  return detail::origin_of(tc->call->ex.req, service::Surface::kMcp);
}

service::Files& files(ToolCall* tc) { return tc->call->ctx->svc->files; }

// A read_file result: the part as UTF-8 text (a cut through a multi-byte character at the limit
// is not the file's fault) or base64.
Result<json> read_result(const std::string& p, std::uint64_t off, service::Files::Part part,
                         bool base64) {
  if (!base64 && !valid_utf8(part.data)) {
    std::size_t tail = utf8_incomplete_tail(part.data);
    if (off + part.data.size() < part.size && tail > 0 &&
        valid_utf8(std::string_view(part.data).substr(0, part.data.size() - tail))) {
      part.data.resize(part.data.size() - tail);
    } else {
      return fail(Code::kInvalid, p + " is not UTF-8 text; read it with encoding \"base64\"");
    }
  }
  bool truncated = off + part.data.size() < part.size;
  return json{{"path", p},
              {"content", base64 ? base64_encode(part.data) : part.data},
              {"encoding", base64 ? "base64" : "utf-8"},
              {"size", part.size},
              {"truncated", truncated}};
}

// A tool's result from an operation's: its error, or `ok`.
json tool_result(const Status& st, json ok) {
  if (!st) return tool_error(st.error());
  return tool_ok(std::move(ok));
}

asio::awaitable<json> tool_exec(ToolCall* tc) {
  const json& a = tc->args;
  static constexpr std::string_view kArgs[] = {"command", "cwd", "env", "stdin", "timeout_sec"};
  if (auto st = only_known(a, kArgs); !st) {
    co_return tool_error(st.error());
  }
  auto timeout = int_arg(a, "timeout_sec", kExecTimeoutDefault, 1, kExecTimeoutMax);
  if (!timeout) co_return tool_error(timeout.error());
  if (!a.contains("command")) {
    co_return tool_error(Error::make(Code::kInvalid, "argument 'command' is required"));
  }
  // The REST decoder checks the rest exactly as /exec does.
  json body = a;
  body["timeout_sec"] = *timeout;
  auto spec = decode_exec(body);
  if (!spec) co_return tool_error(spec.error());
  auto ran = co_await run_collected(tc->call, tc->box, tc->session, std::move(*spec),
                                    service::Surface::kMcp);
  if (!ran) co_return json();  // the client is gone
  auto r = std::move(*ran);
  if (!r) co_return tool_error(r.error());
  json out = encode_exec_result(*r);
  json s = {{"stdout", out.value("stdout", "")},
            {"stderr", out.value("stderr", "")},
            {"exit_code", r->exit_code},
            {"timed_out", r->timed_out},
            {"duration_ms", r->duration.count()},
            {"stdout_truncated", r->stdout_truncated},
            {"stderr_truncated", r->stderr_truncated}};
  co_return tool_ok(std::move(s));
}

asio::awaitable<json> tool_read_file(ToolCall* tc) {
  const json& a = tc->args;
  static constexpr std::string_view kArgs[] = {"path", "encoding", "offset", "limit"};
  if (auto st = only_known(a, kArgs); !st) co_return tool_error(st.error());
  auto path = str_arg(a, "path", true);
  if (!path) co_return tool_error(path.error());
  auto b64 = base64_encoding(a);
  if (!b64) co_return tool_error(b64.error());
  auto offset = int_arg(a, "offset", 0, 0, INT64_MAX);
  if (!offset) co_return tool_error(offset.error());
  auto limit = int_arg(a, "limit", kReadDefault, 1, kReadMax);
  if (!limit) co_return tool_error(limit.error());
  auto off = static_cast<std::uint64_t>(*offset);
  auto part = co_await files(tc).read_part(origin_of(tc), tc->session, *path, off,
                                           static_cast<std::size_t>(*limit));
  if (!part) co_return tool_error(part.error());
  auto out = read_result(*path, off, std::move(*part), *b64);
  if (!out) co_return tool_error(out.error());
  co_return tool_ok(std::move(*out));
}

asio::awaitable<json> tool_write_file(ToolCall* tc) {
  const json& a = tc->args;
  static constexpr std::string_view kArgs[] = {"path", "content", "encoding", "mkdirs"};
  if (auto st = only_known(a, kArgs); !st) co_return tool_error(st.error());
  auto path = str_arg(a, "path", true);
  if (!path) co_return tool_error(path.error());
  auto content = str_arg(a, "content", true);
  if (!content) co_return tool_error(content.error());
  auto b64 = base64_encoding(a);
  if (!b64) co_return tool_error(b64.error());
  auto mkdirs = bool_arg(a, "mkdirs", true);
  if (!mkdirs) co_return tool_error(mkdirs.error());
  std::string data = std::move(*content);
  if (*b64) {
    auto d = base64_decode(data, "argument 'content'");
    if (!d) co_return tool_error(d.error());
    data = std::move(*d);
  }
  sandbox::WriteOptions opts;
  opts.mkdirs = *mkdirs;
  opts.max_bytes = tc->call->ctx->opts.max_file_bytes;
  auto size = co_await files(tc).write(origin_of(tc), tc->session, *path, std::move(data), opts);
  if (!size) co_return tool_error(size.error());
  co_return tool_ok({{"path", *path}, {"size", *size}});
}

asio::awaitable<json> tool_edit_file(ToolCall* tc) {
  const json& a = tc->args;
  static constexpr std::string_view kArgs[] = {"path", "old_string", "new_string", "replace_all"};
  if (auto st = only_known(a, kArgs); !st) co_return tool_error(st.error());
  auto path = str_arg(a, "path", true);
  if (!path) co_return tool_error(path.error());
  auto from = str_arg(a, "old_string", true);
  if (!from) co_return tool_error(from.error());
  auto to = str_arg(a, "new_string", true);
  if (!to) co_return tool_error(to.error());
  auto all = bool_arg(a, "replace_all", false);
  if (!all) co_return tool_error(all.error());
  if (from->empty()) {
    co_return tool_error(Error::make(Code::kInvalid, "argument 'old_string' must not be empty"));
  }
  sandbox::WriteOptions opts;
  opts.max_bytes = tc->call->ctx->opts.max_file_bytes;
  auto n = co_await files(tc).edit(origin_of(tc), tc->session, *path, std::move(*from),
                                   std::move(*to), *all, kEditMax, opts);
  if (!n) co_return tool_error(n.error());
  co_return tool_ok({{"path", *path}, {"replacements", *n}});
}

asio::awaitable<json> tool_list_dir(ToolCall* tc) {
  static constexpr std::string_view kArgs[] = {"path"};
  if (auto st = only_known(tc->args, kArgs); !st) co_return tool_error(st.error());
  auto path = str_arg(tc->args, "path", false, tc->box->workspace());
  if (!path) co_return tool_error(path.error());
  auto list = co_await files(tc).list(origin_of(tc), tc->session, *path);
  if (!list) co_return tool_error(list.error());
  json j = encode_dir(*list);
  j["path"] = *path;
  co_return tool_ok(std::move(j));
}

asio::awaitable<json> tool_stat(ToolCall* tc) {
  static constexpr std::string_view kArgs[] = {"path"};
  if (auto st = only_known(tc->args, kArgs); !st) co_return tool_error(st.error());
  auto path = str_arg(tc->args, "path", true);
  if (!path) co_return tool_error(path.error());
  auto info = co_await files(tc).stat(origin_of(tc), tc->session, *path);
  if (!info) co_return tool_error(info.error());
  co_return tool_ok(encode_file_info(*info));
}

asio::awaitable<json> tool_mkdir(ToolCall* tc) {
  static constexpr std::string_view kArgs[] = {"path"};
  if (auto st = only_known(tc->args, kArgs); !st) co_return tool_error(st.error());
  auto path = str_arg(tc->args, "path", true);
  if (!path) co_return tool_error(path.error());
  auto st = co_await files(tc).mkdir(origin_of(tc), tc->session, *path);
  co_return tool_result(st, {{"path", *path}});
}

asio::awaitable<json> tool_rename(ToolCall* tc) {
  static constexpr std::string_view kArgs[] = {"from", "to"};
  if (auto st = only_known(tc->args, kArgs); !st) co_return tool_error(st.error());
  auto from = str_arg(tc->args, "from", true);
  if (!from) co_return tool_error(from.error());
  auto to = str_arg(tc->args, "to", true);
  if (!to) co_return tool_error(to.error());
  auto st = co_await files(tc).rename(origin_of(tc), tc->session, *from, *to);
  co_return tool_result(st, {{"from", *from}, {"to", *to}});
}

asio::awaitable<json> tool_remove(ToolCall* tc) {
  static constexpr std::string_view kArgs[] = {"path", "recursive"};
  if (auto st = only_known(tc->args, kArgs); !st) co_return tool_error(st.error());
  auto path = str_arg(tc->args, "path", true);
  if (!path) co_return tool_error(path.error());
  auto rec = bool_arg(tc->args, "recursive", false);
  if (!rec) co_return tool_error(rec.error());
  auto st = co_await files(tc).remove(origin_of(tc), tc->session, *path, *rec);
  co_return tool_result(st, {{"path", *path}});
}

Result<sandbox::ProcessTable*> table_of(ToolCall* tc) {
  sandbox::ProcessTable* t = tc->box->processes();
  if (t == nullptr) {
    return fail(Code::kNotSupported,
                "processes: not supported by the backend of session " + tc->session);
  }
  return t;
}

asio::awaitable<json> tool_start_process(ToolCall* tc) {
  const json& a = tc->args;
  static constexpr std::string_view kArgs[] = {"command", "cwd", "env", "tag"};
  if (auto st = only_known(a, kArgs); !st) {
    co_return tool_error(st.error());
  }
  if (!a.contains("command")) {
    co_return tool_error(Error::make(Code::kInvalid, "argument 'command' is required"));
  }
  auto spec = decode_process_start(a);
  if (!spec) co_return tool_error(spec.error());
  auto table = table_of(tc);
  if (!table) co_return tool_error(table.error());
  service::ProcTarget target{service::Lease{tc->session, tc->box}, *table};
  auto info = co_await tc->call->ctx->svc->processes.start(origin_of(tc), std::move(target),
                                                           std::move(*spec));
  if (!info) co_return tool_error(info.error());
  co_return tool_ok(encode_process(*info));
}

asio::awaitable<json> tool_process_output(ToolCall* tc) {
  const json& a = tc->args;
  static constexpr std::string_view kArgs[] = {"ref", "since"};
  if (auto st = only_known(a, kArgs); !st) co_return tool_error(st.error());
  auto ref = str_arg(a, "ref", true);
  if (!ref) co_return tool_error(ref.error());
  auto since = int_arg(a, "since", -1, 0, INT64_MAX);
  if (!since) co_return tool_error(since.error());
  auto table = table_of(tc);
  if (!table) co_return tool_error(table.error());
  std::optional<std::uint64_t> from;
  if (*since >= 0) from = static_cast<std::uint64_t>(*since);
  auto batch = (*table)->output(*ref, from);
  if (!batch) co_return tool_error(batch.error());
  auto info = (*table)->get(*ref);
  if (!info) co_return tool_error(info.error());
  std::string out;
  std::string err;
  for (const auto& r : batch->records) {
    if (r.type == sandbox::OutputRecord::Type::kStderr) {
      err += r.data;
    } else if (r.type != sandbox::OutputRecord::Type::kExit) {
      out += r.data;
    }
  }
  json s = {{"stdout", std::move(out)},
            {"stderr", std::move(err)},
            {"next", batch->next},
            {"state", std::string(sandbox::state_name(info->state))},
            {"exit_code", info->exit_code ? json(*info->exit_code) : json(nullptr)}};
  co_return tool_ok(std::move(s));
}

asio::awaitable<json> tool_kill_process(ToolCall* tc) {
  static constexpr std::string_view kArgs[] = {"ref"};
  if (auto st = only_known(tc->args, kArgs); !st) co_return tool_error(st.error());
  auto ref = str_arg(tc->args, "ref", true);
  if (!ref) co_return tool_error(ref.error());
  auto table = table_of(tc);
  if (!table) co_return tool_error(table.error());
  service::ProcTarget target{service::Lease{tc->session, tc->box}, *table};
  auto info = co_await tc->call->ctx->svc->processes.kill(origin_of(tc), std::move(target), *ref);
  if (!info) co_return tool_error(info.error());
  co_return tool_ok(encode_process(*info));
}

using ToolFn = asio::awaitable<json> (*)(ToolCall*);

struct Tool {
  std::string_view name;
  ToolFn fn;
};

constexpr Tool kTools[] = {
    {"exec", tool_exec},
    {"read_file", tool_read_file},
    {"write_file", tool_write_file},
    {"edit_file", tool_edit_file},
    {"list_dir", tool_list_dir},
    {"stat", tool_stat},
    {"mkdir", tool_mkdir},
    {"rename", tool_rename},
    {"remove", tool_remove},
    {"start_process", tool_start_process},
    {"process_output", tool_process_output},
    {"kill_process", tool_kill_process},
};

}  // namespace

// ---- the MCP sessions

struct McpSessionEntry {
  std::string session;  // the agentbox session of the URL
  std::string tenant;
  std::string protocol;
  std::chrono::steady_clock::time_point last_used;
};


// The Mcp-Session-Ids issued, on the io thread only. Bounded: past kMax the least recently
// used is forgotten (its client gets 404 and initializes again).
class McpSessions {
 public:
  static constexpr std::size_t kMax = 4096;

  std::string issue(McpSessionEntry e) {
    if (map_.size() >= kMax) {
      auto oldest = std::min_element(map_.begin(), map_.end(), [](const auto& x, const auto& y) {
        return x.second.last_used < y.second.last_used;
      });
      map_.erase(oldest);
    }
    std::string id = new_session_id();
    e.last_used = std::chrono::steady_clock::now();
    map_.emplace(id, std::move(e));
    return id;
  }

  // The entry of `id` if it belongs to this session and tenant.
  McpSessionEntry* find(const std::string& id, const std::string& session,
                        const std::string& tenant) {
    auto it = map_.find(id);
    if (it == map_.end() || it->second.session != session || it->second.tenant != tenant) {
      return nullptr;
    }
    it->second.last_used = std::chrono::steady_clock::now();
    return &it->second;
  }

  void erase(const std::string& id) { map_.erase(id); }

 private:
  std::map<std::string, McpSessionEntry> map_;
};

namespace {

McpSessions* mcp_sessions(Context* ctx) {
  if (!ctx->mcp) ctx->mcp = std::make_shared<McpSessions>();
  return ctx->mcp.get();
}

json server_tools();

// One JSON-RPC request (not a notification) of an initialized MCP session.
// nullopt: the client left while a command ran.
asio::awaitable<std::optional<Reply>> dispatch(Call* call, std::string session, McpMessage m) {
  const json& id = m.id;
  const std::string& method = m.method;
  if (method == "ping") co_return rpc_reply(200, id, json::object());
  if (method == "tools/list") {
    json tools = {{"tools", server_tools()}};
    co_return rpc_reply(200, id, std::move(tools));
  }
  if (method != "tools/call") {
    co_return rpc_error(200, id, kMethodNotFound, "method " + method + " is not supported");
  }
  auto called = parse_tool_call(m);
  if (!called) {
    co_return rpc_error(called.error().status, id, called.error().code, called.error().message);
  }
  const Tool* tool = nullptr;
  for (const Tool& t : kTools) {
    if (t.name == called->name) tool = &t;
  }
  if (tool == nullptr) {
    co_return rpc_error(200, id, kMcpInvalidParams, "unknown tool " + called->name);
  }
  json args = std::move(called->args);
  auto box = co_await acquire_sandbox(call->ctx, session, /*create_if_missing=*/true,
                                      call->ex.req.caller);
  if (!box) co_return rpc_reply(200, id, tool_error(box.error()));
  ToolCall tc{call, session, std::move(*box), std::move(args)};
  json result = co_await tool->fn(&tc);
  if (result.is_null()) co_return std::nullopt;
  co_return rpc_reply(200, id, std::move(result));
}

// POST /v1/sessions/{id}/mcp
asio::awaitable<bool> mcp_post(Call* call) {
  Context* ctx = call->ctx;
  Request& req = call->ex.req;
  auto session = session_param(req);
  if (!session) co_return co_await send_error(call, session.error());
  const std::string mcp_id = header_value(call, "Mcp-Session-Id");
  const std::string version = header_value(call, "MCP-Protocol-Version");
  auto body = co_await read_whole_body(call, call->ctx->opts.max_json_bytes);
  if (!body) {
    if (body.error().code == Code::kUnavailable) co_return false;
    co_return co_await send_error(call, body.error());
  }
  auto parsed = parse_mcp_message(*body);
  if (!parsed) {
    const McpRefusal& r = parsed.error();
    co_return co_await send_reply(call, rpc_error(r.status, r.id, r.code, r.message));
  }
  const bool is_request = parsed->is_request;
  const json id = parsed->id;
  const std::string method = parsed->method;

  if (method == "initialize") {
    if (!is_request) {
      co_return co_await send_reply(
          call, rpc_error(400, id, kInvalidRequest, "initialize must be a request"));
    }
    // The session is made (or resumed) now, so a quota or a bad id fails the handshake.
    auto box = co_await acquire_sandbox(ctx, *session, /*create_if_missing=*/true, req.caller);
    if (!box) co_return co_await send_error(call, box.error());
    const std::string& asked = parsed->asked_protocol;
    std::string proto = supported_protocol(asked) ? asked : std::string(kFallbackProtocol);
    std::string issued = mcp_sessions(ctx)->issue({*session, req.caller.tenant, proto, {}});
    json result = {
        {"protocolVersion", proto},
        {"capabilities", {{"tools", {{"listChanged", false}}}}},
        {"serverInfo", {{"name", "agentbox"}, {"version", "0.2.0"}}},
        {"instructions",
         "Tools act in the agentbox session " + *session +
             ": a persistent, isolated Linux workspace at " + (*box)->workspace() +
             ". Relative paths are relative to it. exec runs a shell command; start_process "
             "runs one in the background."}};
    Reply r = rpc_reply(200, id, std::move(result));
    r.headers.emplace_back("Mcp-Session-Id", issued);
    service::Fields fields = {{"protocol", proto}};
    ctx->svc->bus().emit("mcp.initialize", origin_of(req, service::Surface::kMcp), *session,
                         fields);
    co_return co_await send_reply(call, std::move(r));
  }

  if (mcp_id.empty()) {
    co_return co_await send_reply(call, rpc_error(400, id, kInvalidRequest,
                                                  "Mcp-Session-Id header is required; "
                                                  "send initialize first"));
  }
  McpSessionEntry* entry = mcp_sessions(ctx)->find(mcp_id, *session, req.caller.tenant);
  if (entry == nullptr) {
    co_return co_await send_reply(
        call, rpc_error(404, id, kSessionNotFound, "MCP session not found: initialize again"));
  }
  if (!version.empty() && !supported_protocol(version)) {
    co_return co_await send_reply(
        call, rpc_error(400, id, kInvalidRequest, "unsupported MCP-Protocol-Version " + version));
  }
  if (!is_request) {
    // A notification, or a response to a request this server never sends.
    Reply r;
    r.status = 202;
    r.content_type.clear();
    co_return co_await send_reply(call, std::move(r));
  }
  auto r = co_await dispatch(call, *session, std::move(*parsed));
  if (!r) co_return false;  // the client left during an exec
  co_return co_await send_reply(call, std::move(*r));
}

// DELETE /v1/sessions/{id}/mcp: ends the MCP session (never the agentbox session).
asio::awaitable<bool> mcp_delete(Call* call) {
  Request& req = call->ex.req;
  auto session = session_param(req);
  if (!session) co_return co_await send_error(call, session.error());
  const std::string mcp_id = header_value(call, "Mcp-Session-Id");
  if (mcp_id.empty()) {
    co_return co_await send_error(
        call, Error::make(Code::kInvalid, "Mcp-Session-Id header is required"));
  }
  McpSessions* s = mcp_sessions(call->ctx);
  if (s->find(mcp_id, *session, req.caller.tenant) == nullptr) {
    co_return co_await send_error(call, Error::make(Code::kNotFound, "MCP session not found"));
  }
  s->erase(mcp_id);
  json ended = {{"ended", true}};
  co_return co_await send_reply(call, json_reply(200, ended));
}

// ---- the tool list (E2B-MCP.md 7.4)

json server_tools() {
  static const json tools = json::parse(kToolsJson);
  return tools;
}

}  // namespace

std::vector<RouteSpec> mcp_routes() {
  return {
      {RouteId::kMcpPost, "POST", "/v1/sessions/{id}/mcp", BodyKind::kRaw, true, mcp_post},
      {RouteId::kMcpDelete, "DELETE", "/v1/sessions/{id}/mcp", BodyKind::kNone, true, mcp_delete},
  };
}

}  // namespace agentbox::server::detail
