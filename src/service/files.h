#pragma once
// Files as operations (API.md "Files"; seed 001's /workspace/*; LangBot, E2B and MCP file
// calls): every path is resolved by the session's sandbox (openat2 inside the box), so the file
// API sees exactly what the box sees. Mutations emit one event each ("file.put", "file.delete",
// "file.mkdir", "file.rename") with the path and size, never the contents. Reads are not events.

#include <boost/asio/awaitable.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "sandbox/sandbox.h"
#include "service/deps.h"
#include "service/origin.h"
#include "service/sessions.h"

namespace agentbox::service {

// An upload in progress: bytes go to a temp file beside the target; commit() makes it the
// target at once (Files::commit). Dropped uncommitted, the target stays as it was.
struct Upload {
  Lease lease;
  std::string path;
  std::unique_ptr<sandbox::FileWriter> writer;
};

class Files {
 public:
  explicit Files(Deps deps) : d_(deps) {}

  // Every call takes session `id`'s box once (Sessions::lease; the session is resumed when
  // suspended, never created: file routes do not create).

  // The file for reading (sendfile from its fd). `streamed`: it may come back before the whole
  // file is there (a remote runner's download; sandbox.h open_file_streamed).
  asio::awaitable<Result<sandbox::FileReader>> open(Origin origin, std::string id, std::string path,
                                                    bool streamed);
  // The whole file, at most `max_bytes` (ETOOBIG past it).
  asio::awaitable<Result<std::string>> read(Origin origin, std::string id, std::string path,
                                            std::uint64_t max_bytes);
  // Up to `limit` bytes from `offset`, and the file's whole size.
  struct Part {
    std::string data;
    std::uint64_t size = 0;
  };
  asio::awaitable<Result<Part>> read_part(Origin origin, std::string id, std::string path,
                                          std::uint64_t offset, std::size_t limit);
  // Replaces `old_text` (non-empty) by `new_text` in a text file of at most `max_read` bytes:
  // EINVAL when it does not occur, or occurs more than once without `all`. Written back
  // atomically (emits "file.edit"). Returns how many it replaced.
  asio::awaitable<Result<std::size_t>> edit(Origin origin, std::string id, std::string path,
                                            std::string old_text, std::string new_text, bool all,
                                            std::size_t max_read, sandbox::WriteOptions opts);

  // An atomic upload into `path`: write chunks with Upload::writer->write (blocking: from the
  // pool), then commit().
  asio::awaitable<Result<Upload>> begin_upload(Origin origin, std::string id, std::string path,
                                               sandbox::WriteOptions opts);
  // Makes the upload the target; emits "file.put". Returns the size.
  asio::awaitable<Result<std::uint64_t>> commit(Origin origin, Upload* upload);
  // The whole-file write: begin, one write, commit.
  asio::awaitable<Result<std::uint64_t>> write(Origin origin, std::string id, std::string path,
                                               std::string data, sandbox::WriteOptions opts);

  asio::awaitable<Result<sandbox::FileInfo>> stat(Origin origin, std::string id, std::string path);
  asio::awaitable<Result<std::vector<sandbox::DirEntry>>> list(Origin origin, std::string id,
                                                               std::string path);
  asio::awaitable<Status> mkdir(Origin origin, std::string id, std::string path);
  // A file or an empty dir; with `recursive` a whole tree.
  asio::awaitable<Status> remove(Origin origin, std::string id, std::string path, bool recursive);
  asio::awaitable<Status> rename(Origin origin, std::string id, std::string from, std::string to);

 private:
  asio::awaitable<Result<Lease>> lease(const Origin& origin, std::string id);

  Deps d_;
};

}  // namespace agentbox::service
