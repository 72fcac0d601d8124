#pragma once
// A file whose bytes are still arriving while it is read (Sandbox::open_file_streamed: a remote
// runner's download, docs/runner-protocol.md): the producer writes into the FileReader's fd and
// says how far it got; the reader waits for bytes before it sends them and says how far it sent,
// so the producer can drop what is sent (its memory stays bounded by `room`, not by the file).
// Thread-safe; the waits block (pool threads, the producer's thread).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>

#include "common/error.h"

namespace agentbox::sandbox {

class FileFeed {
 public:
  // ---- the producer ----
  // Bytes [0, n) are in the fd.
  void arrived(std::uint64_t n) {
    std::lock_guard l(mu_);
    arrived_ = n;
    cv_.notify_all();
  }
  // The transfer failed: the reader stops with `e`.
  void fail(Error e) {
    std::lock_guard l(mu_);
    if (!error_) error_ = std::move(e);
    cv_.notify_all();
  }
  // Waits until fewer than `room` bytes are arrived but not consumed, the reader is gone, or
  // `timeout` passes. false: stop (the reader is gone or too slow).
  bool wait_room(std::uint64_t room, std::chrono::milliseconds timeout) {
    std::unique_lock l(mu_);
    return cv_.wait_for(l, timeout, [&] { return closed_ || arrived_ - consumed_ < room; }) &&
           !closed_;
  }
  // Bytes before this are sent: the producer may drop them.
  std::uint64_t consumed() const {
    std::lock_guard l(mu_);
    return consumed_;
  }
  bool closed() const {
    std::lock_guard l(mu_);
    return closed_;
  }

  // ---- the reader ----
  // Waits until more than `offset` bytes are there; returns how many are (or the producer's
  // error; ETIMEDOUT after `timeout`).
  Result<std::uint64_t> wait_beyond(std::uint64_t offset, std::chrono::milliseconds timeout) {
    std::unique_lock l(mu_);
    if (!cv_.wait_for(l, timeout, [&] { return error_ || arrived_ > offset; })) {
      return fail_timeout();
    }
    if (arrived_ > offset) return arrived_;
    return std::unexpected(*error_);
  }
  void consume(std::uint64_t offset) {
    std::lock_guard l(mu_);
    if (offset > consumed_) consumed_ = offset;
    cv_.notify_all();
  }
  // The reader is done (or gone): the producer stops.
  void close() {
    std::lock_guard l(mu_);
    closed_ = true;
    cv_.notify_all();
  }

 private:
  static Result<std::uint64_t> fail_timeout() {
    return agentbox::fail(Code::kTimedOut, "the file's bytes did not arrive in time");
  }
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t arrived_ = 0, consumed_ = 0;
  std::optional<Error> error_;
  bool closed_ = false;
};

}  // namespace agentbox::sandbox
