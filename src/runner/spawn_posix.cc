#include "runner/spawn_posix.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>

#include <cerrno>

namespace agentbox::runner {

std::optional<Result<pid_t>> spawn_posix(const SpawnSpec& spec, char* const* argv,
                                         char* const* envp,
                                         const std::vector<std::string>& candidates) {
  if (spec.pty) return std::nullopt;
  const int want[3] = {spec.stdin_fd, spec.stdout_fd, spec.stderr_fd};
  for (int i = 0; i < 3; ++i) {
    if (want[i] >= 0 && want[i] <= 2 && want[i] != i) return std::nullopt;
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  struct Cleanup {
    posix_spawnattr_t* a;
    posix_spawn_file_actions_t* f;
    ~Cleanup() {
      posix_spawn_file_actions_destroy(f);
      posix_spawnattr_destroy(a);
    }
  } cleanup{&attr, &fa};
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int s = 1; s < 32; ++s) {
    if (s != SIGKILL && s != SIGSTOP) sigaddset(&defaults, s);
  }
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
  for (int i = 0; i < 3; ++i) {
    if (want[i] >= 0) {
      posix_spawn_file_actions_adddup2(&fa, want[i], i);  // the same fd: its CLOEXEC is cleared
    } else {
      posix_spawn_file_actions_addopen(&fa, i, "/dev/null", i == 0 ? O_RDONLY : O_WRONLY, 0);
    }
  }
  if (spec.cwd_fd >= 0) posix_spawn_file_actions_addfchdir_np(&fa, spec.cwd_fd);
  // Nothing but 0..2 reaches the program (as spawn()'s fork path: the runner's connection to the
  // server above all, which a child holding it would keep open past the runner's death).
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  int last = ENOENT;
  for (const std::string& c : candidates) {
    pid_t pid = -1;
    int rc = posix_spawn(&pid, c.c_str(), &fa, &attr, argv, envp);
    if (rc == 0) return Result<pid_t>(pid);
    if (rc != ENOENT && rc != ENOTDIR) last = rc;
  }
  return Result<pid_t>(fail_errno(last, "exec " + spec.argv[0]));
}

}  // namespace agentbox::runner
