#include "server/base64.h"

#include <openssl/evp.h>
#include <sys/random.h>

#include <vector>

namespace agentbox::server {

std::string base64_encode(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

Result<std::string> base64_decode(std::string_view in, std::string_view what) {
  std::string s;
  for (char c : in) {
    if (c != '\n' && c != '\r' && c != ' ') s += c;
  }
  auto bad = [&] { return fail(Code::kInvalid, std::string(what) + " is not valid base64"); };
  if (s.size() % 4 != 0) return bad();
  std::string out(s.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(s.data()),
                          static_cast<int>(s.size()));
  if (n < 0) return bad();
  // EVP_DecodeBlock counts the padding as zero bytes.
  std::size_t pad = s.empty() ? 0 : (s.back() == '=') + (s.size() > 1 && s[s.size() - 2] == '=');
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
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

}  // namespace agentbox::server
