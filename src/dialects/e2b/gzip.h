#pragma once
// gzip over zlib for HTTP bodies: inflating a request body sent with Content-Encoding: gzip (or
// deflate), and deflating a reply for a client whose Accept-Encoding takes gzip. Both stream: the
// data passes through in pieces, so neither side ever holds a whole body. What an inflated body
// may grow to is capped (a small gzip bomb must not fill the disk or the memory).
//
// Threading: plain values, one thread at a time.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/error.h"

namespace agentbox::server {

class Inflater {
 public:
  // `encoding` is the Content-Encoding value: "gzip" (or "x-gzip") or "deflate" (zlib-wrapped);
  // anything else is ENOTSUP naming it. The output may total at most `max_out` bytes: past that
  // ETOOBIG.
  [[nodiscard]] static Result<std::unique_ptr<Inflater>> make(std::string_view encoding,
                                                              std::uint64_t max_out);
  ~Inflater();
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  // Inflates the next compressed bytes, appending the output to *out. Concatenated gzip members
  // are one stream (as gunzip reads them). Corrupt data is EINVAL naming zlib's complaint.
  [[nodiscard]] Status feed(std::string_view in, std::string* out);
  // The body has ended: EINVAL if the compressed stream is truncated.
  [[nodiscard]] Status finish() const;

 private:
  struct Z;
  explicit Inflater(std::unique_ptr<Z> z, std::uint64_t max_out, std::string encoding);
  std::unique_ptr<Z> z_;
  std::uint64_t max_out_;
  std::uint64_t total_out_ = 0;
  std::string encoding_;
  bool ended_ = false;  // the last member ended (more input starts another member)
  bool failed_ = false;
};

class GzipDeflater {
 public:
  // gzip framing; `level` is zlib's (1 fastest, 9 smallest; 6 is gzip(1)'s default).
  explicit GzipDeflater(int level = 6);
  ~GzipDeflater();
  GzipDeflater(const GzipDeflater&) = delete;
  GzipDeflater& operator=(const GzipDeflater&) = delete;

  // Compresses the next bytes, appending whatever output zlib has ready to *out.
  void feed(std::string_view in, std::string* out);
  // Flushes the rest and the gzip trailer into *out. The deflater is spent afterwards.
  void finish(std::string* out);

 private:
  struct Z;
  std::unique_ptr<Z> z_;
};

// Whether an Accept-Encoding header value accepts gzip (a "gzip" or "*" coding whose q is not 0).
bool accepts_gzip(std::string_view accept_encoding);

// One-shot helpers (tests and small bodies).
std::string gzip_compress(std::string_view in);

}  // namespace agentbox::server
