#include "common/unique_fd.h"

#include <unistd.h>

namespace agentbox {

void UniqueFd::reset(int fd) {
  // Never retry close(): on Linux the fd is gone even when close reports EINTR.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

}  // namespace agentbox
