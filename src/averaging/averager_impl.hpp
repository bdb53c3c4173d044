// Averager internals shared by averager.cpp and state_transfer.cpp.
//
// Threading rule: the host's executor only.
#pragma once

#include <map>
#include <memory>

#include "match_session.hpp"
#include "round_runner.hpp"
#include "starling/averaging/averager.hpp"

namespace starling::averaging {

// A state snapshot this peer serves to newcomers (state_transfer.cpp).
struct StateSnapshot {
  StateManifest manifest;
  std::vector<float> data;
};

struct Averager::Impl {
  explicit Impl(asio::any_io_executor ex) : round_registered(ex) {}
  std::map<Bytes, std::shared_ptr<detail::RoundRunner>> rounds;  // by group id
  AsyncEvent round_registered;
  std::shared_ptr<detail::MatchSession> match;
  std::shared_ptr<const StateSnapshot> snapshot;
  bool started = false, stopped = false, stepping = false;
};

}  // namespace starling::averaging
