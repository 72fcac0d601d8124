#pragma once
// Writing to a socket or pipe whose reader is gone raises SIGPIPE in the writing thread unless
// the call can say MSG_NOSIGNAL; sendfile(2) and splice(2) cannot. Neither the daemon's library
// code nor the client library may ignore SIGPIPE process-wide (that would leak SIG_IGN into
// every command exec'd, and into the caller's program), so these calls block SIGPIPE in the
// calling thread, make the call, and consume a SIGPIPE that the call itself raised (EPIPE). The
// call then just fails with EPIPE.

#include <pthread.h>
#include <signal.h>
#include <sys/types.h>

#include <cerrno>
#include <ctime>

namespace agentbox {

// `call` returns ssize_t and sets errno on failure, like the syscall it wraps.
template <typename Call>
ssize_t call_without_sigpipe(Call call) {
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  sigset_t old_mask;
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
  ssize_t n = call();
  const int err = errno;
  if (n < 0 && err == EPIPE && !was_pending) {
    const timespec zero{};
    while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  errno = err;
  return n;
}

}  // namespace agentbox
