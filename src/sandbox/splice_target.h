#pragma once
// Zero-copy uploads (server/internal/upload_splice.h): a FileWriter that writes a local file of
// its own also implements this, and the upload route moves the request body into it with
// splice(2) instead of write(2). Found with dynamic_cast; a writer without it (a remote runner's)
// gets the bytes through write().

#include <cstddef>

#include "common/error.h"

namespace agentbox::sandbox {

class SpliceTarget {
 public:
  virtual ~SpliceTarget() = default;
  // As FileWriter::write() of the next `n` bytes, moved from the pipe `pipe_fd` (its read end,
  // holding at least `n` bytes): the same limit, the same errors. Blocking.
  virtual Status splice_from(int pipe_fd, std::size_t n) = 0;
};

}  // namespace agentbox::sandbox
