#pragma once
// Standard base64 (RFC 4648, with padding; common/base64.h does the work), for the dialects that carry bytes in JSON: the MCP
// tools' base64 encoding and the E2B dialect's proto3 `bytes` fields; and lower-case hex, for
// the ids and tokens the dialects mint.

#include <string>
#include <string_view>

#include "common/error.h"

namespace agentbox::server {

std::string base64_encode(std::string_view in);
// Line breaks and spaces are skipped; anything else that is not base64 is EINVAL
// "<what> is not valid base64".
Result<std::string> base64_decode(std::string_view in, std::string_view what);

std::string hex_encode(std::string_view in);
// `bytes` random bytes (getrandom), hex.
std::string random_hex(std::size_t bytes);

}  // namespace agentbox::server
