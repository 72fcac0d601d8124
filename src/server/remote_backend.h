#pragma once
// The `remote` backend (API.md "Runners"): a session's commands and files live on a user's
// machine, served by the runner registered for `BoxConfig::runner` (server/runner_hub.h) over
// xbot's runner protocol (shared/PROTOCOLS.md part 1).
//
// - The box is a binding, not a process: creating it needs the runner connected (EUNAVAILABLE
//   otherwise) and of the session's tenant (SECURITY.md T8: a runner of tenant A never serves a
//   session of tenant B). Every call looks the runner up again, so a runner that reconnects
//   serves its sessions again; while it is away calls fail with EUNAVAILABLE.
// - workspace() is the runner's reported workspace. API paths are confined to it here
//   (sandbox::workspace_relative, "/workspace/..." is an alias) before the runner's own guard.
// - exec -> `exec` (shell form, or argv form with args[0] the program); file reads and writes
//   are one base64 frame each (xbot's plain form), except with a runner of version 1 or 2
//   (docs/runner-protocol.md): a file over 4 MiB goes up as file_begin/file_chunk.../file_end
//   and comes down the same way into a scratch file, in 1 MiB chunks within the ack window, so
//   neither side holds the file (up to 500 MB). Version 1: base64 text chunks, 8 MiB window, the
//   upload spooled to a scratch file first; version 2: binary chunk frames, 16 MiB window, the
//   upload streamed to the runner as it arrives (server/remote_transfer.h). stat/read_dir/
//   mkdir_all/remove/remove_all map one to one, `mode` translated from Go's FileMode to st_mode;
//   error codes as proto::to_code(code, message) reads them (EISDIR/ENOTDIR/ENOTEMPTY exact).
// - Refused with ENOTSUP naming it: rename, artifact_dir, processes (the routes answer 501),
//   network policies, mounts.
// - Streaming exec delivers the output when the command ends (the protocol's exec has no
//   output pushes).

#include <memory>
#include <string>

#include "sandbox/sandbox.h"
#include "server/runner_hub.h"

namespace agentbox::server {

class RemoteBackend : public sandbox::Backend {
 public:
  explicit RemoteBackend(std::shared_ptr<RunnerHub> hub) : hub_(std::move(hub)) {}
  std::string_view name() const override { return "remote"; }
  bool isolated() const override { return false; }
  Status check_usable() override { return {}; }
  Result<std::unique_ptr<sandbox::Sandbox>> create(sandbox::BoxConfig config) override;

 private:
  std::shared_ptr<RunnerHub> hub_;
};

}  // namespace agentbox::server
