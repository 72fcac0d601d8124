#include "common/log_errors.h"

#include "common/log.h"

namespace agentbox {

void log_exception(std::string_view what, std::exception_ptr e) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    spdlog::error("{} ended by an exception: {}", what, x.what());
  } catch (...) {
    spdlog::error("{} ended by an unknown exception", what);
  }
}

}  // namespace agentbox
