// Fuzz harness: the daemon's config YAML (server/config.h), read as `agentboxd --config FILE`
// reads it: parse_daemon_args() with the input as the file (a memfd named by /proc/self/fd, so
// nothing is written to disk), then validate_config() of what it accepted.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "server/config.h"

using namespace agentbox::server;

namespace {
int config_fd() {
  static int fd = ::memfd_create("agentbox-fuzz-config", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  return fd;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = config_fd();
  if (::ftruncate(fd, 0) != 0) std::abort();
  if (size > 0 && ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const char* argv[] = {"agentboxd", "--config", path.c_str()};
  std::ostringstream out, err;
  auto outcome = parse_daemon_args(3, argv, out, err);
  if (outcome.config) {
    (void)validate_config(*outcome.config);
    (void)config_digest(*outcome.config);
    (void)effective_tenants(*outcome.config);
  }
  return 0;
}
