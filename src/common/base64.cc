#include "common/base64.h"

#include <array>
#include <cstdint>

namespace agentbox {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<std::int8_t, 256> make_table() {
  std::array<std::int8_t, 256> t{};
  for (auto& v : t) v = -1;
  for (int i = 0; i < 64; ++i)
    t[static_cast<unsigned char>(kAlphabet[i])] = static_cast<std::int8_t>(i);
  return t;
}
constexpr auto kTable = make_table();

}  // namespace

std::string base64_encode(std::string_view raw) {
  std::string out;
  out.resize(4 * ((raw.size() + 2) / 3));
  auto* in = reinterpret_cast<const unsigned char*>(raw.data());
  std::size_t i = 0, o = 0;
  for (; i + 3 <= raw.size(); i += 3) {
    std::uint32_t v = (in[i] << 16) | (in[i + 1] << 8) | in[i + 2];
    out[o++] = kAlphabet[(v >> 18) & 63];
    out[o++] = kAlphabet[(v >> 12) & 63];
    out[o++] = kAlphabet[(v >> 6) & 63];
    out[o++] = kAlphabet[v & 63];
  }
  if (std::size_t rest = raw.size() - i; rest > 0) {
    std::uint32_t v = in[i] << 16;
    if (rest == 2) v |= in[i + 1] << 8;
    out[o++] = kAlphabet[(v >> 18) & 63];
    out[o++] = kAlphabet[(v >> 12) & 63];
    out[o++] = rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out[o++] = '=';
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size() / 4 * 3);
  std::uint32_t quad[4];
  int n = 0;           // symbols in the current quantum
  int pad = 0;         // '=' seen in the current quantum
  bool ended = false;  // a padded quantum was completed: nothing may follow
  for (char c : text) {
    if (c == '\r' || c == '\n') continue;
    if (ended) return std::nullopt;
    if (c == '=') {
      if (n < 2) return std::nullopt;
      ++pad;
      quad[n++] = 0;
    } else {
      int v = kTable[static_cast<unsigned char>(c)];
      if (v < 0 || pad > 0) return std::nullopt;
      quad[n++] = static_cast<std::uint32_t>(v);
    }
    if (n == 4) {
      std::uint32_t v = (quad[0] << 18) | (quad[1] << 12) | (quad[2] << 6) | quad[3];
      out.push_back(static_cast<char>((v >> 16) & 0xff));
      if (pad < 2) out.push_back(static_cast<char>((v >> 8) & 0xff));
      if (pad < 1) out.push_back(static_cast<char>(v & 0xff));
      if (pad > 0) ended = true;
      n = 0;
      pad = 0;
    }
  }
  if (n != 0) return std::nullopt;
  return out;
}

}  // namespace agentbox
