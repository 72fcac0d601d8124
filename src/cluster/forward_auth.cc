#include "cluster/forward_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <map>
#include <stdexcept>

namespace agentbox::cluster {
namespace {

std::string hex(const unsigned char* p, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(n * 2);
  for (std::size_t i = 0; i < n; ++i) {
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 0xf];
  }
  return out;
}

std::string mac(std::string_view secret, std::string_view method, std::string_view target,
                std::string_view caller, std::string_view tenant, std::int64_t ts) {
  std::string msg;
  msg.append(method).append("\n").append(target).append("\n").append(caller).append("\n");
  msg.append(tenant).append("\n").append(std::to_string(ts));
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len);
  return hex(out, len);
}

Error unauthorized(std::string why) {
  return Error::make(Code::kUnauthorized, "forwarded request refused: " + std::move(why));
}

}  // namespace

std::string sign_forward(std::string_view secret, std::string_view method, std::string_view target,
                         std::string_view caller, std::string_view tenant, std::int64_t now) {
  return "caller=" + std::string(caller) + ";tenant=" + std::string(tenant) +
         ";ts=" + std::to_string(now) + ";sig=" + mac(secret, method, target, caller, tenant, now);
}

Result<Forwarded> verify_forward(std::string_view secret, std::string_view header,
                                 std::string_view method, std::string_view target,
                                 std::int64_t now) {
  if (secret.empty()) return std::unexpected(unauthorized("this node is not in a cluster"));
  std::map<std::string, std::string> parts;
  while (!header.empty()) {
    auto semi = header.find(';');
    std::string_view part = header.substr(0, semi);
    header = semi == std::string_view::npos ? std::string_view{} : header.substr(semi + 1);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    auto eq = part.find('=');
    if (eq == std::string_view::npos) return std::unexpected(unauthorized("malformed header"));
    parts.emplace(std::string(part.substr(0, eq)), std::string(part.substr(eq + 1)));
  }
  for (const char* k : {"caller", "tenant", "ts", "sig"}) {
    if (!parts.contains(k)) {
      return std::unexpected(unauthorized(std::string("the header has no '") + k + "'"));
    }
  }
  std::int64_t ts = 0;
  try {
    std::size_t used = 0;
    ts = std::stoll(parts["ts"], &used);
    if (used != parts["ts"].size()) throw std::invalid_argument("ts");
  } catch (...) {
    return std::unexpected(unauthorized("'ts' is not a number"));
  }
  std::string want = mac(secret, method, target, parts["caller"], parts["tenant"], ts);
  const std::string& got = parts["sig"];
  // SECURITY: constant-time comparison of the signature.
  if (got.size() != want.size() || CRYPTO_memcmp(got.data(), want.data(), want.size()) != 0) {
    return std::unexpected(unauthorized("bad signature"));
  }
  if (ts < now - kForwardSkewSec || ts > now + kForwardSkewSec) {
    return std::unexpected(
        unauthorized("signed " + std::to_string(now - ts) + " s from now (allowed: +-60 s)"));
  }
  return Forwarded{parts["caller"], parts["tenant"], ts};
}

std::string sha256_hex(std::string_view data) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out);
  return hex(out, sizeof out);
}

}  // namespace agentbox::cluster
