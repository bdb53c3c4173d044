// The "dht" logger, looked up once (spdlog loggers live for the whole process, and
// set_log_level() changes the same object).
#pragma once

#include "starling/core/log.hpp"

namespace starling::dht {

inline spdlog::logger& dht_log() {
  static const std::shared_ptr<spdlog::logger> l = logger("dht");
  return *l;
}

}  // namespace starling::dht
