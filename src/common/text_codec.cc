#include "common/text_codec.h"

#include <sys/random.h>

namespace agentbox {

Result<std::string> base64_decode(std::string_view in, std::string_view what) {
  std::string s;
  for (char c : in) {
    if (c != '\n' && c != '\r' && c != ' ') s += c;
  }
  auto out = base64_decode(s);
  if (!out) return fail(Code::kInvalid, std::string(what) + " is not valid base64");
  return std::move(*out);
}

std::string hex_encode(std::string_view in) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(in.size() * 2);
  for (char ch : in) {
    auto c = static_cast<unsigned char>(ch);
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
  return s;
}

std::string random_hex(std::size_t bytes) {
  std::string b(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(b.data() + got, bytes - got, 0);
    if (n > 0) got += static_cast<std::size_t>(n);
  }
  return hex_encode(b);
}

}  // namespace agentbox
