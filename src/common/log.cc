#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <string>

namespace agentbox {

void init_logging(std::string_view level) {
  auto logger = spdlog::stderr_color_mt("agentbox");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  auto lvl = spdlog::level::from_str(std::string(level));
  spdlog::set_level(lvl == spdlog::level::off && level != "off" ? spdlog::level::info : lvl);
}

}  // namespace agentbox
