// LangBot's Box runtime, its wire (internal.h): the envelope as Python's json.dumps writes it, the
// error classes the client maps back from the message prefix, tenancy (physical ids, placements)
// and the runtime's own authentication.

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <string>

#include "dialects/langbot/internal.h"
#include "server/json_codec.h"

namespace agentbox::server::detail::langbot {
namespace {

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

// "ws-" + sha256(instance "\0" workspace)[:24]: the namespace of one Workspace.
std::string box_namespace(const std::string& instance, const std::string& workspace) {
  std::string key = instance;
  key += '\0';
  key += workspace;
  return "ws-" + sha256_hex(key).substr(0, 24);
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

}  // namespace

std::unexpected<LbError> lb_fail(std::string cls, std::string text) {
  return std::unexpected(LbError{std::move(cls), std::move(text)});
}

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
    case Code::kUnavailable:
    case Code::kUpstream: return {"BoxBackendUnavailableError", e.message};  // a registry too
    default: return {"BoxError", std::string(code_name(e.code)) + ": " + e.message};
  }
}

LbError validation(std::string_view model, std::string_view field, std::string_view msg) {
  return {"BoxValidationError", "1 validation error for " + std::string(model) + "\n" +
                                    std::string(field) + "\n  " + std::string(msg)};
}

LbError not_found(const std::string& physical) {
  return {"BoxSessionNotFoundError", "session " + physical + " not found"};
}

LbError session_error(const Error& e, const std::string& physical) {
  return e.code == Code::kNotFound ? not_found(physical) : lb_error(e, About::kSession);
}

std::string py_dumps(const ojson& j) {
  std::string s;
  py_dump(j, &s);
  return s;
}

std::string py_str(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  return py_dumps(v);
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

// Python's str.strip(): ASCII whitespace and the separators \x1c-\x1f.
std::string py_strip(std::string_view s) {
  auto ws = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return std::string(s);
}

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

// ---- auth

LangbotState* lb_state(Context* ctx) {
  if (!ctx->langbot) {
    ctx->langbot = std::make_shared<LangbotState>();
    ctx->langbot->bound = ctx->opts.langbot.trusted_instance;
  }
  return ctx->langbot.get();
}

session::Caller langbot_caller(const Context* ctx) {
  std::string name =
      ctx->opts.langbot.tenant.empty() ? std::string(kDefaultTenant) : ctx->opts.langbot.tenant;
  for (const TenantConfig& t : ctx->opts.tenants) {
    if (t.name == name) return session::Caller(name, false, t.max_sessions);
  }
  return session::Caller(name, false, 0);
}

std::string header(const Call* call, std::string_view name) {
  const auto& h = call->hp->get();
  auto it = h.find(name);
  return it == h.end() ? std::string() : std::string(it->value());
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

}  // namespace agentbox::server::detail::langbot
