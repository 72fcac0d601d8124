#pragma once
// The one place where an error Code becomes an HTTP status and a wire body (API.md "General").

#include <string>
#include <string_view>

#include "common/error.h"

namespace agentbox::server {

// The HTTP status for an error: EINVAL 400, EUNAUTHORIZED 401, EACCES 403, ENOENT 404,
// EEXIST/ENOTDIR/EISDIR/ENOTEMPTY 409, ETOOBIG 413, EQUOTA 429, EINTERNAL 500, EUNAVAILABLE 503,
// ETIMEDOUT 504. A feature this version does not have (not_implemented()) is 422 EINVAL.
int http_status(const Error& e);

// {"error":{"code":"ENOENT","message":"..."}}; invalid UTF-8 in the message is replaced.
std::string error_body(const Error& e);

// An EINVAL error for a route or option this version does not implement yet (answered 422).
Error not_implemented(std::string_view what);

}  // namespace agentbox::server
