// The clocks every module uses, without asio: the protocol cores (DHT, matchmaking, all-reduce,
// progress) take time as values of these types and never read a clock themselves.
//
// - Clock (steady): deadlines, timeouts, rates. Never goes back.
// - WallClock (system): only what must mean the same on every peer (record versions and
//   expirations, signature windows, matchmaking deadlines published in the DHT).
#pragma once

#include <chrono>

namespace starling {

using Clock = std::chrono::steady_clock;
using Duration = Clock::duration;
using TimePoint = Clock::time_point;

using WallClock = std::chrono::system_clock;
using WallTime = WallClock::time_point;

using Millis = std::chrono::milliseconds;

using namespace std::chrono_literals;

}  // namespace starling
