// Fuzzes the training progress record (pb::training::Progress, published by every peer in the
// DHT and read by all others): decode either rejects the bytes or yields a record within the
// limits that re-encodes and decodes to an equal value.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "starling/training/progress.hpp"

using namespace starling;

namespace {
void check(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const training::ProgressLimits limits;
  auto p = training::decode_progress(BytesView(data, size), limits);
  if (!p) return 0;
  const auto& r = p.value();
  check(std::isfinite(r.samples_per_second) && r.samples_per_second >= 0);
  check(r.samples_accumulated <= limits.max_samples && r.samples_total <= limits.max_samples);
  check(r.ttl <= limits.max_age && r.age_at_publish <= limits.max_age);
  auto again = training::decode_progress(training::encode_progress(r), limits);
  check(again && again.value() == r);
  (void)training::record_age(r, r.ttl / 2);
  return 0;
}
