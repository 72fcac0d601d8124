#pragma once
// The node-to-node signature of a forwarded request (API.md "Cluster"):
//   X-Agentbox-Forwarded: caller=C;tenant=T;ts=UNIX;sig=HEX
// sig = hex(HMAC-SHA256(secret, METHOD "\n" TARGET "\n" C "\n" T "\n" UNIX)), TARGET being the
// request target (path and query). The owner accepts it only with a valid signature made within
// +-60 s of its own clock; anything else (missing parts, a forged or stale signature, a header
// a client sent on its own) is refused.

#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.h"

namespace agentbox::cluster {

inline constexpr char kForwardHeader[] = "X-Agentbox-Forwarded";
inline constexpr std::int64_t kForwardSkewSec = 60;

struct Forwarded {
  std::string caller;
  std::string tenant;
  std::int64_t ts = 0;
};

// The header's value for a request forwarded now (ts = `now`, unix seconds).
std::string sign_forward(std::string_view secret, std::string_view method, std::string_view target,
                         std::string_view caller, std::string_view tenant, std::int64_t now);

// The caller and tenant of a valid header; EUNAUTHORIZED naming what is wrong otherwise.
Result<Forwarded> verify_forward(std::string_view secret, std::string_view header,
                                 std::string_view method, std::string_view target,
                                 std::int64_t now);

// Hex SHA-256 (the config digest of GET /v1/cluster).
std::string sha256_hex(std::string_view data);

}  // namespace agentbox::cluster
