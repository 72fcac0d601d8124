// Fuzz harness: gzip / deflate request bodies (dialects/e2b/gzip.h Inflater), as the E2B files
// surface inflates a body sent with Content-Encoding: gzip. The first byte picks the encoding
// and how the body is split; the output cap is small so a bomb hits ETOOBIG.

#include "dialects/e2b/gzip.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

using namespace agentbox::server;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const char* encodings[] = {"gzip", "x-gzip", "deflate", "br"};
  std::string_view enc = encodings[data[0] & 3];
  std::size_t step = (data[0] >> 2) + 1;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  constexpr std::uint64_t kCap = 1u << 20;
  auto inf = Inflater::make(enc, kCap);
  if (!inf) return 0;
  std::string out;
  bool ok = true;
  for (std::size_t at = 0; at < body.size(); at += step) {
    if (!(*inf)->feed(body.substr(at, step), &out)) {
      ok = false;
      break;
    }
    if (out.size() > kCap) std::abort();  // the cap is the daemon's memory bound
  }
  if (ok) (void)(*inf)->finish();
  // What inflates must deflate and inflate back to itself.
  if (ok && !out.empty() && out.size() < 4096) {
    std::string again = gzip_compress(out);
    auto back = Inflater::make("gzip", kCap);
    std::string round;
    if (!back || !(*back)->feed(again, &round) || !(*back)->finish() || round != out) std::abort();
  }
  (void)accepts_gzip(body.substr(0, 64));
  return 0;
}
