#include "sandbox/output_ring.h"

#include <algorithm>

namespace agentbox::sandbox {

void OutputRing::append(OutputStream stream, std::string_view data) {
  if (data.empty()) return;
  Stream& s = streams_[static_cast<int>(stream)];
  const std::uint64_t at = total_;
  total_ += data.size();
  s.bytes += data.size();
  if (!s.chunks.empty()) {
    OutputChunk& last = s.chunks.back();
    // Only when nothing of another stream came in between: offsets stay contiguous in a chunk.
    if (last.offset + last.data.size() == at && last.data.size() + data.size() <= kCoalesceBytes) {
      last.data.append(data);
      data = {};
    }
  }
  if (!data.empty()) s.chunks.push_back(OutputChunk{stream, at, std::string(data)});
  while (s.chunks.size() > 1 &&
         (s.bytes - s.chunks.front().data.size() >= cap_ || s.chunks.size() > kMaxChunks)) {
    s.bytes -= s.chunks.front().data.size();
    s.chunks.pop_front();
  }
}

std::uint64_t OutputRing::oldest() const {
  std::uint64_t o = total_;
  for (const Stream& s : streams_) {
    if (!s.chunks.empty()) o = std::min(o, s.chunks.front().offset);
  }
  return o;
}

std::size_t OutputRing::kept_bytes() const {
  std::size_t n = 0;
  for (const Stream& s : streams_) n += s.bytes;
  return n;
}

std::vector<OutputChunk> OutputRing::read(std::uint64_t since, std::size_t max_bytes) const {
  std::vector<OutputChunk> out;
  // Per stream: the first chunk that ends after `since` (chunks are sorted by offset).
  std::size_t pos[3];
  for (int i = 0; i < 3; ++i) {
    const auto& c = streams_[i].chunks;
    auto it = std::partition_point(c.begin(), c.end(), [since](const OutputChunk& ch) {
      return ch.offset + ch.data.size() <= since;
    });
    pos[i] = static_cast<std::size_t>(it - c.begin());
  }
  std::size_t taken = 0;
  for (;;) {
    int best = -1;
    for (int i = 0; i < 3; ++i) {
      const auto& c = streams_[i].chunks;
      if (pos[i] >= c.size()) continue;
      if (best < 0 || c[pos[i]].offset < streams_[best].chunks[pos[best]].offset) best = i;
    }
    if (best < 0) break;
    const OutputChunk& ch = streams_[best].chunks[pos[best]++];
    std::size_t skip = since > ch.offset ? static_cast<std::size_t>(since - ch.offset) : 0;
    std::size_t n = ch.data.size() - skip;
    if (!out.empty() && taken + n > max_bytes) {
      // Cut to fit, so one batch stays about max_bytes; the rest comes with the next read.
      if (taken >= max_bytes) break;
      n = max_bytes - taken;
    } else if (out.empty() && n > max_bytes && max_bytes > 0) {
      n = max_bytes;
    }
    out.push_back(OutputChunk{ch.stream, ch.offset + skip, ch.data.substr(skip, n)});
    taken += n;
    if (taken >= max_bytes) break;
  }
  return out;
}

}  // namespace agentbox::sandbox
