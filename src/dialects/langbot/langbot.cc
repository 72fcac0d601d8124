// LangBot's Box runtime (shared/PROTOCOLS.md part 2, read from langbot-plugin-sdk's own code):
// the action RPC `GET /rpc/ws` and the managed-process relay
// `GET /v1/sessions/{physical_id}/managed-process[/{process_id}]/ws`, so that LangBot uses
// agentboxd as its Box runtime with only `box.runtime.endpoint` changed.
//
// A thin translation: every action is the session, exec and process calls the REST routes make
// (SessionManager, run_collected_until, the session's ProcessTable, the processes surface's
// attach). What is LangBot's own is kept here:
// - auth: X-LangBot-Instance-Id (the first /rpc/ws binds it unless langbot.trusted_instance is
//   set; any other id is 401 "Unauthorized"), X-LangBot-Box-Control-Token against
//   langbot.control_token (a daemon with tokens and no control token refuses /rpc/ws);
// - tenancy: a tenant action's context names a placement; its sessions are agentbox sessions
//   named by LangBot's physical ids, ws-<sha256(instance\0workspace)[:24]>-g<gen>-<logical>,
//   owned by the tenant langbot.tenant; replies carry logical ids. The generation fence: an
//   older generation is refused, a newer one stops the older one's actions and relays and
//   deletes its sessions;
// - the envelope ({seq_id, action, data, context} in, {seq_id, code, message, data,
//   chunk_status} out, dumped as Python's json.dumps does) and the error classes the client maps
//   back from the message prefix (BoxValidationError: ... and the others).
// The skill store, admission grants and __file_chunk are refused with a BoxError naming them.
//
// Threading: everything runs on the io_context thread (actions are coroutines spawned there);
// blocking session work goes to the pool.

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <cmath>
#include <expected>
#include <set>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/paths.h"
#include "server/internal/blocking.h"
#include "server/internal/exec.h"
#include "server/internal/processes.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "server/websocket.h"

namespace agentbox::server::detail {
namespace {

using ojson = nlohmann::ordered_json;
using session::Caller;
using session::SessionInfo;

constexpr std::size_t kMaxInFlight = 128;         // actions per connection
constexpr std::size_t kMaxErrorText = 4096;       // then "... [protocol error truncated]"
constexpr std::size_t kExecOutputCap = 1u << 20;  // per stream, as the SDK's Docker backend
constexpr std::size_t kStderrPreview = 4000;
constexpr char kDefaultImage[] = "rockchin/langbot-sandbox:latest";
constexpr char kSpecLabel[] = "langbot.box";  // the session's BoxSpec fields, as JSON

// ---- errors: "<ExceptionClass>: <text>"

struct LbError {
  std::string cls;  // BoxValidationError, BoxSessionNotFoundError, PermissionError, ...
  std::string text;
};
template <typename T>
using LbResult = std::expected<T, LbError>;

std::unexpected<LbError> lb_fail(std::string cls, std::string text) {
  return std::unexpected(LbError{std::move(cls), std::move(text)});
}

// What an agentbox error means to LangBot's client, by what the call was about.
enum class About { kSession, kProcess };

LbError lb_error(const Error& e, About about) {
  switch (e.code) {
    case Code::kInvalid:
    case Code::kAccess:
    case Code::kNotDir:
    case Code::kIsDir: return {"BoxValidationError", e.message};
    case Code::kNotFound:
      return {
          about == About::kProcess ? "BoxManagedProcessNotFoundError" : "BoxSessionNotFoundError",
          e.message};
    case Code::kExists:
      return {
          about == About::kProcess ? "BoxManagedProcessConflictError" : "BoxSessionConflictError",
          e.message};
    case Code::kQuota:
    case Code::kTooBig: return {"BoxCapacityExceededError", e.message};
    case Code::kUnavailable: return {"BoxBackendUnavailableError", e.message};
    default: return {"BoxError", std::string(code_name(e.code)) + ": " + e.message};
  }
}

LbError validation(std::string_view model, std::string_view field, std::string_view msg) {
  return {"BoxValidationError", "1 validation error for " + std::string(model) + "\n" +
                                    std::string(field) + "\n  " + std::string(msg)};
}

// ---- Python's json.dumps (separators ", " and ": ", non-ASCII escaped)

void py_dump(const ojson& j, std::string* out) {
  if (j.is_object()) {
    *out += '{';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) *out += ", ";
      first = false;
      *out += ojson(it.key()).dump(-1, ' ', true, ojson::error_handler_t::replace);
      *out += ": ";
      py_dump(it.value(), out);
    }
    *out += '}';
  } else if (j.is_array()) {
    *out += '[';
    for (std::size_t i = 0; i < j.size(); ++i) {
      if (i > 0) *out += ", ";
      py_dump(j[i], out);
    }
    *out += ']';
  } else {
    *out += j.dump(-1, ' ', true, ojson::error_handler_t::replace);
  }
}

std::string py_dumps(const ojson& j) {
  std::string s;
  py_dump(j, &s);
  return s;
}

ojson reply_frame(const json& seq_id, int code, std::string message, ojson data) {
  ojson f = ojson::object();
  f["seq_id"] = seq_id;
  f["code"] = code;
  f["message"] = std::move(message);
  f["data"] = std::move(data);
  f["chunk_status"] = "continue";
  return f;
}

std::string error_message(const LbError& e) {
  std::string m = e.cls + ": " + e.text;
  if (m.size() > kMaxErrorText) {
    m.resize(kMaxErrorText - utf8_incomplete_tail(std::string_view(m).substr(0, kMaxErrorText)));
    m += "... [protocol error truncated]";
  }
  return m;
}

// ---- tenancy

std::string sha256_hex(std::string_view s) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(s.data(), s.size(), md, &n, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out;
}

// Python's str.strip(): ASCII whitespace and the separators \x1c-\x1f.
std::string py_strip(std::string_view s) {
  auto ws = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return std::string(s);
}

// "ws-" + sha256(instance "\0" workspace)[:24]: the namespace of one Workspace.
std::string box_namespace(const std::string& instance, const std::string& workspace) {
  std::string key = instance;
  key += '\0';
  key += workspace;
  return "ws-" + sha256_hex(key).substr(0, 24);
}

struct Placement {
  std::string instance;
  std::string workspace;
  std::int64_t gen = 1;
  std::string ns;      // ws-<24 hex>
  std::string prefix;  // ws-<24 hex>-g<gen>-
};

Placement make_placement(std::string instance, std::string workspace, std::int64_t gen) {
  Placement p;
  p.ns = box_namespace(instance, workspace);
  p.prefix = p.ns + "-g" + std::to_string(gen) + "-";
  p.instance = std::move(instance);
  p.workspace = std::move(workspace);
  p.gen = gen;
  return p;
}

// The physical id of a logical one (tenancy.namespace_session_id), checked as an agentbox id.
LbResult<std::string> physical_id(const Placement& p, const std::string& session_id) {
  std::string logical = py_strip(session_id);
  if (logical.empty()) return lb_fail("BoxValidationError", "Box session_id must not be empty");
  std::string safe;
  bool run = false;
  for (char c : logical) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
    if (ok) {
      safe += c;
      run = false;
    } else if (!run) {
      safe += '-';
      run = true;
    }
  }
  std::size_t b = safe.find_first_not_of('-');
  if (b == std::string::npos) {
    return lb_fail("BoxValidationError", "Box session_id must contain a valid character");
  }
  safe = safe.substr(b, safe.find_last_not_of('-') - b + 1);
  std::string id = p.prefix + safe;
  if (auto st = session::validate_id(id); !st) {
    return lb_fail("BoxValidationError", "Box session_id '" + logical + "' gives the physical id " +
                                             id +
                                             ", which agentbox cannot hold: " + st.error().message);
  }
  return id;
}

std::string logical_id(const Placement& p, const std::string& physical) {
  return physical.starts_with(p.prefix) ? physical.substr(p.prefix.size()) : physical;
}

// The generation in a physical id of namespace `ns` (ws-<24>-g<N>-...), or -1.
std::int64_t generation_of(const std::string& ns, const std::string& id) {
  std::string head = ns + "-g";
  if (!id.starts_with(head)) return -1;
  std::int64_t g = 0;
  std::size_t i = head.size();
  for (; i < id.size() && i < head.size() + 18 && std::isdigit(static_cast<unsigned char>(id[i]));
       ++i) {
    g = g * 10 + (id[i] - '0');
  }
  if (i == head.size() || i >= id.size() || id[i] != '-') return -1;
  return g;
}

}  // namespace

// ---- the surface's state (on the io thread only)

// One action in flight: stop() kills its command (a newer generation, the connection's end).
struct LangbotAction {
  explicit LangbotAction(asio::any_io_executor ex)
      : timer(std::move(ex), asio::steady_timer::time_point::max()) {}
  void stop() {
    stopped = true;
    timer.cancel();
  }
  asio::steady_timer timer;
  bool stopped = false;
  std::string ns;  // tenant actions: the placement
  std::int64_t gen = 0;
};

struct LangbotRelay {
  std::string ns;
  std::int64_t gen = 0;
  std::weak_ptr<WsSession> ws;
};

class LangbotState {
 public:
  std::string bound;                         // the trusted instance id ("" = not bound yet)
  std::map<std::string, std::int64_t> gens;  // namespace -> current placement generation
  std::set<std::shared_ptr<LangbotAction>> actions;
  std::vector<LangbotRelay> relays;
  std::map<std::string, std::vector<std::string>> env_keys;  // physical "/" process_id
  // Processes box_stop_managed_process stopped (physical "/" process_id -> its pid): gone to
  // LangBot, as from the SDK runtime's table (BoxManagedProcessNotFoundError), though the
  // process table keeps the ended process. A new start of that process_id clears it.
  std::map<std::string, std::int64_t> stopped;
  std::uint64_t next_request = 1;
};

namespace {

LangbotState* lb_state(Context* ctx) {
  if (!ctx->langbot) {
    ctx->langbot = std::make_shared<LangbotState>();
    ctx->langbot->bound = ctx->opts.langbot.trusted_instance;
  }
  return ctx->langbot.get();
}

Caller langbot_caller(const Context* ctx) {
  std::string name =
      ctx->opts.langbot.tenant.empty() ? std::string(kDefaultTenant) : ctx->opts.langbot.tenant;
  for (const TenantConfig& t : ctx->opts.tenants) {
    if (t.name == name) return Caller(name, false, t.max_sessions);
  }
  return Caller(name, false, 0);
}

std::string header(const Call* call, std::string_view name) {
  const auto& h = call->hp->get();
  auto it = h.find(name);
  return it == h.end() ? std::string() : std::string(it->value());
}

bool valid_instance_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (std::size_t i = 0; i < id.size(); ++i) {
    char c = id[i];
    bool ok = std::isalnum(static_cast<unsigned char>(c)) ||
              (i > 0 && (c == '.' || c == '_' || c == ':' || c == '-'));
    if (!ok) return false;
  }
  return true;
}

// The instance header and the control token (security.py). SECURITY: a daemon with tokens and
// no langbot.control_token refuses: these routes do not take the bearer token, and must not be
// the way around it.
bool authenticated(const Call* call, std::string* instance) {
  const Context* ctx = call->ctx;
  *instance = header(call, "X-LangBot-Instance-Id");
  if (!valid_instance_id(*instance)) return false;
  const std::string& want = ctx->opts.langbot.control_token;
  if (want.empty()) return ctx->opts.tenants.empty();
  std::string given = header(call, "X-LangBot-Box-Control-Token");
  return given.size() == want.size() && CRYPTO_memcmp(given.data(), want.data(), want.size()) == 0;
}

Reply unauthorized() {
  Reply r;
  r.status = 401;
  r.body = "Unauthorized";
  r.content_type = "text/plain; charset=utf-8";
  return r;
}

// ---- BoxSpec (models.BoxSpec), validated as pydantic would, then mapped

struct BoxSpec {
  std::string cmd;
  std::string workdir;
  std::int64_t timeout_sec = 30;
  std::map<std::string, std::string> env;
  std::string session_id;
  ojson shape = ojson::object();  // the session's fields, in the model's order
};

// A field of a pydantic model: absent -> fallback; `nullable` fields take null.
struct Fields {
  const json& data;
  std::string_view model;

  const json* find(const char* k) const {
    auto it = data.find(k);
    return it == data.end() ? nullptr : &*it;
  }
  LbResult<std::string> str(const char* k, std::string fallback) const {
    const json* v = find(k);
    if (v == nullptr) return fallback;
    if (!v->is_string())
      return std::unexpected(validation(model, k, "Input should be a valid string"));
    return v->get<std::string>();
  }
  LbResult<std::optional<std::string>> opt_str(const char* k) const {
    const json* v = find(k);
    if (v == nullptr || v->is_null()) return std::optional<std::string>{};
    if (!v->is_string())
      return std::unexpected(validation(model, k, "Input should be a valid string"));
    return std::optional<std::string>(v->get<std::string>());
  }
  LbResult<std::int64_t> integer(const char* k, std::int64_t fallback, std::int64_t min,
                                 std::string_view bound) const {
    const json* v = find(k);
    std::int64_t n = fallback;
    if (v != nullptr) {
      if (v->is_number_integer()) {
        n = v->get<std::int64_t>();
      } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
                 std::floor(v->get<double>()) == v->get<double>() &&
                 std::fabs(v->get<double>()) < 9e15) {
        n = static_cast<std::int64_t>(v->get<double>());
      } else {
        return std::unexpected(validation(model, k, "Input should be a valid integer"));
      }
    }
    if (n < min)
      return std::unexpected(validation(model, k, "Input should be " + std::string(bound)));
    return n;
  }
  LbResult<bool> boolean(const char* k, bool fallback) const {
    const json* v = find(k);
    if (v == nullptr) return fallback;
    if (!v->is_boolean())
      return std::unexpected(validation(model, k, "Input should be a valid boolean"));
    return v->get<bool>();
  }
  // {str: str}, values coerced to str (numbers and booleans as Python prints them).
  LbResult<std::map<std::string, std::string>> str_map(const char* k) const {
    std::map<std::string, std::string> out;
    const json* v = find(k);
    if (v == nullptr) return out;
    if (!v->is_object())
      return std::unexpected(validation(model, k, "Input should be a valid dictionary"));
    for (auto it = v->begin(); it != v->end(); ++it) {
      const json& x = it.value();
      if (x.is_string()) {
        out[it.key()] = x.get<std::string>();
      } else if (x.is_boolean()) {
        out[it.key()] = x.get<bool>() ? "True" : "False";
      } else if (x.is_number()) {
        out[it.key()] = x.dump();
      } else {
        return std::unexpected(
            validation(model, std::string(k) + "." + it.key(), "Input should be a valid string"));
      }
    }
    return out;
  }
};

bool absolute(std::string_view p) {
  return !p.empty() && p.front() == '/';
}


LbResult<std::string> mount_mode(const Fields& f, const char* k) {
  auto m = f.str(k, "rw");
  if (!m) return std::unexpected(m.error());
  if (*m != "rw" && *m != "ro" && *m != "none") {
    return std::unexpected(validation(f.model, k, "Input should be 'rw', 'ro' or 'none'"));
  }
  return m;
}

#define LB_TRY(var, expr)                                \
  auto var##_r = (expr);                                 \
  if (!var##_r) return std::unexpected(var##_r.error()); \
  auto var = std::move(*var##_r)

LbResult<BoxSpec> decode_box_spec(const json& data, bool need_cmd) {
  Fields f{data, "BoxSpec"};
  BoxSpec s;
  LB_TRY(cmd, f.str("cmd", ""));
  s.cmd = py_strip(cmd);
  if (need_cmd && s.cmd.empty())
    return std::unexpected(validation("BoxSpec", "cmd", "cmd must not be empty"));
  LB_TRY(mount_path, f.str("mount_path", "/workspace"));
  if (!absolute(mount_path))
    return std::unexpected(
        validation("BoxSpec", "mount_path", "mount_path must be an absolute path"));
  const json* wd = f.find("workdir");
  if (wd == nullptr) {
    s.workdir = "/workspace";
  } else if (wd->is_null() || (wd->is_string() && wd->get<std::string>().empty())) {
    s.workdir = mount_path;  // empty or null takes mount_path
  } else if (!wd->is_string()) {
    return std::unexpected(validation("BoxSpec", "workdir", "Input should be a valid string"));
  } else {
    s.workdir = wd->get<std::string>();
  }
  if (!absolute(s.workdir))
    return std::unexpected(validation("BoxSpec", "workdir", "workdir must be an absolute path"));
  LB_TRY(timeout, f.integer("timeout_sec", 30, 1, "greater than 0"));
  if (timeout > static_cast<std::int64_t>(kMaxTimeoutSec)) {
    return std::unexpected(
        validation("BoxSpec", "timeout_sec", "agentbox runs a command for at most 86400 s"));
  }
  s.timeout_sec = timeout;
  LB_TRY(network, f.str("network", "off"));
  if (network != "off" && network != "on")
    return std::unexpected(validation("BoxSpec", "network", "Input should be 'off' or 'on'"));
  if (f.find("session_id") == nullptr)
    return std::unexpected(validation("BoxSpec", "session_id", "Field required"));
  LB_TRY(sid, f.str("session_id", ""));
  s.session_id = py_strip(sid);
  if (s.session_id.empty())
    return std::unexpected(validation("BoxSpec", "session_id", "session_id must not be empty"));
  LB_TRY(env, f.str_map("env"));
  s.env = std::move(env);
  LB_TRY(image, f.str("image", kDefaultImage));
  LB_TRY(host_path, f.opt_str("host_path"));
  if (host_path && !absolute(*host_path))
    return std::unexpected(
        validation("BoxSpec", "host_path", "host_path must be an absolute path"));
  LB_TRY(host_mode, mount_mode(f, "host_path_mode"));
  if (host_path && host_mode != "none" && !paths::at_or_under(s.workdir, mount_path)) {
    return std::unexpected(
        validation("BoxSpec", "workdir",
                   "workdir must be mount_path or lie under it when host_path is mounted"));
  }
  json mounts = json::array();
  if (const json* em = f.find("extra_mounts"); em != nullptr) {
    if (!em->is_array())
      return std::unexpected(validation("BoxSpec", "extra_mounts", "Input should be a valid list"));
    for (std::size_t i = 0; i < em->size(); ++i) {
      const json& m = (*em)[i];
      std::string where = "BoxSpec.extra_mounts." + std::to_string(i);
      if (!m.is_object())
        return std::unexpected(validation(where, "", "Input should be a valid dictionary"));
      Fields mf{m, where};
      LB_TRY(hp, mf.str("host_path", ""));
      LB_TRY(mp, mf.str("mount_path", ""));
      if (!absolute(hp))
        return std::unexpected(
            validation(where, "host_path", "host_path must be an absolute path"));
      if (!absolute(mp))
        return std::unexpected(
            validation(where, "mount_path", "mount_path must be an absolute path"));
      LB_TRY(mode, mount_mode(mf, "mode"));
      mounts.push_back({{"host_path", hp}, {"mount_path", mp}, {"mode", mode}});
    }
  }
  LB_TRY(skill, f.opt_str("skill_name"));
  if (skill) {
    bool ok = !skill->empty() && skill->size() <= 64;
    for (char c : *skill)
      ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
    if (!ok)
      return std::unexpected(validation(
          "BoxSpec", "skill_name", "skill_name must be at most 64 characters of [A-Za-z0-9_-]"));
  }
  LB_TRY(persistent, f.boolean("persistent", false));
  double cpus = 1.0;
  if (const json* c = f.find("cpus"); c != nullptr) {
    if (!c->is_number())
      return std::unexpected(validation("BoxSpec", "cpus", "Input should be a valid number"));
    cpus = c->get<double>();
    if (!(cpus > 0) || !std::isfinite(cpus))
      return std::unexpected(validation("BoxSpec", "cpus", "Input should be greater than 0"));
  }
  LB_TRY(memory, f.integer("memory_mb", 512, 32, "greater than or equal to 32"));
  LB_TRY(pids, f.integer("pids_limit", 128, 1, "greater than or equal to 1"));
  LB_TRY(ro_root, f.boolean("read_only_rootfs", true));
  LB_TRY(quota, f.integer("workspace_quota_mb", 0, 0, "greater than or equal to 0"));

  // Valid; now what agentbox does not do (never accepted and ignored).
  if (image != kDefaultImage) {
    return lb_fail("BoxError",
                   "image '" + image +
                       "' is not supported: agentbox boxes run the "
                       "host's read-only system, not container images (send the default '" +
                       std::string(kDefaultImage) + "')");
  }
  if (skill) {
    return lb_fail("BoxError",
                   "skill_name is not supported: agentbox has no skill store; mount "
                   "the skill with extra_mounts");
  }
  if (!ro_root) {
    return lb_fail("BoxError",
                   "read_only_rootfs=false is not supported: an agentbox box's system "
                   "is always read-only (the workspace and /tmp are writable)");
  }
  ojson& sh = s.shape;
  sh["image"] = image;
  sh["network"] = network;
  sh["host_path"] = host_path ? json(*host_path) : json(nullptr);
  sh["host_path_mode"] = host_mode;
  sh["mount_path"] = mount_path;
  sh["persistent"] = persistent;
  sh["cpus"] = cpus;
  sh["memory_mb"] = memory;
  sh["pids_limit"] = pids;
  sh["read_only_rootfs"] = ro_root;
  sh["workspace_quota_mb"] = quota;
  sh["extra_mounts"] = mounts;
  return s;
}

// The POST /v1/sessions body that makes the session of `s` (decode_create_session checks it
// as it checks any create: mounts under the allowed roots, limits in range).
json create_body(const std::string& physical, const ojson& sh) {
  json limits = json::object();
  limits["memory_mb"] = sh["memory_mb"].get<std::int64_t>();
  limits["cpu_percent"] = std::llround(sh["cpus"].get<double>() * 100);
  limits["max_pids"] = sh["pids_limit"].get<std::int64_t>();
  if (sh["workspace_quota_mb"].get<std::int64_t>() > 0) {
    limits["disk_mb"] = sh["workspace_quota_mb"].get<std::int64_t>();
  }
  json body = json::object();
  body["id"] = physical;
  body["limits"] = std::move(limits);
  body["network"] = {{"mode", sh["network"] == "on" ? "open" : "none"}};
  body["extra_mounts"] = json::parse(sh["extra_mounts"].dump());
  if (!sh["host_path"].is_null()) {
    body["host_path"] = sh["host_path"].get<std::string>();
    body["mount_path"] = sh["mount_path"].get<std::string>();
    body["host_path_mode"] = sh["host_path_mode"].get<std::string>();
  }
  if (sh["persistent"].get<bool>()) body["ttl_sec"] = 0;
  body["labels"] = {{kSpecLabel, sh.dump()}};
  return body;
}

// Python's str() of a value, for conflict messages.
std::string py_str(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  return py_dumps(v);
}

ojson stored_shape(const SessionInfo& s) {
  auto it = s.spec.labels.find(kSpecLabel);
  if (it == s.spec.labels.end()) return ojson::object();
  ojson j = ojson::parse(it->second, nullptr, false);
  return j.is_object() ? j : ojson::object();
}

ojson session_info(const Placement& p, const SessionInfo& s) {
  ojson sh = stored_shape(s);
  auto field = [&](const char* k) { return sh.contains(k) ? sh[k] : ojson(nullptr); };
  ojson j = ojson::object();
  j["session_id"] = logical_id(p, s.id);
  j["backend_name"] = "agentbox-" + s.backend;
  j["backend_session_id"] = s.id;
  for (const char* k :
       {"image", "network", "host_path", "host_path_mode", "mount_path", "persistent", "cpus",
        "memory_mb", "pids_limit", "read_only_rootfs", "workspace_quota_mb"}) {
    j[k] = field(k);
  }
  j["created_at"] = rfc3339(s.created_at);
  j["last_used_at"] = rfc3339(s.last_used_at);
  return j;
}

// ---- one action

struct Act {
  Context* ctx = nullptr;
  LangbotState* st = nullptr;
  Caller caller;
  std::optional<Placement> place;  // tenant actions
  json data;
  std::string action;
  std::shared_ptr<LangbotAction> ctl;
  std::uint64_t id = 0;
};

LbResult<std::string> data_key(const Act* a, const char* k) {
  auto it = a->data.find(k);
  if (it == a->data.end()) return lb_fail("KeyError", std::string("'") + k + "'");
  if (!it->is_string()) return lb_fail("BoxValidationError", std::string(k) + " must be a string");
  return it->get<std::string>();
}

asio::awaitable<Result<SessionInfo>> get_info(Context* ctx, std::string id, Caller caller) {
  session::SessionManager* sm = ctx->sessions;
  auto job = run_blocking(ctx->pool, [sm, id, caller] { return sm->get(id, caller); });
  co_return co_await std::move(job);
}

asio::awaitable<Status> destroy(Context* ctx, std::string id, Caller caller) {
  session::SessionManager* sm = ctx->sessions;
  auto job = run_blocking(ctx->pool, [sm, id, caller] { return sm->destroy(id, caller); });
  co_return co_await std::move(job);
}

asio::awaitable<Result<std::vector<SessionInfo>>> list_ns(Context* ctx, Caller caller,
                                                          std::string prefix) {
  session::SessionManager* sm = ctx->sessions;
  auto job = run_blocking(ctx->pool, [sm, caller, prefix]() -> Result<std::vector<SessionInfo>> {
    std::vector<SessionInfo> out;
    for (auto& s : sm->list(caller)) {
      if (s.id.starts_with(prefix) && s.id.size() > prefix.size()) out.push_back(std::move(s));
    }
    return out;
  });
  co_return co_await std::move(job);
}

LbError not_found(const std::string& physical) {
  return {"BoxSessionNotFoundError", "session " + physical + " not found"};
}

// An error of a call on session `physical`: no such session in LangBot's words, else mapped.
LbError session_error(const Error& e, const std::string& physical) {
  return e.code == Code::kNotFound ? not_found(physical) : lb_error(e, About::kSession);
}

// The physical id of the request's data.session_id (KeyError when missing).
LbResult<std::string> data_session(const Act* a) {
  auto sid = data_key(a, "session_id");
  if (!sid) return std::unexpected(sid.error());
  return physical_id(*a->place, *sid);
}

// The session of `spec` (runtime._get_or_create_session): made if missing; an existing one
// must have the same fields (BoxSessionConflictError naming the first that differs), except
// extra_mounts, whose change recreates it.
asio::awaitable<LbResult<SessionInfo>> ensure_session(Act* a, const BoxSpec& spec,
                                                      std::string physical) {
  Context* ctx = a->ctx;
  auto have = co_await get_info(ctx, physical, a->caller);
  if (have) {
    ojson old = stored_shape(*have);
    bool mounts_changed = false;
    for (auto it = spec.shape.begin(); it != spec.shape.end(); ++it) {
      if (!old.contains(it.key()) || old[it.key()] == it.value()) continue;
      if (it.key() == "extra_mounts") {
        mounts_changed = true;
        continue;
      }
      co_return lb_fail("BoxSessionConflictError", "Box session " + physical +
                                                       " already exists with " + it.key() + "=" +
                                                       py_str(old[it.key()]));
    }
    if (!mounts_changed) co_return *have;
    auto gone = co_await destroy(ctx, physical, a->caller);
    if (!gone && gone.error().code != Code::kNotFound) {
      co_return std::unexpected(lb_error(gone.error(), About::kSession));
    }
  } else if (have.error().code != Code::kNotFound) {
    co_return std::unexpected(lb_error(have.error(), About::kSession));
  }
  auto decoded = decode_create_session(create_body(physical, spec.shape));
  if (!decoded) co_return std::unexpected(lb_error(decoded.error(), About::kSession));
  session::SessionManager* sm = ctx->sessions;
  Caller caller = a->caller;
  auto job = run_blocking(ctx->pool, [sm, d = std::move(*decoded), caller] {
    return sm->create_or_get(d.id, d.spec, caller);
  });
  auto made = co_await std::move(job);
  if (!made) co_return std::unexpected(lb_error(made.error(), About::kSession));
  co_return made->first;
}

asio::awaitable<LbResult<std::shared_ptr<sandbox::Sandbox>>> box_of(Act* a, std::string physical,
                                                                    bool create) {
  auto box = co_await acquire_sandbox(a->ctx, physical, create, a->caller);
  if (!box) co_return std::unexpected(session_error(box.error(), physical));
  co_return *box;
}

// ---- managed processes

struct ProcSpec {
  std::string process_id;
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::string cwd;
};

bool valid_tag(std::string_view t) {
  if (t.empty() || t.size() > 64) return false;
  bool digits = true;
  for (char c : t) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      return false;
    digits = digits && std::isdigit(static_cast<unsigned char>(c));
  }
  return !digits;
}

LbResult<std::string> process_id_of(const json& v) {
  if (!v.is_string())
    return std::unexpected(
        validation("BoxManagedProcessSpec", "process_id", "Input should be a valid string"));
  std::string id = v.get<std::string>();
  if (!valid_tag(id)) {
    return lb_fail("BoxValidationError",
                   "process_id '" + id +
                       "': agentbox names a process by at "
                       "most 64 characters of [A-Za-z0-9._-], not all digits");
  }
  return id;
}

LbResult<ProcSpec> decode_proc_spec(const json& v) {
  if (!v.is_object())
    return std::unexpected(
        validation("BoxManagedProcessSpec", "spec", "Input should be a valid dictionary"));
  Fields f{v, "BoxManagedProcessSpec"};
  ProcSpec p;
  json pid = v.contains("process_id") ? v["process_id"] : json("default");
  LB_TRY(process_id, process_id_of(pid));
  p.process_id = std::move(process_id);
  if (!f.find("command")) return std::unexpected(validation(f.model, "command", "Field required"));
  LB_TRY(command, f.str("command", ""));
  if (py_strip(command).empty())
    return std::unexpected(validation(f.model, "command", "command must not be empty"));
  p.argv.push_back(command);
  if (const json* args = f.find("args"); args != nullptr) {
    if (!args->is_array())
      return std::unexpected(validation(f.model, "args", "Input should be a valid list"));
    for (std::size_t i = 0; i < args->size(); ++i) {
      if (!(*args)[i].is_string())
        return std::unexpected(
            validation(f.model, "args." + std::to_string(i), "Input should be a valid string"));
      p.argv.push_back((*args)[i].get<std::string>());
    }
  }
  LB_TRY(env, f.str_map("env"));
  p.env = std::move(env);
  LB_TRY(cwd, f.str("cwd", "/workspace"));
  if (!absolute(cwd))
    return std::unexpected(validation(f.model, "cwd", "cwd must be an absolute path"));
  p.cwd = cwd;
  LB_TRY(memory, f.integer("memory_mb", 0, 0, "greater than or equal to 0"));
  if (memory != 0) {
    return lb_fail("BoxError",
                   "spec.memory_mb is not supported: a managed process shares its "
                   "box's memory limit (send 0)");
  }
  return p;
}

// The last kStderrPreview bytes of the process's stderr (UTF-8 kept whole).
std::string stderr_preview(sandbox::ProcessTable* t, const std::string& pid) {
  std::string err;
  std::optional<std::uint64_t> since;
  for (int i = 0; i < 64; ++i) {
    auto b = t->output(pid, since);
    if (!b || b->records.empty()) break;
    for (const auto& r : b->records) {
      if (r.type == sandbox::OutputRecord::Type::kStderr) err += r.data;
    }
    if (err.size() > 2 * kStderrPreview) err.erase(0, err.size() - kStderrPreview);
    if (b->ended) break;
    since = b->next;
  }
  if (err.size() > kStderrPreview) {
    std::size_t cut = err.size() - kStderrPreview;
    while (cut < err.size() && (static_cast<unsigned char>(err[cut]) & 0xC0) == 0x80) ++cut;
    err.erase(0, cut);
  }
  return err;
}

ojson process_info(Act* a, const std::string& physical, sandbox::ProcessTable* t,
                   const sandbox::ProcessInfo& p) {
  const std::string pid = std::to_string(p.pid);
  bool attached = false;
  if (p.state == sandbox::ProcessState::kRunning) {
    auto probe = t->attach(pid);  // released at once: only asks whether another holds it
    attached = !probe && probe.error().code == Code::kExists;
  }
  ojson env_keys = ojson::array();
  if (auto it = a->st->env_keys.find(physical + "/" + p.tag); it != a->st->env_keys.end()) {
    for (const auto& k : it->second) env_keys.push_back(k);
  }
  ojson args = ojson::array();
  for (std::size_t i = 1; i < p.argv.size(); ++i) args.push_back(p.argv[i]);
  ojson j = ojson::object();
  j["session_id"] = logical_id(*a->place, physical);
  j["process_id"] = p.tag;
  j["status"] = p.state == sandbox::ProcessState::kRunning ? "running" : "exited";
  j["command"] = p.argv.empty() ? p.command : p.argv[0];
  j["args"] = std::move(args);
  j["cwd"] = p.cwd;
  j["env_keys"] = std::move(env_keys);
  j["attached"] = attached;
  j["started_at"] = rfc3339(p.started_at);
  j["exited_at"] = p.ended_at ? ojson(rfc3339(*p.ended_at)) : ojson(nullptr);
  j["exit_code"] = p.exit_code && p.state != sandbox::ProcessState::kRunning ? ojson(*p.exit_code)
                                                                             : ojson(nullptr);
  j["stderr_preview"] = stderr_preview(t, pid);
  return j;
}

LbResult<sandbox::ProcessTable*> table_of(const std::shared_ptr<sandbox::Sandbox>& box,
                                          const std::string& physical) {
  if (box->processes() == nullptr) {
    return lb_fail("BoxBackendUnavailableError",
                   "the backend of session " + physical + " runs no managed processes");
  }
  return box->processes();
}

// ---- the actions

using ActResult = asio::awaitable<LbResult<ojson>>;

ActResult act_ping(Act*) {
  co_return ojson::object();
}

ActResult act_init(Act* a) {
  if (!a->data.is_object())
    co_return lb_fail("BoxValidationError", "box_init data must be an object");
  // LangBot's `box` config section (backend, local, limits, profile): agentboxd's own config
  // governs its boxes; the keys are logged, never taken as applied.
  std::string keys;
  for (auto it = a->data.begin(); it != a->data.end(); ++it)
    keys += (keys.empty() ? "" : ",") + it.key();
  spdlog::info("langbot: box_init (keys: {}); agentboxd's own config governs backend and limits",
               keys);
  ojson r = ojson::object();
  r["initialized"] = true;
  co_return r;
}

ActResult act_backend_info(Act* a) {
  std::shared_ptr<sandbox::Backend> backend = a->ctx->default_backend;
  auto job = run_blocking(a->ctx->pool, [backend]() -> Status {
    if (!backend) return fail(Code::kUnavailable, "no default backend");
    return backend->check_usable();
  });
  auto usable = co_await std::move(job);
  ojson r = ojson::object();
  r["name"] = backend ? ojson("agentbox-" + std::string(backend->name())) : ojson(nullptr);
  r["available"] = usable.has_value();
  co_return r;
}

ActResult act_status(Act* a) {
  auto list = co_await list_ns(a->ctx, a->caller, a->place->prefix);
  if (!list) co_return std::unexpected(lb_error(list.error(), About::kSession));
  auto backend = co_await act_backend_info(a);
  ojson limits = ojson::object();
  limits["max_sessions"] = a->caller.max_sessions;
  limits["max_managed_processes"] = sandbox::ProcessTable::kMaxLive;
  limits["max_completed_processes"] = sandbox::ProcessTable::kMaxEnded;
  limits["max_admission_records"] = 0;
  limits["max_rpc_file_bytes"] = 0;
  ojson r = ojson::object();
  r["backend"] = *backend;
  r["active_sessions"] = list->size();
  r["managed_processes"] = 0;  // as the SDK at 02623a28 (PROTOCOLS.md 2.5)
  r["session_ttl_sec"] = a->ctx->sessions->config().default_ttl_sec;
  r["limits"] = std::move(limits);
  co_return r;
}

ActResult act_create_session(Act* a) {
  auto spec = decode_box_spec(a->data, false);
  if (!spec) co_return std::unexpected(spec.error());
  auto physical = physical_id(*a->place, spec->session_id);
  if (!physical) co_return std::unexpected(physical.error());
  auto info = co_await ensure_session(a, *spec, *physical);
  if (!info) co_return std::unexpected(info.error());
  auto box = co_await box_of(a, *physical, false);  // the box is up, as the SDK's container
  if (!box) co_return std::unexpected(box.error());
  co_return session_info(*a->place, *info);
}

// Python's str.strip() of command output, and the SDK's cap with a clip notice.
std::string clip_output(std::string s, bool truncated) {
  s = py_strip(s);
  if (truncated) s += "\n... [output truncated at 1 MiB]";
  return s;
}

asio::awaitable<void> wait_stop(std::shared_ptr<LangbotAction> ctl, bool* gone) {
  co_await ctl->timer.async_wait(kTuple);
  if (ctl->stopped) *gone = true;
}

ActResult act_exec(Act* a) {
  auto spec = decode_box_spec(a->data, true);
  if (!spec) co_return std::unexpected(spec.error());
  auto physical = physical_id(*a->place, spec->session_id);
  if (!physical) co_return std::unexpected(physical.error());
  auto info = co_await ensure_session(a, *spec, *physical);
  if (!info) co_return std::unexpected(info.error());
  auto box = co_await box_of(a, *physical, false);
  if (!box) co_return std::unexpected(box.error());
  {
    // As LangBot's runtime: a workdir that does not exist yet is made (as the session user)
    // before the command runs.
    std::shared_ptr<sandbox::Sandbox> b = *box;
    std::string wd = spec->workdir;
    auto job = run_blocking(a->ctx->pool, [b, wd]() -> Status { return b->mkdir_all(wd); });
    auto made = co_await std::move(job);
    if (!made) co_return std::unexpected(lb_error(made.error(), About::kSession));
  }
  sandbox::ExecSpec es;
  es.command = spec->cmd;
  es.cwd = spec->workdir;
  es.env = spec->env;
  es.timeout = std::chrono::seconds(spec->timeout_sec);
  es.max_output_bytes = kExecOutputCap;
  bool gone = false;
  service::StopSignal stop{wait_stop(a->ctl, &gone), &gone};
  service::Lease lease{*physical, *box};
  auto ran = co_await a->ctx->svc->exec.run(service::Origin(a->caller, a->id, service::Surface::kLangbot),
                                            std::move(lease), std::move(es), nullptr,
                                            std::move(stop));
  if (!ran)
    co_return lb_fail(
        "BoxError",
        "the command was stopped: its placement generation is stale or its connection closed");
  if (!*ran) co_return std::unexpected(lb_error(ran->error(), About::kSession));
  const sandbox::ExecResult& r = **ran;
  ojson j = ojson::object();
  j["session_id"] = logical_id(*a->place, *physical);
  j["backend_name"] = "agentbox-" + info->backend;
  j["status"] = r.timed_out ? "timed_out" : "completed";
  j["ok"] = !r.timed_out && r.exit_code == 0;
  j["exit_code"] = r.timed_out ? ojson(nullptr) : ojson(r.exit_code);
  j["stdout"] = clip_output(r.stdout_data, r.stdout_truncated);
  j["stderr"] = clip_output(r.stderr_data, r.stderr_truncated);
  j["stdout_truncated"] = r.stdout_truncated;
  j["stderr_truncated"] = r.stderr_truncated;
  j["duration_ms"] = r.duration.count();
  if (r.timed_out) {
    // As the SDK's runtime: a timed-out exec takes its session with it (the next exec starts a
    // fresh one).
    box->reset();
    auto gone_st = co_await destroy(a->ctx, *physical, a->caller);
    if (!gone_st)
      spdlog::warn("langbot: deleting timed-out session {}: {}", *physical,
                   gone_st.error().message);
  }
  co_return j;
}

ActResult act_get_session(Act* a) {
  auto physical = data_session(a);
  if (!physical) co_return std::unexpected(physical.error());
  auto info = co_await get_info(a->ctx, *physical, a->caller);
  if (!info) co_return std::unexpected(session_error(info.error(), *physical));
  ojson j = session_info(*a->place, *info);
  // The managed processes of a running box (a suspended one runs none).
  std::shared_ptr<sandbox::Sandbox> box =
      a->ctx->sessions->try_acquire_running(*physical, a->caller);
  if (box && box->processes() != nullptr) {
    sandbox::ProcessTable* t = box->processes();
    ojson procs = ojson::object();
    for (const auto& p : t->list()) {
      if (p.tag.empty()) continue;
      auto gone = a->st->stopped.find(*physical + "/" + p.tag);
      if (gone != a->st->stopped.end() && gone->second == p.pid) continue;
      procs[p.tag] = process_info(a, *physical, t, p);  // newest last: it wins
    }
    if (!procs.empty()) {
      if (procs.contains("default")) j["managed_process"] = procs["default"];
      j["managed_processes"] = std::move(procs);
    }
  }
  co_return j;
}

ActResult act_get_sessions(Act* a) {
  auto list = co_await list_ns(a->ctx, a->caller, a->place->prefix);
  if (!list) co_return std::unexpected(lb_error(list.error(), About::kSession));
  ojson arr = ojson::array();
  for (const auto& s : *list) arr.push_back(session_info(*a->place, s));
  ojson r = ojson::object();
  r["sessions"] = std::move(arr);
  co_return r;
}

ActResult act_delete_session(Act* a) {
  auto sid = data_key(a, "session_id");
  if (!sid) co_return std::unexpected(sid.error());
  auto physical = physical_id(*a->place, *sid);
  if (!physical) co_return std::unexpected(physical.error());
  auto st = co_await destroy(a->ctx, *physical, a->caller);
  if (!st) co_return std::unexpected(session_error(st.error(), *physical));
  for (auto it = a->st->env_keys.lower_bound(*physical + "/");
       it != a->st->env_keys.end() && it->first.starts_with(*physical + "/");) {
    it = a->st->env_keys.erase(it);
  }
  for (auto it = a->st->stopped.lower_bound(*physical + "/");
       it != a->st->stopped.end() && it->first.starts_with(*physical + "/");) {
    it = a->st->stopped.erase(it);
  }
  ojson r = ojson::object();
  r["deleted"] = *sid;
  co_return r;
}

// The session's table and process `process_id` of a get/stop.
struct Found {
  std::shared_ptr<sandbox::Sandbox> box;
  sandbox::ProcessTable* table = nullptr;
  std::string physical;
  std::string process_id;
  sandbox::ProcessInfo info;
};

// The running box of session `physical` and its process table.
asio::awaitable<LbResult<Found>> table_in(Act* a, std::string physical) {
  auto box = co_await box_of(a, physical, false);
  if (!box) co_return std::unexpected(box.error());
  auto table = table_of(*box, physical);
  if (!table) co_return std::unexpected(table.error());
  Found f;
  f.box = std::move(*box);
  f.table = *table;
  f.physical = std::move(physical);
  co_return f;
}

ActResult act_start_process(Act* a) {
  auto physical = data_session(a);
  if (!physical) co_return std::unexpected(physical.error());
  auto it = a->data.find("spec");
  if (it == a->data.end()) co_return lb_fail("KeyError", "'spec'");
  auto spec = decode_proc_spec(*it);
  if (!spec) co_return std::unexpected(spec.error());
  auto found = co_await table_in(a, *physical);
  if (!found) co_return std::unexpected(found.error());
  sandbox::ProcessTable* table = found->table;
  sandbox::ProcessSpec ps;
  ps.argv = spec->argv;
  ps.cwd = spec->cwd;
  ps.env = spec->env;
  ps.tag = spec->process_id;
  ps.stdin_open = true;
  auto started = co_await table->start(std::move(ps));
  if (!started) {
    if (started.error().code == Code::kExists) {
      co_return lb_fail(
          "BoxManagedProcessConflictError",
          "managed process " + spec->process_id + " is already running in session " + *physical);
    }
    co_return std::unexpected(lb_error(started.error(), About::kProcess));
  }
  std::vector<std::string> keys;
  for (const auto& kv : spec->env) keys.push_back(kv.first);  // std::map: sorted
  a->st->env_keys[*physical + "/" + spec->process_id] = std::move(keys);
  a->st->stopped.erase(*physical + "/" + spec->process_id);
  audit(a->ctx, "process.start", a->caller, *physical,
        nlohmann::ordered_json{{"argv", started->argv},
                               {"pid", started->pid},
                               {"tag", started->tag},
                               {"via", "langbot"}});
  co_return process_info(a, *physical, table, *started);
}

asio::awaitable<LbResult<Found>> find_process(Act* a) {
  auto physical = data_session(a);
  if (!physical) co_return std::unexpected(physical.error());
  auto pit = a->data.find("process_id");
  if (pit == a->data.end()) co_return lb_fail("KeyError", "'process_id'");
  auto pid = process_id_of(*pit);
  if (!pid) co_return std::unexpected(pid.error());
  auto found = co_await table_in(a, *physical);
  if (!found) co_return std::unexpected(found.error());
  auto info = found->table->get(*pid);
  auto gone = a->st->stopped.find(*physical + "/" + *pid);
  if (!info || (gone != a->st->stopped.end() && gone->second == info->pid)) {
    co_return lb_fail("BoxManagedProcessNotFoundError",
                      "managed process " + *pid + " not found in session " + *physical);
  }
  found->process_id = *pid;
  found->info = *info;
  co_return std::move(*found);
}

ActResult act_get_process(Act* a) {
  auto f = co_await find_process(a);
  if (!f) co_return std::unexpected(f.error());
  co_return process_info(a, f->physical, f->table, f->info);
}

ActResult act_stop_process(Act* a) {
  auto f = co_await find_process(a);
  if (!f) co_return std::unexpected(f.error());
  auto info = co_await kill_and_wait(f->table, std::to_string(f->info.pid));
  if (!info) co_return std::unexpected(lb_error(info.error(), About::kProcess));
  audit(a->ctx, "process.kill", a->caller, f->physical,
        nlohmann::ordered_json{{"pid", info->pid}, {"via", "langbot"}});
  a->st->stopped[f->physical + "/" + f->process_id] = f->info.pid;
  ojson r = ojson::object();
  r["stopped"] = f->process_id;
  co_return r;
}

// box_shutdown: the runtime stops its boxes. Here: LangBot's running sessions are suspended
// (their workspaces stay; the next use resumes them).
ActResult act_shutdown(Act* a) {
  session::SessionManager* sm = a->ctx->sessions;
  Caller caller = a->caller;
  auto job = run_blocking(a->ctx->pool, [sm, caller]() -> Result<std::size_t> {
    std::size_t n = 0;
    for (const auto& s : sm->list(caller)) {
      if (!s.id.starts_with("ws-") || s.state != session::State::kRunning) continue;
      if (sm->suspend(s.id, caller)) ++n;
    }
    return n;
  });
  auto n = co_await std::move(job);
  spdlog::info("langbot: box_shutdown suspended {} session(s)", n ? *n : 0);
  co_return ojson::object();
}

ActResult act_skill_store(Act* a) {
  co_return lb_fail("BoxError", a->action +
                                    " is not built in agentbox: there is no skill store (mount "
                                    "skills into sessions with extra_mounts)");
}

ActResult act_admission(Act* a) {
  co_return lb_fail("BoxError", a->action +
                                    " is not built in agentbox: admission grants are "
                                    "not supported (quotas are agentboxd's tenants)");
}

ActResult act_file_chunk(Act*) {
  co_return lb_fail("BoxError",
                    "__file_chunk is not built in agentbox: file uploads serve only "
                    "the skill store, which is not built");
}

using ActFn = ActResult (*)(Act*);

struct ActionDef {
  std::string_view name;
  bool tenant;
  ActFn fn;
};

constexpr ActionDef kActions[] = {
    {"__ping", false, act_ping},
    {"__file_chunk", false, act_file_chunk},
    {"box_health", false, act_backend_info},
    {"box_get_backend_info", false, act_backend_info},
    {"box_init", false, act_init},
    {"box_upsert_sandbox_admission_grant", false, act_admission},
    {"box_revoke_sandbox_admission_grant", false, act_admission},
    {"box_verify_shared_workspace", false, act_admission},
    {"box_shutdown", false, act_shutdown},
    {"box_status", true, act_status},
    {"box_create_session", true, act_create_session},
    {"box_exec", true, act_exec},
    {"box_get_session", true, act_get_session},
    {"box_get_sessions", true, act_get_sessions},
    {"box_delete_session", true, act_delete_session},
    {"box_start_managed_process", true, act_start_process},
    {"box_get_managed_process", true, act_get_process},
    {"box_stop_managed_process", true, act_stop_process},
    {"box_list_skills", true, act_skill_store},
    {"box_get_skill", true, act_skill_store},
    {"box_create_skill", true, act_skill_store},
    {"box_update_skill", true, act_skill_store},
    {"box_delete_skill", true, act_skill_store},
    {"box_scan_skill_directory", true, act_skill_store},
    {"box_list_skill_files", true, act_skill_store},
    {"box_read_skill_file", true, act_skill_store},
    {"box_write_skill_file", true, act_skill_store},
    {"box_preview_skill_zip", true, act_skill_store},
    {"box_install_skill_zip", true, act_skill_store},
};

// ActionContext: instance_uuid, workspace_uuid (stripped, non-empty), placement_generation
// (int >= 1, default 1), installation_uuid; nothing else. Its instance must be the bound one.
LbResult<Placement> decode_context(const json& c, const std::string& bound) {
  if (!c.is_object()) return lb_fail("PermissionError", "Box action context must be an object");
  for (auto it = c.begin(); it != c.end(); ++it) {
    const std::string& k = it.key();
    if (k != "instance_uuid" && k != "workspace_uuid" && k != "placement_generation" &&
        k != "installation_uuid") {
      return lb_fail("PermissionError", "Box action context has an unknown field '" + k + "'");
    }
  }
  std::string ids[2];
  const char* names[2] = {"instance_uuid", "workspace_uuid"};
  for (int i = 0; i < 2; ++i) {
    auto it = c.find(names[i]);
    if (it == c.end() || !it->is_string() || py_strip(it->get<std::string>()).empty()) {
      return lb_fail("PermissionError",
                     std::string("Box action context needs a non-empty ") + names[i]);
    }
    ids[i] = py_strip(it->get<std::string>());
  }
  std::int64_t gen = 1;
  if (auto it = c.find("placement_generation"); it != c.end()) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 1 ||
        it->get<std::int64_t>() > 999'999'999'999'999'999) {
      return lb_fail("PermissionError",
                     "placement_generation must be an integer greater than or equal to 1");
    }
    gen = it->get<std::int64_t>();
  }
  if (ids[0] != bound) {
    return lb_fail("PermissionError", "Box action context does not belong to the trusted instance");
  }
  return make_placement(ids[0], ids[1], gen);
}

// The generation fence (PROTOCOLS.md 2.5): older is refused; newer stops the older placement's
// actions and relays, and deletes its sessions.
asio::awaitable<LbResult<bool>> fence(Act* a) {
  LangbotState* st = a->st;
  const Placement& p = *a->place;
  if (st->gens.find(p.ns) == st->gens.end()) {
    // First sight of this placement since the daemon started: the fence is what the namespace's
    // sessions say (they outlive a restart; the map does not), so an older placement stays
    // refused after a restart too.
    auto have = co_await list_ns(a->ctx, a->caller, p.ns + "-g");
    std::int64_t newest = -1;
    if (have) {
      for (const auto& s : *have) newest = std::max(newest, generation_of(p.ns, s.id));
    }
    if (newest >= 1) st->gens.emplace(p.ns, newest);  // unless another action set it meanwhile
  }
  auto it = st->gens.find(p.ns);
  if (it != st->gens.end() && p.gen < it->second) {
    co_return lb_fail("PermissionError", "Stale Box placement generation");
  }
  if (it != st->gens.end() && p.gen == it->second) co_return true;
  st->gens[p.ns] = p.gen;
  for (const auto& other : st->actions) {
    if (other->ns == p.ns && other->gen < p.gen) other->stop();
  }
  for (auto& r : st->relays) {
    if (r.ns != p.ns || r.gen >= p.gen) continue;
    if (auto ws = r.ws.lock())
      ws->close(beast::websocket::close_code::policy_error, "stale placement generation");
  }
  std::erase_if(st->relays, [](const LangbotRelay& r) { return r.ws.expired(); });
  auto list = co_await list_ns(a->ctx, a->caller, p.ns + "-g");
  if (list) {
    for (const auto& s : *list) {
      std::int64_t g = generation_of(p.ns, s.id);
      if (g < 0 || g >= p.gen) continue;
      auto st2 = co_await destroy(a->ctx, s.id, a->caller);
      if (!st2 && st2.error().code != Code::kNotFound) {
        spdlog::warn("langbot: deleting stale session {}: {}", s.id, st2.error().message);
      }
    }
  }
  co_return true;
}

// One connection of /rpc/ws.
struct RpcConn {
  std::weak_ptr<WsSession> ws;
  std::set<std::shared_ptr<LangbotAction>> actions;
};

void send_frame(const std::shared_ptr<RpcConn>& rc, const ojson& frame) {
  if (auto ws = rc->ws.lock()) ws->send(py_dumps(frame));
}

asio::awaitable<void> run_action(Context* ctx, std::shared_ptr<RpcConn> rc, json seq_id,
                                 std::string action, json data, json context) {
  LangbotState* st = lb_state(ctx);
  const ActionDef* def = nullptr;
  for (const ActionDef& d : kActions) {
    if (d.name == action) def = &d;
  }
  auto ctl = std::make_shared<LangbotAction>(co_await asio::this_coro::executor);
  Act a{ctx,    st,  langbot_caller(ctx), std::nullopt, std::move(data),
        action, ctl, st->next_request++};
  LbResult<ojson> result = lb_fail("BoxError", "unset");
  bool registered = false;
  if (def == nullptr) {
    result = lb_fail("ValueError", "Action " + action + " not found");
  } else if (!a.data.is_object()) {
    result = lb_fail("BoxValidationError", "data must be an object");
  } else if (def->tenant && (context.is_null())) {
    result = lb_fail("PermissionError", "Box tenant action requires a trusted Workspace context");
  } else {
    bool go = true;
    if (!context.is_null()) {
      auto place = decode_context(context, st->bound);
      if (!place) {
        result = std::unexpected(place.error());
        go = false;
      } else if (def->tenant) {
        a.place = std::move(*place);
      }
    }
    if (go && a.place) {
      ctl->ns = a.place->ns;
      ctl->gen = a.place->gen;
      auto fenced = co_await fence(&a);
      if (!fenced) {
        result = std::unexpected(fenced.error());
        go = false;
      }
    }
    if (go) {
      st->actions.insert(ctl);
      rc->actions.insert(ctl);
      registered = true;
      result = co_await def->fn(&a);
    }
  }
  if (registered) {
    st->actions.erase(ctl);
    rc->actions.erase(ctl);
  }
  if (result) {
    send_frame(rc, reply_frame(seq_id, 0, "success", std::move(*result)));
  } else {
    send_frame(rc, reply_frame(seq_id, 1, error_message(result.error()), ojson::object()));
  }
}

void log_action_error(std::exception_ptr p) {
  if (!p) return;
  try {
    std::rethrow_exception(p);
  } catch (const std::exception& e) {
    spdlog::error("langbot action: {}", e.what());
  }
}

// One text frame from LangBot.
void on_frame(Context* ctx, const std::shared_ptr<RpcConn>& rc, std::string data) {
  json m = json::parse(data, nullptr, false);
  if (!m.is_object()) {
    send_frame(rc,
               reply_frame(nullptr, 1,
                           error_message({"BoxValidationError", "a frame must be a JSON object"}),
                           ojson::object()));
    return;
  }
  if (m.contains("code")) return;  // a response: this runtime sends no requests
  json seq_id = m.contains("seq_id") ? m["seq_id"] : json(nullptr);
  if (!seq_id.is_number_integer()) {
    send_frame(rc, reply_frame(seq_id, 1,
                               error_message({"BoxValidationError", "seq_id must be an integer"}),
                               ojson::object()));
    return;
  }
  if (!m.contains("action") || !m["action"].is_string()) {
    send_frame(
        rc, reply_frame(seq_id, 1, error_message({"BoxValidationError", "action must be a string"}),
                        ojson::object()));
    return;
  }
  if (rc->actions.size() >= kMaxInFlight) {
    send_frame(rc, reply_frame(seq_id, 1, "Runtime connection is busy (max 128 concurrent actions)",
                               ojson::object()));
    return;
  }
  json payload = m.contains("data") ? m["data"] : json::object();
  json context = m.contains("context") ? m["context"] : json(nullptr);
  asio::co_spawn(*ctx->ioc,
                 run_action(ctx, rc, std::move(seq_id), m["action"].get<std::string>(),
                            std::move(payload), std::move(context)),
                 [](std::exception_ptr p) { log_action_error(p); });
}

// GET /rpc/ws
asio::awaitable<bool> rpc_ws(Call* call) {
  Context* ctx = call->ctx;
  Conn* conn = call->conn;
  LangbotState* st = lb_state(ctx);
  std::string instance;
  if (!authenticated(call, &instance) || (!st->bound.empty() && instance != st->bound)) {
    spdlog::warn("langbot: /rpc/ws refused (instance header, control token or binding)");
    co_return co_await send_reply(call, unauthorized());
  }
  auto ws = std::make_shared<WsSession>(std::move(conn->stream), ws_options(ctx->opts));
  log_request(call, 101);
  auto ec = co_await ws->accept(call->hp->release());
  if (ec) co_return false;
  if (st->bound.empty()) {
    st->bound = instance;
    spdlog::info("langbot: instance {} bound", instance);
  } else if (st->bound != instance) {
    // Another instance bound first while this handshake ran: this one is not trusted.
    ws->close(beast::websocket::close_code::policy_error, "Unauthorized");
    co_await ws->run([](std::string, bool) {});
    co_return false;
  }
  auto rc = std::make_shared<RpcConn>();
  rc->ws = ws;
  std::weak_ptr<WsSession> weak = ws;
  conn->on_shutdown = [weak] {
    if (auto s = weak.lock()) s->close(beast::websocket::close_code::going_away, "shutting down");
  };
  auto on_message = [ctx, rc, weak](std::string data, bool binary) {
    if (binary) {
      // As aiohttp's server: TEXT frames only.
      if (auto s = weak.lock())
        s->close(beast::websocket::close_code::unknown_data, "text frames only");
      return;
    }
    on_frame(ctx, rc, std::move(data));
  };
  co_await ws->run(on_message);
  conn->on_shutdown = nullptr;
  for (const auto& a : rc->actions) a->stop();
  co_return false;
}

// ---- the relay

Reply relay_error(std::string cls, std::string message) {
  json j = {{"error", {{"code", std::move(cls)}, {"message", std::move(message)}}}};
  return json_reply(400, j);
}

// A canonical positive integer: "1", "12", never "01", "+1", " 1".
std::optional<std::int64_t> canonical_int(std::string_view s) {
  if (s.empty() || s.size() > 18 || s[0] == '0') return std::nullopt;
  std::int64_t n = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  return n;
}

// GET /v1/sessions/{id}/managed-process[/{process_id}]/ws
asio::awaitable<bool> relay(Call* call) {
  Context* ctx = call->ctx;
  LangbotState* st = lb_state(ctx);
  Request& req = call->ex.req;
  std::string instance;
  const std::string workspace = header(call, "X-LangBot-Workspace-Id");
  auto gen = canonical_int(header(call, "X-LangBot-Placement-Generation"));
  const std::string physical = req.params.at("id");
  auto pit = req.params.find("process_id");
  const std::string process_id = pit == req.params.end() ? std::string("default") : pit->second;
  // SECURITY: the relay never binds an instance; everything short of a placement of the bound
  // instance, current, holding this session is 401.
  bool ok = authenticated(call, &instance) && !st->bound.empty() && instance == st->bound &&
            !workspace.empty() && workspace.size() <= 256 && gen.has_value();
  std::optional<Placement> place;
  if (ok) {
    place = make_placement(instance, workspace, *gen);
    auto g = st->gens.find(place->ns);
    ok = g != st->gens.end() && g->second == *gen && physical.starts_with(place->prefix) &&
         physical.size() > place->prefix.size();
  }
  if (!ok) co_return co_await send_reply(call, unauthorized());
  Caller caller = langbot_caller(ctx);
  auto box = co_await acquire_sandbox(ctx, physical, false, caller);
  if (!box) {
    if (box.error().code == Code::kNotFound) {
      co_return co_await send_reply(
          call, relay_error("BoxSessionNotFoundError", "session " + physical + " not found"));
    }
    LbError e = lb_error(box.error(), About::kSession);
    co_return co_await send_reply(call, relay_error(e.cls, e.text));
  }
  sandbox::ProcessTable* table = (*box)->processes();
  auto info =
      table ? table->get(process_id) : Result<sandbox::ProcessInfo>(fail(Code::kNotFound, ""));
  auto stopped = st->stopped.find(physical + "/" + process_id);
  if (!info || !valid_tag(process_id) ||
      (stopped != st->stopped.end() && stopped->second == info->pid)) {
    co_return co_await send_reply(
        call, relay_error("BoxManagedProcessNotFoundError",
                          "managed process " + process_id + " not found in session " + physical));
  }
  if (info->state != sandbox::ProcessState::kRunning || !info->stdin_open) {
    co_return co_await send_reply(call,
                                  relay_error("BoxManagedProcessConflictError",
                                              "managed process " + process_id + " is not running"));
  }
  {
    auto probe = table->attach(std::to_string(info->pid));  // released at once
    if (!probe) {
      co_return co_await send_reply(
          call, relay_error("BoxManagedProcessConflictError",
                            "managed process " + process_id + " already has an attacher"));
    }
  }
  AttachHooks hooks;
  {
    // The client offers a comma-separated list; LangBot offers "mcp".
    const std::string offered = header(call, "Sec-WebSocket-Protocol");
    std::size_t start = 0;
    for (;;) {
      std::size_t comma = offered.find(',', start);
      std::string one = py_strip(std::string_view(offered).substr(
          start, comma == std::string::npos ? std::string::npos : comma - start));
      if (one == "mcp") hooks.subprotocol = "mcp";
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  hooks.ignore_binary = true;
  std::string ns = place->ns;
  std::int64_t g = place->gen;
  hooks.opened = [st, ns, g](std::weak_ptr<WsSession> ws) {
    std::erase_if(st->relays, [](const LangbotRelay& r) { return r.ws.expired(); });
    st->relays.push_back({ns, g, std::move(ws)});
  };
  audit(ctx, "process.attach", caller, physical,
        nlohmann::ordered_json{{"pid", info->pid}, {"via", "langbot"}});
  co_return co_await attach_to_process(call, std::move(*box), physical, std::move(*info),
                                       std::move(hooks));
}

}  // namespace

std::vector<RouteSpec> langbot_routes() {
  using B = BodyKind;
  using R = RouteId;
  constexpr RouteKind W = RouteKind::kWebSocket;
  // needs_auth false: LangBot authenticates with its own headers (checked here), never a bearer
  // token.
  return {
      {R::kLangbotRpc, "GET", "/rpc/ws", B::kNone, false, rpc_ws, W},
      {R::kLangbotRelay, "GET", "/v1/sessions/{id}/managed-process/{process_id}/ws", B::kNone,
       false, relay, W},
      {R::kLangbotRelayLegacy, "GET", "/v1/sessions/{id}/managed-process/ws", B::kNone, false,
       relay, W},
  };
}

}  // namespace agentbox::server::detail
