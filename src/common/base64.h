#pragma once
// Base64 as Go's encoding/base64 StdEncoding: the standard alphabet, padded. Decoding skips
// '\r' and '\n' (as Go does) and refuses anything else outside the alphabet, bad padding and a
// length that is not a multiple of 4. No OpenSSL: common/ links none.

#include <optional>
#include <string>
#include <string_view>

namespace agentbox {

std::string base64_encode(std::string_view raw);
// nullopt when `text` is not valid padded base64.
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace agentbox
