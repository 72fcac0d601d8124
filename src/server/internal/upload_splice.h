#pragma once
// PUT /v1/sessions/{id}/files with a Content-Length body into a writer that can splice
// (sandbox::SpliceTarget: a local file): the body goes socket -> pipe -> file with
// splice(2), never through user space (what arrived with the request head is written first as
// bytes). Two pipes: while the worker pool moves one into the file, the other fills from the
// socket. The writer starts the file's writeback as it goes, so the one fsync at commit finds
// most of it on disk.

#include <boost/asio/awaitable.hpp>
#include <string>

#include "sandbox/sandbox.h"
#include "sandbox/splice_target.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {

struct SpliceUpload {
  Status status;             // a write failed (the writer has dropped its temp file)
  bool client_gone = false;  // the body stopped short (disconnect, timeout): send nothing
  std::string gone_reason;
};

// Reads the rest of `body` (started with start_body, no chunked parser) into `writer`, whose
// SpliceTarget side is `target`.
asio::awaitable<SpliceUpload> splice_upload(Call* call, BodyReader* body,
                                            sandbox::FileWriter* writer,
                                            sandbox::SpliceTarget* target);

}  // namespace agentbox::server::detail
