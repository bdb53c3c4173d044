#include "starling/core/log.hpp"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace starling {
namespace {
std::mutex g_mu;
spdlog::level::level_enum g_level = [] {
  const char* env = std::getenv("STARLING_LOG");
  return env ? spdlog::level::from_str(env) : spdlog::level::warn;
}();
}  // namespace

std::shared_ptr<spdlog::logger> logger(const std::string& module) {
  std::lock_guard lock(g_mu);
  if (auto l = spdlog::get(module)) return l;
  auto l = spdlog::stderr_color_mt(module);
  l->set_level(g_level);
  l->set_pattern("%H:%M:%S.%e %^%l%$ [%n] %v");
  return l;
}

void set_log_level(const std::string& level) {
  std::lock_guard lock(g_mu);
  g_level = spdlog::level::from_str(level);
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->set_level(g_level); });
}

}  // namespace starling
