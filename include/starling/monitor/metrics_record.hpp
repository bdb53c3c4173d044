// Run metrics records: what every trainer publishes about itself in the DHT for monitors and
// dashboards (proto/monitor.proto). One signed DHT sub-key per trainer under the run's metrics
// key; the sub-key holds the owner marker of the publisher, so the DHT's owner-signature
// validator refuses any record not signed by that peer (nobody can write another's record),
// and the record's ttl makes it expire when its publisher stops.
//
// Threading rule: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "starling/core/bytes.hpp"
#include "starling/core/result.hpp"
#include "starling/dht/id.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::monitor {

enum class Reachability : std::uint32_t { unknown = 0, reachable = 1, client = 2 };
const char* to_string(Reachability r) noexcept;

struct MetricsRecord {
  std::string name;     // display name (untrusted text: see MetricsLimits)
  std::string version;  // software version of the publisher
  std::string task;     // what it trains (starling train's task identity; untrusted text)
  std::uint64_t epoch = 0;
  std::optional<double> loss;     // mean training loss over the window
  double samples_per_second = 0;  // over the window
  std::uint64_t samples_total = 0;
  double uptime_s = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  Reachability reachability = Reachability::unknown;
  std::uint64_t rounds_ok = 0;
  std::uint64_t rounds_failed = 0;
  std::uint64_t state_downloads = 0;
  double averaging_s = 0;
  std::uint64_t target_batch_size = 0;
  std::uint64_t samples_accumulated = 0;
  std::uint64_t seq = 0;
  std::uint64_t ttl_ms = 0;
  double window_s = 0;
  struct Eval {
    double accuracy = 0;  // [0, 1]
    double loss = 0;
    std::uint64_t epoch = 0;
    std::optional<double> perplexity;  // language-model task: exp(loss)
    friend bool operator==(const Eval&, const Eval&) = default;
  };
  std::optional<Eval> eval;  // the last held-out evaluation

  friend bool operator==(const MetricsRecord&, const MetricsRecord&) = default;
};

// Bounds every decoded record satisfies (and every encoded one must).
struct MetricsLimits {
  std::size_t max_record_bytes = 512;
  std::size_t max_name_bytes = 32;
  std::size_t max_version_bytes = 32;
  std::size_t max_task_bytes = 128;
  double max_perplexity = 1e12;
  double max_samples_per_second = 1e9;
  double max_abs_loss = 1e9;
  double max_seconds = 1e10;  // uptime, averaging time, window (~300 years)
  std::uint64_t max_count = std::uint64_t{1} << 60;
  std::uint64_t max_ttl_ms = 24ull * 3600 * 1000;
};

inline constexpr std::uint32_t kMetricsFormat = 1;
// "starling <version>" of this build.
std::string software_version();

// Checks every field against `limits`: finite, non-negative numbers within range, names and
// versions of valid UTF-8 without control characters. errc::invalid_argument with the field.
result<void> validate_metrics(const MetricsRecord& r, const MetricsLimits& limits = {});
// Encodes a record; errors if it does not validate or encodes above max_record_bytes.
result<Bytes> encode_metrics(const MetricsRecord& r, const MetricsLimits& limits = {});
// Decodes and validates; never throws or over-allocates.
result<MetricsRecord> decode_metrics(BytesView in, const MetricsLimits& limits = {});

// A display name from user input: control characters dropped, invalid UTF-8 replaced with
// '?', cut to `max_bytes` on a character boundary.
std::string sanitize_name(std::string_view in, std::size_t max_bytes = 32);

// The run's metrics key: BLAKE2b-256("starling/monitor/metrics/" + run_id).
dht::RecordKey metrics_key(std::string_view run_id);
// The sub-key `peer` publishes under: "metrics" + its owner marker.
dht::SubKey metrics_subkey(const net::PeerId& peer);
// The publisher a sub-key belongs to: exactly one owner marker and the "metrics" prefix.
result<net::PeerId> metrics_owner(const dht::SubKey& subkey);

}  // namespace starling::monitor
