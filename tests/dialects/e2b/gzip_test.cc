// dialects/e2b/gzip.h: gzip request bodies inflated in pieces (with a cap against bombs), replies
// deflated so that a stock gunzip reads them, and Accept-Encoding read as clients send it.

#include "dialects/e2b/gzip.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <random>
#include <string>

namespace agentbox::server {
namespace {

std::string random_bytes(std::size_t n) {
  std::mt19937 rng(42);
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

// zlib's own one-shot deflate with zlib (not gzip) framing: the "deflate" coding.
std::string zlib_compress(const std::string& in) {
  uLongf n = compressBound(in.size());
  std::string out(n, '\0');
  EXPECT_EQ(compress(reinterpret_cast<Bytef*>(out.data()), &n,
                     reinterpret_cast<const Bytef*>(in.data()), in.size()),
            Z_OK);
  out.resize(n);
  return out;
}

Result<std::string> inflate_all(std::string_view enc, const std::string& in, std::size_t step,
                                std::uint64_t cap = 1u << 30) {
  auto inf = Inflater::make(enc, cap);
  if (!inf) return std::unexpected(inf.error());
  std::string out;
  for (std::size_t i = 0; i < in.size(); i += step) {
    if (auto s = (*inf)->feed(std::string_view(in).substr(i, step), &out); !s) {
      return std::unexpected(s.error());
    }
  }
  if (auto s = (*inf)->finish(); !s) return std::unexpected(s.error());
  return out;
}

TEST(E2bFilesGzip, RoundTripsInAnyPieceSize) {
  std::string text(200000, 'a');
  std::string noise = random_bytes(150000);
  for (const std::string* data : {&text, &noise}) {
    std::string gz = gzip_compress(*data);
    for (std::size_t step : {1ul, 13ul, 4096ul, gz.size()}) {
      auto back = inflate_all("gzip", gz, step);
      ASSERT_TRUE(back) << back.error().message;
      EXPECT_EQ(*back, *data);
    }
  }
  EXPECT_LT(gzip_compress(text).size(), text.size() / 50);
  auto deflated = inflate_all("Deflate", zlib_compress("zlib framing"), 3);
  ASSERT_TRUE(deflated) << deflated.error().message;
  EXPECT_EQ(*deflated, "zlib framing");
  auto empty = inflate_all("gzip", gzip_compress(""), 1);
  ASSERT_TRUE(empty);
  EXPECT_EQ(*empty, "");
}

TEST(E2bFilesGzip, ConcatenatedMembersAreOneStream) {
  auto back = inflate_all("x-gzip", gzip_compress("one ") + gzip_compress("two"), 5);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, "one two");
}

TEST(E2bFilesGzip, StreamingDeflaterOutputIsGzip) {
  GzipDeflater d;
  std::string out;
  std::string want;
  for (int i = 0; i < 100; ++i) {
    std::string piece = "line " + std::to_string(i) + "\n";
    want += piece;
    d.feed(piece, &out);
  }
  d.finish(&out);
  ASSERT_GE(out.size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>(out[0]), 0x1f);  // gzip magic
  EXPECT_EQ(static_cast<unsigned char>(out[1]), 0x8b);
  auto back = inflate_all("gzip", out, 7);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, want);
}

TEST(E2bFilesGzip, BadInputIsRefusedByName) {
  auto unknown = Inflater::make("br", 100);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, Code::kNotSupported);
  EXPECT_NE(unknown.error().message.find("'br'"), std::string::npos);

  auto garbage = inflate_all("gzip", "this is not gzip at all", 4);
  ASSERT_FALSE(garbage);
  EXPECT_EQ(garbage.error().code, Code::kInvalid);
  EXPECT_NE(garbage.error().message.find("malformed gzip"), std::string::npos);

  std::string gz = gzip_compress(std::string(5000, 'q'));
  auto truncated = inflate_all("gzip", gz.substr(0, gz.size() - 6), 100);
  ASSERT_FALSE(truncated);
  EXPECT_NE(truncated.error().message.find("truncated"), std::string::npos);

  auto trailing = inflate_all("deflate", zlib_compress("x") + "junk", 100);
  ASSERT_FALSE(trailing);
  EXPECT_NE(trailing.error().message.find("after its end"), std::string::npos);
}

TEST(E2bFilesGzip, ABombStopsAtTheCap) {
  std::string bomb = gzip_compress(std::string(10u << 20, '\0'));  // 10 MiB in ~10 KiB
  auto r = inflate_all("gzip", bomb, 1024, 1u << 20);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kTooBig);
  EXPECT_NE(r.error().message.find("over 1048576 bytes"), std::string::npos);
}

TEST(E2bFilesGzip, AcceptEncodingIsReadAsClientsSendIt) {
  EXPECT_TRUE(accepts_gzip("gzip, deflate"));  // undici's default
  EXPECT_TRUE(accepts_gzip("br;q=1.0, GZIP;q=0.5"));
  EXPECT_TRUE(accepts_gzip("*"));
  EXPECT_FALSE(accepts_gzip(""));
  EXPECT_FALSE(accepts_gzip("identity"));
  EXPECT_FALSE(accepts_gzip("deflate, br"));
  EXPECT_FALSE(accepts_gzip("gzip;q=0"));
  EXPECT_FALSE(accepts_gzip("*, gzip;q=0"));
}

}  // namespace
}  // namespace agentbox::server
