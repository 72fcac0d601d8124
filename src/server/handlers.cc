// Helpers every surface shares: replies, audit lines, request parameters, the session's
// sandbox. Beast-free.

#include "common/log.h"
#include "server/http_error.h"
#include "server/internal/context.h"

namespace agentbox::server::detail {

Reply json_reply(int status, const json& j) {
  Reply r;
  r.status = status;
  r.body = to_wire(j);
  return r;
}

Reply error_reply(const Error& e) {
  Reply r;
  r.status = http_status(e);
  r.body = error_body(e);
  return r;
}

Result<std::string> session_param(const Request& req) {
  auto it = req.params.find("id");
  if (it == req.params.end()) return fail(Code::kInternal, "route has no {id}");
  if (auto st = session::validate_id(it->second); !st) return std::unexpected(st.error());
  return it->second;
}

Result<std::string> required_query(const Request& req, const std::string& name) {
  auto it = req.query.find(name);
  if (it == req.query.end() || it->second.empty()) {
    return fail(Code::kInvalid, "query parameter '" + name + "' is required");
  }
  return it->second;
}

Result<bool> bool_query(const Request& req, const std::string& name) {
  auto it = req.query.find(name);
  if (it == req.query.end()) return false;
  const std::string& v = it->second;
  if (v == "true" || v == "1" || v.empty()) return true;
  if (v == "false" || v == "0") return false;
  return fail(Code::kInvalid, "query parameter '" + name + "' must be true or false");
}

asio::awaitable<Result<std::shared_ptr<sandbox::Sandbox>>> acquire_sandbox(Context* ctx,
                                                                           std::string id,
                                                                           bool create_if_missing,
                                                                           session::Caller caller) {
  // The one lease rule is service::Sessions::lease; this is its form for surfaces that hold the
  // sandbox themselves.
  auto lease = co_await ctx->svc->sessions.lease(service::Origin(caller, 0, service::Surface::kV1),
                                                 std::move(id), create_if_missing);
  if (!lease) co_return std::unexpected(lease.error());
  co_return std::move(lease->box);
}

Result<json> body_object(Request* req, bool allow_empty) {
  if (req->parsed) {
    Result<json> r = std::move(*req->parsed);
    req->parsed.reset();
    return r;
  }
  return parse_object(req->body, allow_empty);
}

Status empty_body(Request* req) {
  auto body = body_object(req, /*allow_empty=*/true);
  if (!body) return std::unexpected(body.error());
  return check_known_fields(*body, {});
}

}  // namespace agentbox::server::detail
