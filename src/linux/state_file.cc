#include "linux/state_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "common/unique_fd.h"

namespace agentbox::linux {

Status write_state_file(const std::string& path, std::string_view data) {
  std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return fail_errno(errno, "open(" + tmp + ")");
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t w = ::write(fd.get(), data.data() + off, data.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return fail_errno(errno, "write(" + tmp + ")");
    off += static_cast<std::size_t>(w);
  }
  if (::fsync(fd.get()) != 0) return fail_errno(errno, "fsync(" + tmp + ")");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail_errno(errno, "rename(" + tmp + ")");
  return {};
}

}  // namespace agentbox::linux
