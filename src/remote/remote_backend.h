#pragma once
// The `remote` backend (API.md "Runners"): a session's commands and files live on a user's
// machine, served by the runner registered for `BoxConfig::runner` (remote/runner_hub.h) over
// xbot's runner protocol (shared/PROTOCOLS.md part 1).
//
// - The box is a binding, not a process: creating it needs the runner connected (EUNAVAILABLE
//   otherwise) and of the session's tenant (SECURITY.md T8: a runner of tenant A never serves a
//   session of tenant B). Every call looks the runner up again, so a runner that reconnects
//   serves its sessions again; while it is away calls fail with EUNAVAILABLE.
// - workspace() is the runner's reported workspace. API paths are confined to it here
//   (sandbox::workspace_relative, "/workspace/..." is an alias) before the runner's own guard.
// - exec, with a runner of version 2 (docs/runner-protocol.md "Process streams"): a stdio_start
//   stream run by the shared exec runner (remote/remote_processes.h): output streams as the
//   command prints, stdout and stderr apart, the exit last; a timeout or a client that leaves
//   kills the command's process group (stdio_signal). With xbot's runner (or a version 0/1 one):
//   `exec` (shell form, or argv form with args[0] the program), the output when it ends and no
//   kill when the client leaves (xbot's protocol has none for an exec).
// - processes (API.md "Processes"): the shared ProcessTable over version-2 streams (stdio_start
//   or pty_create; stdin, signals, resize, attach); the runner disconnecting ends them as
//   killed (signal 9: the runner kills its children on a disconnect). With a runner below
//   version 2, starting one is ENOTSUP (501) naming the version: xbot's stdio drops stderr and
//   ignores dir, its pty takes no input (PROTOCOLS.md 1.4, 1.7). Managed processes are
//   supervised by the daemon as on every backend: one that the runner's loss ended is started
//   again once the runner is back.
// - Files: reads and writes are one base64 frame each (xbot's plain form), except with a runner
//   of version 1 or more (docs/runner-protocol.md): a file over 4 MiB goes up as
//   file_begin/file_chunk.../file_end and comes down the same way, in 1 MiB chunks within the
//   ack window, so neither side holds the file (up to 500 MB). Versions 1 and 2: base64 text
//   chunks, 8 MiB window, the upload spooled to a scratch file first, the download received
//   whole into one; version 3: binary chunk frames, 16 MiB window, the upload streamed to the
//   runner as it arrives and a GET's download sent as it arrives (remote/remote_transfer.h).
//   stat/read_dir/mkdir_all/remove/remove_all map one to one, `mode` translated from Go's
//   FileMode to st_mode; error codes as proto::to_code(code, message) reads them
//   (EISDIR/ENOTDIR/ENOTEMPTY exact).
// - Limits (docs/runner-protocol.md "Limits"): a session asks only for limits its runner says
//   it enforces (register's `enforces`; none for xbot's runner), else ENOTSUP naming the field,
//   at create, on every later change (Backend::check_spec) and when the box starts; they go to
//   the runner with every exec/stdio_start/pty_create (`box`, `limits`). No daemon defaults.
// - Refused with ENOTSUP naming it: rename, artifact_dir, network other than "none" (at create
//   and on POST /network, running or suspended), mounts; processes on a runner below version 2.

#include <memory>
#include <string>

#include "sandbox/sandbox.h"
#include "remote/runner_hub.h"

namespace agentbox::remote {

class RemoteBackend : public sandbox::Backend {
 public:
  explicit RemoteBackend(std::shared_ptr<RunnerHub> hub) : hub_(std::move(hub)) {}
  std::string_view name() const override { return "remote"; }
  bool isolated() const override { return false; }
  Status check_usable() override { return {}; }
  // network other than "none": ENOTSUP naming it; a limit the session's runner (connected now)
  // does not enforce (its register's `enforces`): ENOTSUP naming limits.<field>.
  Status check_spec(const sandbox::SpecRequest& req) override;
  // The daemon's default_limits are for its own boxes: a remote session has the limits it asks
  // for, each enforced by its runner.
  bool takes_default_limits() const override { return false; }
  Result<std::unique_ptr<sandbox::Sandbox>> create(sandbox::BoxConfig config) override;

 private:
  std::shared_ptr<RunnerHub> hub_;
};

}  // namespace agentbox::remote
