// OutputRing: offsets across streams, resuming anywhere, the per-stream bound.
#include "sandbox/output_ring.h"

#include <gtest/gtest.h>

namespace agentbox::sandbox {
namespace {

std::string concat(const std::vector<OutputChunk>& v) {
  std::string s;
  for (const auto& c : v) s += c.data;
  return s;
}

TEST(OutputRingTest, OffsetsCountAllStreamsInArrivalOrder) {
  OutputRing r;
  r.append(OutputStream::kStdout, "abc");
  r.append(OutputStream::kStderr, "XY");
  r.append(OutputStream::kStdout, "de");
  auto all = r.read(0, 1 << 20);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].offset, 0u);
  EXPECT_EQ(all[0].data, "abc");
  EXPECT_EQ(all[1].stream, OutputStream::kStderr);
  EXPECT_EQ(all[1].offset, 3u);
  EXPECT_EQ(all[2].offset, 5u);
  EXPECT_EQ(r.total(), 7u);
  // Resuming inside a record cuts it; past the end there is nothing.
  auto mid = r.read(4, 1 << 20);
  ASSERT_EQ(mid.size(), 2u);
  EXPECT_EQ(mid[0].offset, 4u);
  EXPECT_EQ(mid[0].data, "Y");
  EXPECT_TRUE(r.read(7, 100).empty());
  EXPECT_TRUE(r.read(100, 100).empty());
}

TEST(OutputRingTest, ContiguousWritesOfOneStreamCoalesce) {
  OutputRing r;
  for (int i = 0; i < 1000; ++i) r.append(OutputStream::kPty, "x");
  auto all = r.read(0, 1 << 20);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].data.size(), 1000u);
}

TEST(OutputRingTest, KeepsAtLeastTheCapPerStreamAndNoMore) {
  OutputRing r(1000);
  std::string block(300, 'o');
  for (int i = 0; i < 50; ++i) {
    r.append(OutputStream::kStdout, block);
    r.append(OutputStream::kStderr, "e");  // interleaved: no coalescing
  }
  EXPECT_EQ(r.total(), 50u * 301);
  // stdout keeps >= 1000 bytes (4 chunks of 300 = 1200), stderr all 50 of its 1-byte chunks.
  EXPECT_EQ(r.kept_bytes(), 1200u + 50u);
  auto from_start = r.read(0, 1 << 20);
  EXPECT_EQ(from_start.front().stream, OutputStream::kStderr);  // oldest kept is stderr's
  EXPECT_EQ(from_start.front().offset, r.oldest());
  // Bounded batches that resume where they stopped read every kept byte once.
  std::string pieces;
  std::uint64_t since = r.oldest();
  while (since < r.total()) {
    auto b = r.read(since, 250);
    ASSERT_FALSE(b.empty());
    EXPECT_LE(concat(b).size(), 250u);
    since = b.back().offset + b.back().data.size();
    pieces += concat(b);
  }
  EXPECT_EQ(pieces, concat(r.read(r.oldest(), 1 << 20)));
}

TEST(OutputRingTest, ChunkCountIsBoundedToo) {
  OutputRing r(1 << 30);
  for (std::size_t i = 0; i < OutputRing::kMaxChunks + 100; ++i) {
    r.append(OutputStream::kStdout, "a");
    r.append(OutputStream::kStderr, "b");
  }
  EXPECT_LE(r.kept_bytes(), 2 * (OutputRing::kMaxChunks + 1));
}

}  // namespace
}  // namespace agentbox::sandbox
