#pragma once
// The fast path of spawn() (spawn.h) for a child without a pty: posix_spawn, which glibc runs as
// clone(CLONE_VM | CLONE_VFORK), instead of fork(). fork() copies the runner's page tables (and
// then every page the runner writes is copied on write while the child runs): it cost the
// remote exec round trip a measurable part of its latency over the host backend, which spawns
// this way (sandbox/host_exec.cc).

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "runner/spawn.h"

namespace agentbox::runner {

// As spawn(): a new process group, default signal dispositions and an empty mask, stdin/out/err
// from the spec (/dev/null for -1), fchdir(cwd_fd), then the first of `candidates` that exists.
// nullopt: this spec needs the fork path (a pty, or a std fd numbered 0..2 that dup2 could
// clobber).
std::optional<Result<pid_t>> spawn_posix(const SpawnSpec& spec, char* const* argv,
                                         char* const* envp,
                                         const std::vector<std::string>& candidates);

}  // namespace agentbox::runner
