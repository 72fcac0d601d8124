#include "dialects/e2b/gzip.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <optional>

namespace agentbox::server {
namespace {

constexpr std::size_t kOutChunk = 64u << 10;

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

struct Inflater::Z {
  z_stream s{};
  ~Z() { inflateEnd(&s); }
};

Result<std::unique_ptr<Inflater>> Inflater::make(std::string_view encoding,
                                                 std::uint64_t max_out) {
  std::string enc = lower(trim(encoding));
  int window_bits;
  if (enc == "gzip" || enc == "x-gzip") {
    window_bits = 16 + MAX_WBITS;
  } else if (enc == "deflate") {
    window_bits = MAX_WBITS;
  } else {
    return fail(Code::kNotSupported, "Content-Encoding '" + std::string(encoding) +
                                         "' is not supported (gzip and deflate are)");
  }
  auto z = std::make_unique<Z>();
  if (inflateInit2(&z->s, window_bits) != Z_OK) {
    return fail(Code::kInternal, "inflateInit2 failed");
  }
  return std::unique_ptr<Inflater>(new Inflater(std::move(z), max_out, enc));
}

Inflater::Inflater(std::unique_ptr<Z> z, std::uint64_t max_out, std::string encoding)
    : z_(std::move(z)), max_out_(max_out), encoding_(std::move(encoding)) {}

Inflater::~Inflater() = default;

Status Inflater::feed(std::string_view in, std::string* out) {
  if (failed_) return fail(Code::kInvalid, "malformed " + encoding_ + " request body");
  z_stream& s = z_->s;
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  s.avail_in = static_cast<uInt>(in.size());
  std::array<char, kOutChunk> buf;
  for (;;) {
    if (ended_) {
      if (s.avail_in == 0) break;
      if (encoding_ == "deflate") {
        failed_ = true;
        return fail(Code::kInvalid, "malformed deflate request body: data after its end");
      }
      // Another gzip member follows the one that ended.
      if (inflateReset(&s) != Z_OK) return fail(Code::kInternal, "inflateReset failed");
      ended_ = false;
    }
    s.next_out = reinterpret_cast<Bytef*>(buf.data());
    s.avail_out = static_cast<uInt>(buf.size());
    int rc = inflate(&s, Z_NO_FLUSH);
    std::size_t produced = buf.size() - s.avail_out;
    total_out_ += produced;
    if (total_out_ > max_out_) {
      failed_ = true;
      return fail(Code::kTooBig, "the " + encoding_ + " request body inflates to over " +
                                     std::to_string(max_out_) + " bytes");
    }
    out->append(buf.data(), produced);
    if (rc == Z_STREAM_END) {
      ended_ = true;
      continue;
    }
    if (rc == Z_BUF_ERROR) break;  // no progress possible: it needs more input
    if (rc != Z_OK) {
      failed_ = true;
      std::string why = s.msg ? std::string(s.msg) : "zlib error " + std::to_string(rc);
      return fail(Code::kInvalid, "malformed " + encoding_ + " request body: " + why);
    }
    if (s.avail_in == 0 && s.avail_out != 0) break;  // all taken, all given out
  }
  return {};
}

Status Inflater::finish() const {
  if (failed_) return fail(Code::kInvalid, "malformed " + encoding_ + " request body");
  if (!ended_) {
    return fail(Code::kInvalid, "the " + encoding_ + " request body is truncated (its "
                                    "compressed stream does not end)");
  }
  return {};
}

struct GzipDeflater::Z {
  z_stream s{};
  bool done = false;
  ~Z() { deflateEnd(&s); }
};

GzipDeflater::GzipDeflater(int level) : z_(std::make_unique<Z>()) {
  // 16 + MAX_WBITS: gzip framing.
  if (deflateInit2(&z_->s, level, Z_DEFLATED, 16 + MAX_WBITS, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    std::abort();  // only on out of memory or bad constants
  }
}

GzipDeflater::~GzipDeflater() = default;

void GzipDeflater::feed(std::string_view in, std::string* out) {
  z_stream& s = z_->s;
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  s.avail_in = static_cast<uInt>(in.size());
  std::array<char, kOutChunk> buf;
  do {
    s.next_out = reinterpret_cast<Bytef*>(buf.data());
    s.avail_out = static_cast<uInt>(buf.size());
    deflate(&s, Z_NO_FLUSH);
    out->append(buf.data(), buf.size() - s.avail_out);
  } while (s.avail_in > 0 || s.avail_out == 0);
}

void GzipDeflater::finish(std::string* out) {
  if (z_->done) return;
  z_stream& s = z_->s;
  s.next_in = nullptr;
  s.avail_in = 0;
  std::array<char, kOutChunk> buf;
  int rc;
  do {
    s.next_out = reinterpret_cast<Bytef*>(buf.data());
    s.avail_out = static_cast<uInt>(buf.size());
    rc = deflate(&s, Z_FINISH);
    out->append(buf.data(), buf.size() - s.avail_out);
  } while (rc == Z_OK);
  z_->done = true;
}

bool accepts_gzip(std::string_view header) {
  std::optional<bool> gzip;
  bool star = false;
  while (!header.empty()) {
    auto comma = header.find(',');
    std::string_view item = header.substr(0, comma);
    header = comma == std::string_view::npos ? std::string_view{} : header.substr(comma + 1);
    auto semi = item.find(';');
    std::string coding = lower(trim(item.substr(0, semi)));
    bool q_zero = false;
    if (semi != std::string_view::npos) {
      std::string params = lower(item.substr(semi + 1));
      auto q = params.find("q=");
      if (q != std::string::npos) {
        double v = std::strtod(params.c_str() + q + 2, nullptr);
        q_zero = v <= 0.0;
      }
    }
    if (coding == "gzip" || coding == "x-gzip") {
      gzip = !q_zero;
    } else if (coding == "*") {
      star = !q_zero;
    }
  }
  return gzip.value_or(star);
}

std::string gzip_compress(std::string_view in) {
  GzipDeflater d;
  std::string out;
  d.feed(in, &out);
  d.finish(&out);
  return out;
}

}  // namespace agentbox::server
