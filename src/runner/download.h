#pragma once
// download_file (PROTOCOLS.md 1.3): GET an http:// or https:// URL into the workspace, as xbot's
// runner does: 5 minutes, 100 MiB at most, parent directories created, up to 10 redirects. The
// file appears atomically (temp file + rename) and only when the whole body came with a 2xx.

#include <boost/asio/ssl/context.hpp>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "runner/workspace_fs.h"

namespace agentbox::runner {

inline constexpr std::int64_t kMaxDownloadBytes = 100 << 20;

// The size written. `tls` verifies https peers (system CAs plus --ca).
Result<std::int64_t> download_file(const std::string& url, const WorkspaceFs& fs,
                                   const std::string& output_path, boost::asio::ssl::context& tls);

}  // namespace agentbox::runner
