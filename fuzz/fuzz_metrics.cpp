// Fuzzes the run-metrics record (pb::monitor::Metrics, published by every trainer in the DHT
// and read by monitors): decode either rejects the bytes or yields a record within the limits
// that re-encodes within the size limit and decodes to an equal value.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "starling/monitor/metrics_record.hpp"

using namespace starling;

namespace {
void check(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const monitor::MetricsLimits limits;
  auto r = monitor::decode_metrics(BytesView(data, size), limits);
  (void)monitor::sanitize_name(
      std::string_view(reinterpret_cast<const char*>(data), std::min<std::size_t>(size, 64)));
  if (!r) return 0;
  const auto& m = r.value();
  check(m.name.size() <= limits.max_name_bytes && m.version.size() <= limits.max_version_bytes);
  check(std::isfinite(m.samples_per_second) && m.samples_per_second >= 0);
  check(!m.loss || std::isfinite(*m.loss));
  check(monitor::validate_metrics(m, limits).has_value());
  auto bytes = monitor::encode_metrics(m, limits);
  check(bytes.has_value() && bytes.value().size() <= limits.max_record_bytes);
  auto again = monitor::decode_metrics(bytes.value(), limits);
  check(again && again.value() == m);
  check(monitor::sanitize_name(m.name) == m.name);
  return 0;
}
