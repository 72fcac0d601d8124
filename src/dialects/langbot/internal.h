#pragma once
// What the files of LangBot's Box runtime share (langbot.cc has the protocol's overview):
// wire.cc       the envelope, Python's json.dumps, the error classes, tenancy and auth;
// box_spec.cc   BoxSpec and BoxManagedProcessSpec, validated as pydantic would, and their
//               mapping onto a session spec and back;
// actions.cc    the actions, each a call of service/ (Sessions, Exec, Processes);
// langbot.cc    the /rpc/ws connection (dispatch, the generation fence) and the relay.
// Everything here runs on the io_context thread.

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <expected>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "server/internal/context.h"
#include "server/internal/transport.h"
#include "service/origin.h"
#include "session/session_manager.h"

namespace agentbox::server {
class WsSession;  // server/websocket.h
}  // namespace agentbox::server

namespace agentbox::server::detail {

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

namespace langbot {

using ojson = nlohmann::ordered_json;

constexpr std::size_t kMaxInFlight = 128;         // actions per connection
constexpr std::size_t kMaxErrorText = 4096;       // then "... [protocol error truncated]"
constexpr std::size_t kExecOutputCap = 1u << 20;  // per stream, as the SDK's Docker backend
constexpr std::size_t kStderrPreview = 4000;
constexpr char kDefaultImage[] = "rockchin/langbot-sandbox:latest";
constexpr char kSpecLabel[] = "langbot.box";  // the session's BoxSpec fields, as JSON

// ---- errors: "<ExceptionClass>: <text>" (wire.cc)

struct LbError {
  std::string cls;  // BoxValidationError, BoxSessionNotFoundError, PermissionError, ...
  std::string text;
};
template <typename T>
using LbResult = std::expected<T, LbError>;

std::unexpected<LbError> lb_fail(std::string cls, std::string text);

// What an agentbox error means to LangBot's client, by what the call was about.
enum class About { kSession, kProcess };
LbError lb_error(const Error& e, About about);
// pydantic's "1 validation error for <model>\n<field>\n  <msg>".
LbError validation(std::string_view model, std::string_view field, std::string_view msg);
// No such session, in LangBot's words; and any error of a call on session `physical`.
LbError not_found(const std::string& physical);
LbError session_error(const Error& e, const std::string& physical);

// ---- the envelope (wire.cc)

// Python's json.dumps (separators ", " and ": ", non-ASCII escaped).
std::string py_dumps(const ojson& j);
// Python's str(): of a value, for conflict messages.
std::string py_str(const ojson& v);
// Python's str.strip(): ASCII whitespace and the separators \x1c-\x1f.
std::string py_strip(std::string_view s);
ojson reply_frame(const json& seq_id, int code, std::string message, ojson data);
std::string error_message(const LbError& e);

// ---- tenancy (wire.cc)

struct Placement {
  std::string instance;
  std::string workspace;
  std::int64_t gen = 1;
  std::string ns;      // ws-<24 hex>
  std::string prefix;  // ws-<24 hex>-g<gen>-
};

Placement make_placement(std::string instance, std::string workspace, std::int64_t gen);
// The physical id of a logical one (tenancy.namespace_session_id), checked as an agentbox id.
LbResult<std::string> physical_id(const Placement& p, const std::string& session_id);
std::string logical_id(const Placement& p, const std::string& physical);
// The generation in a physical id of namespace `ns` (ws-<24>-g<N>-...), or -1.
std::int64_t generation_of(const std::string& ns, const std::string& id);
// ActionContext: instance_uuid, workspace_uuid (stripped, non-empty), placement_generation
// (int >= 1, default 1), installation_uuid; nothing else. Its instance must be the bound one.
LbResult<Placement> decode_context(const json& c, const std::string& bound);

// ---- auth (wire.cc)

LangbotState* lb_state(Context* ctx);
session::Caller langbot_caller(const Context* ctx);
std::string header(const Call* call, std::string_view name);
// The instance header and the control token (security.py).
bool authenticated(const Call* call, std::string* instance);
Reply unauthorized();

// ---- BoxSpec and BoxManagedProcessSpec (box_spec.cc)

struct BoxSpec {
  std::string cmd;
  std::string workdir;
  std::int64_t timeout_sec = 30;
  std::map<std::string, std::string> env;
  std::string session_id;
  ojson shape = ojson::object();  // the session's fields, in the model's order
};

LbResult<BoxSpec> decode_box_spec(const json& data, bool need_cmd);
// The spec of the session that holds `shape` (a BoxSpec's fields, kept in its labels).
LbResult<session::SessionSpec> session_spec(const ojson& shape);
// The BoxSpec fields a session was made with (from its labels).
ojson stored_shape(const session::SessionInfo& s);
// BoxSessionInfo of session `s`.
ojson session_info(const Placement& p, const session::SessionInfo& s);

struct ProcSpec {
  std::string process_id;
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::string cwd;
};

LbResult<std::string> process_id_of(const json& v);
LbResult<ProcSpec> decode_proc_spec(const json& v);

// ---- one action (actions.cc)

struct Act {
  Context* ctx = nullptr;
  LangbotState* st = nullptr;
  session::Caller caller;
  std::optional<Placement> place;  // tenant actions
  json data;
  std::string action;
  std::shared_ptr<LangbotAction> ctl;
  std::uint64_t id = 0;

  service::Origin origin() const { return service::Origin(caller, id, service::Surface::kLangbot); }
};

using ActResult = asio::awaitable<LbResult<ojson>>;
using ActFn = ActResult (*)(Act*);

struct ActionDef {
  std::string_view name;
  bool tenant;  // needs a Workspace context
  ActFn fn;
};

// The action named `name`, or nullptr.
const ActionDef* find_action(std::string_view name);

// The sessions of the caller whose ids start with `prefix` (and are longer).
asio::awaitable<Result<std::vector<session::SessionInfo>>> list_prefixed(Context* ctx,
                                                                         service::Origin origin,
                                                                         std::string prefix);

// ---- cluster mode (cluster.cc)

// The reply an action got on another node.
struct ThereReply {
  int code = 0;
  std::string message;
  ojson data = ojson::object();
};

// A tenant action naming a session (data.session_id) that another node holds, or that a
// box_exec or box_create_session places on another node, runs there: its reply; nullopt: run it
// here (no cluster, this node holds it, no session named). A down owner is an error reply naming
// it.
asio::awaitable<std::optional<ThereReply>> forward_action(Act* a, json context);

// box_get_sessions and box_status span the cluster: every other up node's answer to the same
// action is added to `result` (its sessions, its active_sessions).
asio::awaitable<void> add_peer_results(Act* a, json context, ojson* result);

}  // namespace langbot
}  // namespace agentbox::server::detail
