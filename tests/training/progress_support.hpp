// Shared by the progress-core tests (simulated time): peers, a base time, records, a config.
#pragma once

#include <chrono>
#include <cstdint>

#include "starling/crypto/keys.hpp"
#include "starling/training/progress.hpp"

namespace starling::training::progress_support {

inline net::PeerId make_peer() {
  return net::PeerId::from_public_key(crypto::KeyPair::generate().public_key());
}

// An arbitrary base time: the core must not care where time starts.
inline TimePoint t0() {
  return TimePoint{} + std::chrono::hours(1000);
}

inline PeerProgress rec(std::uint64_t epoch, std::uint64_t samples, double sps,
                        std::uint64_t seq = 1) {
  PeerProgress p;
  p.epoch = epoch;
  p.samples_accumulated = samples;
  p.samples_per_second = sps;
  p.seq = seq;
  return p;
}

inline ProgressConfig config(std::uint64_t target) {
  using namespace std::chrono_literals;
  ProgressConfig c;
  c.target_batch_size = target;
  c.matchmaking_time = 5s;
  c.stale_after = 30s;
  return c;
}

}  // namespace starling::training::progress_support
