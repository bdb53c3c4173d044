// Metrics records (metrics_record.hpp): the protobuf codec with its bounds, keys and sub-keys.
#include "starling/monitor/metrics_record.hpp"

#include <cmath>

#include <fmt/format.h>

#include "monitor.pb.h"
#include "starling/averaging/schema.hpp"
#include "starling/dht/signing.hpp"
#include "starling/net/host.hpp"

namespace starling::monitor {
namespace {

constexpr std::string_view kSubkeyPrefix = "metrics";

Error bad(std::string what) {
  return make_error(errc::invalid_argument, "metrics record: " + std::move(what));
}

// Length of the UTF-8 sequence starting at s[i] (0 if invalid or truncated).
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  std::size_t n = 0;
  std::uint32_t cp = 0;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0)
    n = 2, cp = c & 0x1F;
  else if ((c & 0xF0) == 0xE0)
    n = 3, cp = c & 0x0F;
  else if ((c & 0xF8) == 0xF0)
    n = 4, cp = c & 0x07;
  else
    return 0;
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  // C1 control characters (U+0080..U+009F) and the bidirectional overrides are refused too.
  if (cp <= 0x9F || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069)) return 0;
  return n;
}

bool is_control(unsigned char c) {
  return c < 0x20 || c == 0x7F;
}

result<void> check_text(std::string_view s, std::size_t max, const char* field) {
  if (s.size() > max) return bad(fmt::format("{} of {} bytes (limit {})", field, s.size(), max));
  for (std::size_t i = 0; i < s.size();) {
    if (is_control(static_cast<unsigned char>(s[i])))
      return bad(fmt::format("{} holds a control character", field));
    const auto n = utf8_length(s, i);
    if (n == 0) return bad(fmt::format("{} is not valid UTF-8", field));
    i += n;
  }
  return success();
}

result<void> check_number(double v, double max, const char* field) {
  if (!std::isfinite(v) || v < 0 || v > max)
    return bad(fmt::format("{} {} out of range [0, {}]", field, v, max));
  return success();
}

}  // namespace

const char* to_string(Reachability r) noexcept {
  switch (r) {
    case Reachability::reachable:
      return "reachable";
    case Reachability::client:
      return "client";
    case Reachability::unknown:
      break;
  }
  return "unknown";
}

std::string software_version() {
  return net::HostConfig{}.agent_version;
}

result<void> validate_metrics(const MetricsRecord& r, const MetricsLimits& l) {
  ST_TRY(check_text(r.name, l.max_name_bytes, "name"));
  ST_TRY(check_text(r.version, l.max_version_bytes, "version"));
  ST_TRY(check_text(r.task, l.max_task_bytes, "task"));
  if (r.loss && (!std::isfinite(*r.loss) || std::abs(*r.loss) > l.max_abs_loss))
    return bad(fmt::format("loss {} out of range", *r.loss));
  ST_TRY(check_number(r.samples_per_second, l.max_samples_per_second, "samples_per_second"));
  ST_TRY(check_number(r.uptime_s, l.max_seconds, "uptime_s"));
  ST_TRY(check_number(r.averaging_s, l.max_seconds, "averaging_s"));
  ST_TRY(check_number(r.window_s, l.max_seconds, "window_s"));
  if (r.eval) {
    ST_TRY(check_number(r.eval->accuracy, 1.0, "eval_accuracy"));
    ST_TRY(check_number(r.eval->loss, l.max_abs_loss, "eval_loss"));
    if (r.eval->epoch > l.max_count) return bad("eval_epoch out of range");
    if (r.eval->perplexity)
      ST_TRY(check_number(*r.eval->perplexity, l.max_perplexity, "eval_perplexity"));
  }
  for (auto [v, field] : {std::pair{r.samples_total, "samples_total"},
                          {r.bytes_sent, "bytes_sent"},
                          {r.bytes_received, "bytes_received"},
                          {r.rounds_ok, "rounds_ok"},
                          {r.rounds_failed, "rounds_failed"},
                          {r.state_downloads, "state_downloads"},
                          {r.target_batch_size, "target_batch_size"},
                          {r.samples_accumulated, "samples_accumulated"},
                          {r.epoch, "epoch"},
                          {r.seq, "seq"}})
    if (v > l.max_count) return bad(fmt::format("{} {} out of range", field, v));
  if (r.ttl_ms > l.max_ttl_ms) return bad(fmt::format("ttl_ms {} out of range", r.ttl_ms));
  if (static_cast<std::uint32_t>(r.reachability) > 2) return bad("unknown reachability");
  return success();
}

result<Bytes> encode_metrics(const MetricsRecord& r, const MetricsLimits& l) {
  ST_TRY(validate_metrics(r, l));
  pb::monitor::Metrics m;
  m.set_format(kMetricsFormat);
  m.set_name(r.name);
  m.set_version(r.version);
  m.set_epoch(r.epoch);
  m.set_has_loss(r.loss.has_value());
  m.set_loss(r.loss.value_or(0));
  m.set_samples_per_second(r.samples_per_second);
  m.set_samples_total(r.samples_total);
  m.set_uptime_s(r.uptime_s);
  m.set_bytes_sent(r.bytes_sent);
  m.set_bytes_received(r.bytes_received);
  m.set_reachability(static_cast<std::uint32_t>(r.reachability));
  m.set_rounds_ok(r.rounds_ok);
  m.set_rounds_failed(r.rounds_failed);
  m.set_state_downloads(r.state_downloads);
  m.set_averaging_s(r.averaging_s);
  m.set_target_batch_size(r.target_batch_size);
  m.set_samples_accumulated(r.samples_accumulated);
  m.set_seq(r.seq);
  m.set_ttl_ms(r.ttl_ms);
  m.set_window_s(r.window_s);
  if (r.eval) {
    m.set_has_eval(true);
    m.set_eval_accuracy(r.eval->accuracy);
    m.set_eval_loss(r.eval->loss);
    m.set_eval_epoch(r.eval->epoch);
    if (r.eval->perplexity) {
      m.set_has_eval_perplexity(true);
      m.set_eval_perplexity(*r.eval->perplexity);
    }
  }
  m.set_task(r.task);
  Bytes out(m.ByteSizeLong());
  m.SerializeToArray(out.data(), static_cast<int>(out.size()));
  if (out.size() > l.max_record_bytes)
    return make_error(errc::too_large, fmt::format("metrics record of {} bytes (limit {})",
                                                   out.size(), l.max_record_bytes));
  return out;
}

result<MetricsRecord> decode_metrics(BytesView in, const MetricsLimits& l) {
  if (in.size() > l.max_record_bytes)
    return make_error(errc::too_large, fmt::format("metrics record of {} bytes (limit {})",
                                                   in.size(), l.max_record_bytes));
  pb::monitor::Metrics m;
  if (!m.ParseFromArray(in.data(), static_cast<int>(in.size())))
    return bad("not a Metrics message");
  if (m.format() != kMetricsFormat) return bad(fmt::format("unknown format {}", m.format()));
  if (m.reachability() > 2) return bad(fmt::format("unknown reachability {}", m.reachability()));
  if (!m.has_loss() && m.loss() != 0) return bad("a loss without has_loss");
  MetricsRecord r;
  r.name = m.name();
  r.version = m.version();
  r.epoch = m.epoch();
  if (m.has_loss()) r.loss = m.loss();
  r.samples_per_second = m.samples_per_second();
  r.samples_total = m.samples_total();
  r.uptime_s = m.uptime_s();
  r.bytes_sent = m.bytes_sent();
  r.bytes_received = m.bytes_received();
  r.reachability = static_cast<Reachability>(m.reachability());
  r.rounds_ok = m.rounds_ok();
  r.rounds_failed = m.rounds_failed();
  r.state_downloads = m.state_downloads();
  r.averaging_s = m.averaging_s();
  r.target_batch_size = m.target_batch_size();
  r.samples_accumulated = m.samples_accumulated();
  r.seq = m.seq();
  r.ttl_ms = m.ttl_ms();
  r.window_s = m.window_s();
  if (m.has_eval()) {
    r.eval = MetricsRecord::Eval{m.eval_accuracy(), m.eval_loss(), m.eval_epoch(), {}};
    if (m.has_eval_perplexity()) r.eval->perplexity = m.eval_perplexity();
  } else if (m.eval_accuracy() != 0 || m.eval_loss() != 0 || m.eval_epoch() != 0 ||
             m.has_eval_perplexity()) {
    return bad("an evaluation without has_eval");
  }
  if (!m.has_eval_perplexity() && m.eval_perplexity() != 0)
    return bad("a perplexity without has_eval_perplexity");
  r.task = m.task();
  ST_TRY(validate_metrics(r, l));
  return r;
}

std::string sanitize_name(std::string_view in, std::size_t max_bytes) {
  std::string out;
  for (std::size_t i = 0; i < in.size();) {
    const auto c = static_cast<unsigned char>(in[i]);
    if (is_control(c)) {
      ++i;
      continue;
    }
    const auto n = utf8_length(in, i);
    const std::string_view piece = n == 0 ? std::string_view("?") : in.substr(i, n);
    if (out.size() + piece.size() > max_bytes) break;
    out += piece;
    i += n == 0 ? 1 : n;
  }
  return out;
}

dht::RecordKey metrics_key(std::string_view run_id) {
  return dht::RecordKey(
      averaging::blake2b_256(as_bytes("starling/monitor/metrics/" + std::string(run_id))));
}

dht::SubKey metrics_subkey(const net::PeerId& peer) {
  return dht::SubKey::from_string(std::string(kSubkeyPrefix) + dht::owner_marker(peer));
}

result<net::PeerId> metrics_owner(const dht::SubKey& subkey) {
  ST_TRY(auto owners, dht::owners_in(subkey.raw()));
  if (owners.size() != 1) return bad("sub-key without exactly one owner");
  if (subkey.raw() != metrics_subkey(owners.front()).raw()) return bad("not a metrics sub-key");
  return owners.front();
}

}  // namespace starling::monitor
