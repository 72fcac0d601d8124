#pragma once
// The kept output of one process (API.md "Processes and terminals"): every byte gets an offset,
// its position in the process's whole output (all streams in the order they came, from 0), and
// at least the last `cap` bytes of each stream are kept. A reader asks for "everything kept from
// offset N on" and gets the streams merged back in arrival order, so a follower that reconnects
// with since=N loses nothing still kept and sees nothing twice.
//
// Memory: per stream at most cap + one chunk of bytes, and at most kMaxChunks chunks (tiny
// interleaved writes are not coalesced across streams, so the chunk count is bounded on its own;
// in that pathological case fewer than `cap` bytes may be kept).
//
// Thread-compatible: the owner (ProcessTable) serialises access.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace agentbox::sandbox {

enum class OutputStream : std::uint8_t { kStdout = 0, kStderr = 1, kPty = 2 };

struct OutputChunk {
  OutputStream stream = OutputStream::kStdout;
  std::uint64_t offset = 0;  // position of data[0] in the process's whole output
  std::string data;
};

class OutputRing {
 public:
  static constexpr std::size_t kDefaultCap = std::size_t{1} << 20;  // per stream
  static constexpr std::size_t kMaxChunks = 16384;                  // per stream
  // Contiguous pieces of one stream are merged into chunks of up to this size.
  static constexpr std::size_t kCoalesceBytes = 64 * 1024;

  explicit OutputRing(std::size_t cap_per_stream = kDefaultCap) : cap_(cap_per_stream) {}

  // Appends `data` of `stream` at offset total(), then evicts that stream's oldest chunks while
  // at least cap bytes of it stay (or while it has more than kMaxChunks chunks).
  void append(OutputStream stream, std::string_view data);

  // Bytes ever appended (the offset the next byte gets).
  std::uint64_t total() const { return total_; }
  // The lowest offset still kept (total() when nothing is).
  std::uint64_t oldest() const;
  // Bytes kept, all streams (for tests and metrics).
  std::size_t kept_bytes() const;

  // What is kept from offset `since` on (a chunk straddling it is cut), streams merged by
  // offset, about `max_bytes` at most (at least one chunk piece when anything is there).
  // `since` older than oldest() starts at oldest(); past total() yields nothing.
  std::vector<OutputChunk> read(std::uint64_t since, std::size_t max_bytes) const;

 private:
  struct Stream {
    std::deque<OutputChunk> chunks;
    std::size_t bytes = 0;
  };
  Stream streams_[3];
  std::size_t cap_;
  std::uint64_t total_ = 0;
};

}  // namespace agentbox::sandbox
