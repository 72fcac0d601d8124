#pragma once
// Logging is spdlog's default logger, writing to stderr. Call init_logging() once in main().
#include <spdlog/spdlog.h>

#include <string_view>

namespace agentbox {

// level: "trace", "debug", "info", "warn", "error"; unknown values mean "info".
void init_logging(std::string_view level);

}  // namespace agentbox
