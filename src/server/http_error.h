#pragma once
// The one place where an error Code becomes an HTTP status and a wire body (API.md "General").

#include <string>
#include <string_view>

#include "common/error.h"

namespace agentbox::server {

// The HTTP status for an error: EINVAL 400, EUNAUTHORIZED 401, EACCES 403, ENOENT 404,
// EEXIST/ENOTDIR/EISDIR/ENOTEMPTY 409, ETOOBIG 413, EQUOTA 429, EINTERNAL 500, EUNAVAILABLE 503,
// ETIMEDOUT 504, ENOTSUP 501 (a field, value or route this version does not implement).
int http_status(const Error& e);

// {"error":{"code":"ENOENT","message":"..."}}; invalid UTF-8 in the message is replaced.
std::string error_body(const Error& e);

// An ENOTSUP error (501) for a route, field or value this version does not implement yet;
// `what` names it ("network.mode \"allowlist\"", "template", "repair").
Error not_implemented(std::string_view what);

}  // namespace agentbox::server
