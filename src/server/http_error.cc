#include "server/http_error.h"

#include <nlohmann/json.hpp>

namespace agentbox::server {

int http_status(const Error& e) {
  switch (e.code) {
    case Code::kInvalid: return 400;
    case Code::kUnauthorized: return 401;
    case Code::kAccess: return 403;
    case Code::kNotFound: return 404;
    case Code::kExists:
    case Code::kNotDir:
    case Code::kIsDir:
    case Code::kNotEmpty:
      return 409;
    case Code::kTooBig: return 413;
    case Code::kQuota: return 429;
    case Code::kTimedOut: return 504;
    case Code::kUnavailable: return 503;
    case Code::kInternal: return 500;
    case Code::kNotSupported: return 501;
    case Code::kImage: return 422;
    case Code::kUpstream: return 502;
  }
  return 500;
}

std::string error_body(const Error& e) {
  nlohmann::json j = {{"error", {{"code", code_name(e.code)}, {"message", e.message}}}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Error not_implemented(std::string_view what) {
  return Error::make(Code::kNotSupported,
                     std::string(what) + ": not implemented in this version");
}

}  // namespace agentbox::server
