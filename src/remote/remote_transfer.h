#pragma once
// The sending side of a chunked upload to a runner (docs/runner-protocol.md, versions 1 to 3):
// file_begin, then the bytes in chunks within the ack window, then file_end and the runner's
// `ok`. Versions 1-2 chunks are base64 file_chunk text frames; version 3 chunks are binary frames.
// Used by the remote backend (remote_backend.cc): version 1 sends a spooled file of known size,
// version 3 streams the upload as it arrives (file_begin's size kSizeUnknown).
//
// Pool threads only (write() and finish() block on the runner's acks). Destroying an unfinished
// upload aborts it: the runner drops its temp file and the target stays as it was.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/error.h"
#include "sandbox/sandbox.h"
#include "remote/runner_hub.h"

namespace agentbox::remote {

class ChunkUpload {
 public:
  // Sends file_begin {path: target, perm, size} and waits for the runner's ack of offset 0 (the
  // temp file is open). `size` may be proto::kSizeUnknown on a connection of version 3.
  static Result<std::unique_ptr<ChunkUpload>> start(const std::shared_ptr<RunnerConn>& conn,
                                                    const std::string& target,
                                                    std::uint32_t perm, std::int64_t size);
  // Sends `data` (any size) in chunks, waiting for acks to stay within the window. Bytes are
  // gathered to whole chunks first: small writes do not become small frames.
  Status write(std::string_view data);
  // Sends what is gathered and file_end {size: the bytes sent}; waits for `ok`.
  Result<std::uint64_t> finish();
  std::uint64_t sent() const { return static_cast<std::uint64_t>(sent_ + pending_.size()); }

 private:
  explicit ChunkUpload(std::shared_ptr<RunnerTransfer> t) : t_(std::move(t)) {}
  Status wait_ack();
  Status send(std::string_view chunk);
  std::shared_ptr<RunnerTransfer> t_;
  std::int64_t sent_ = 0;    // bytes sent in chunks
  std::int64_t acked_ = -1;  // -1: the runner has not opened the file yet
  std::string pending_;      // gathered, not yet a whole chunk
};

// The chunk in a file_chunk frame of the runner: base64 in the body (version 1) or the bytes of
// a binary frame (version 3, RunnerConn::on_binary), moved out of `f`.
Result<proto::FileChunk> chunk_of(RunnerReply& f);

// A download of version 3 served while it arrives: `begin` is the runner's file_begin on `t`.
// Returns a reader at once (an anonymous memory file and its feed, sandbox/file_feed.h); a
// thread of its own writes the chunks into the file, acks them once the reader is less than
// 32 MiB behind, and punches out what the reader has sent, so memory stays bounded whatever the
// file's size. The reader closing the feed early aborts the transfer (the runner stops).
Result<sandbox::FileReader> stream_download(std::shared_ptr<RunnerTransfer> t,
                                            const RunnerReply& begin);

}  // namespace agentbox::remote
