#pragma once
// Text codecs of the wire layers: base64 with a named error (the MCP tools' base64 encoding,
// the E2B dialect's proto3 `bytes` fields, a move's spec header) and lower-case hex, for the ids
// and tokens the dialects mint.

#include <cstddef>
#include <string>
#include <string_view>

#include "common/base64.h"
#include "common/error.h"

namespace agentbox {

// base64_decode() with line breaks and spaces skipped; anything else that is not base64 is
// EINVAL "<what> is not valid base64".
Result<std::string> base64_decode(std::string_view in, std::string_view what);

std::string hex_encode(std::string_view in);
// `bytes` random bytes (getrandom), hex.
std::string random_hex(std::size_t bytes);

}  // namespace agentbox
