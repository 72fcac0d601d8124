// Fuzz harness: multipart/form-data upload bodies of the E2B files surface
// (dialects/e2b/multipart.h). The first line is the Content-Type, the rest the body; the body is
// fed in pieces whose sizes come from the input's first byte (a parser must not care how TCP
// splits the bytes), and each part's bytes are checked to be those of a one-piece feed.

#include "dialects/e2b/multipart.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

using namespace agentbox::server;

namespace {
// The parts (name + body) of `body`, fed `step` bytes at a time (0: in one piece).
struct Outcome {
  bool ok = true;
  std::vector<std::string> parts;
};
Outcome run(const std::string& boundary, std::string_view body, std::size_t step) {
  MultipartLimits limits;
  limits.max_parts = 64;
  limits.max_header_bytes = 4096;
  limits.max_preamble_bytes = 4096;
  MultipartParser p(boundary, limits);
  Outcome o;
  std::vector<MultipartEvent> events;
  std::size_t at = 0;
  while (at < body.size()) {
    std::size_t n = step == 0 ? body.size() - at : std::min(step, body.size() - at);
    if (!p.feed(body.substr(at, n), &events)) {
      o.ok = false;
      break;
    }
    at += n;
  }
  if (o.ok && !p.finish()) o.ok = false;
  for (auto& e : events) {
    if (e.kind == MultipartEvent::Kind::kBegin) o.parts.push_back(e.head.name + "\n");
    if (e.kind == MultipartEvent::Kind::kData && !o.parts.empty()) o.parts.back() += e.data;
  }
  return o;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::size_t step = data[0] % 17;
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  auto nl = in.find('\n');
  if (nl == std::string_view::npos) return 0;
  auto boundary = MultipartParser::boundary_of(in.substr(0, nl));
  if (!boundary) return 0;
  std::string_view body = in.substr(nl + 1);
  Outcome whole = run(*boundary, body, 0);
  Outcome pieces = run(*boundary, body, step);
  // The same bytes split otherwise must give the same verdict and the same parts.
  if (whole.ok != pieces.ok || (whole.ok && whole.parts != pieces.parts)) std::abort();
  return 0;
}
