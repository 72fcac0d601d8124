#pragma once
// A streaming multipart/form-data parser (RFC 7578 over RFC 2046): what the E2B SDKs upload files
// with (E2B-MCP.md 3.4). Bytes go in as they arrive, in pieces of any size; parts come out as
// events (a part's head, its body in pieces, its end), so a big upload never sits in memory.
// Everything the sender controls is bounded: a part's header block, the number of parts, the
// preamble. Bad input is an EINVAL (ETOOBIG for the bounds) whose message names the fault; after
// an error the parser is spent.
//
// Threading: a parser is a plain value, used by one thread at a time.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace agentbox::server {

struct MultipartLimits {
  std::size_t max_header_bytes = 16u << 10;  // one part's header block
  std::size_t max_parts = 1000;
  std::size_t max_preamble_bytes = 64u << 10;
};

// What a part's headers say.
struct MultipartHead {
  std::string name;                     // Content-Disposition name="..."
  std::optional<std::string> filename;  // filename*=UTF-8''... (decoded) else filename="..."
  std::string content_type;             // "" when absent
};

struct MultipartEvent {
  enum class Kind { kBegin, kData, kEnd };
  Kind kind = Kind::kBegin;
  MultipartHead head;  // kBegin only
  std::string data;    // kData only: the next bytes of the part's body
};

class MultipartParser {
 public:
  // The boundary parameter of a Content-Type value ("multipart/form-data; boundary=xyz"). EINVAL
  // when the type is not multipart/form-data or the boundary is missing or malformed (RFC 2046:
  // 1 to 70 characters).
  [[nodiscard]] static Result<std::string> boundary_of(std::string_view content_type);

  explicit MultipartParser(std::string boundary, MultipartLimits limits = {});

  // Parses the next bytes of the body, appending what they complete to *out. Body bytes of a
  // part are held back only as long as they could be the start of its closing delimiter.
  [[nodiscard]] Status feed(std::string_view bytes, std::vector<MultipartEvent>* out);
  // The body has ended: EINVAL unless the closing delimiter ("--boundary--") was seen.
  [[nodiscard]] Status finish() const;
  // The closing delimiter has been seen (anything after it, the epilogue, is ignored).
  bool done() const { return state_ == State::kDone; }

 private:
  enum class State { kPreamble, kAfterDelimiter, kHeaders, kBody, kDone, kFailed };

  Status fail_with(Code code, std::string message);
  Status parse_headers(std::string_view block, MultipartHead* head);

  std::string delimiter_;  // "\r\n--" + boundary
  MultipartLimits limits_;
  State state_ = State::kPreamble;
  std::string buf_;  // bytes not yet consumed
  std::size_t preamble_seen_ = 0;
  std::size_t parts_ = 0;
  std::string error_;
};

}  // namespace agentbox::server
