#pragma once
// 32-bit FNV hashes. FNV-1 multiplies, then xors each byte in (Go's hash/fnv.New32, the hash seed
// 001's toolbox-server uses for agent uids); FNV-1a xors, then multiplies (New32a).

#include <cstdint>
#include <string_view>

namespace agentbox {

inline constexpr std::uint32_t kFnv32Offset = 2166136261u;
inline constexpr std::uint32_t kFnv32Prime = 16777619u;

constexpr std::uint32_t fnv1_32(std::string_view s) {
  std::uint32_t h = kFnv32Offset;
  for (char c : s) {
    h *= kFnv32Prime;
    h ^= static_cast<unsigned char>(c);
  }
  return h;
}

constexpr std::uint32_t fnv1a_32(std::string_view s) {
  std::uint32_t h = kFnv32Offset;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= kFnv32Prime;
  }
  return h;
}

}  // namespace agentbox
