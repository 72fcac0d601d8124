#pragma once
// The wall clock as the wire and the catalog carry it: whole seconds since the Unix epoch.

#include <chrono>
#include <cstdint>

namespace agentbox {

inline std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace agentbox
