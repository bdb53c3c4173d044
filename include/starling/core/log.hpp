// Logging: spdlog loggers per module ("net", "dht", ...). Level from STARLING_LOG
// (trace|debug|info|warn|error|off; default warn) or set_log_level().
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace starling {

std::shared_ptr<spdlog::logger> logger(const std::string& module);
void set_log_level(const std::string& level);

}  // namespace starling
