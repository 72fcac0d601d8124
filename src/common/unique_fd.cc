#include "common/unique_fd.h"

#include <unistd.h>

#include <cerrno>

namespace agentbox {

void UniqueFd::reset(int fd) {
  // Never retry close(): on Linux the fd is gone even when close reports EINTR. errno is kept:
  // a UniqueFd going out of scope between a failing call and the fail_errno(errno, ...) that
  // reports it must not replace the caller's errno with close's.
  if (fd_ >= 0) {
    const int saved = errno;
    ::close(fd_);
    errno = saved;
  }
  fd_ = fd;
}

}  // namespace agentbox
