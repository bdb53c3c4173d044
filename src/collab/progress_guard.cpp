// ProgressGuard (progress_guard.hpp).
#include "progress_guard.hpp"

#include <algorithm>

#include "starling/core/log.hpp"
#include "starling/training/progress.hpp"

namespace starling::collab {

namespace {

template <class T>
T median(std::vector<T> v) {
  if (v.empty()) return T{};
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

struct Decoded {
  training::ProgressEntry entry;
  std::optional<training::PeerProgress> record;
  bool vouched = false;
  TimePoint seen{};
};

}  // namespace

std::vector<training::ProgressEntry> ProgressGuard::filter(std::vector<training::ProgressEntry> in,
                                                           TimePoint now, Stats* stats) {
  Stats st;
  std::vector<Decoded> all;
  std::size_t vouched_n = 0;
  std::uint64_t vouched_epoch = 0;
  for (auto& e : in) {
    Decoded d;
    if (auto r = training::decode_progress(e.value)) d.record = r.value();
    d.vouched = vouched(e.peer);
    auto [it, fresh] = first_seen_.try_emplace(e.peer, now);
    d.seen = it->second;
    if (d.vouched && d.record) {
      ++vouched_n;
      vouched_epoch = std::max(vouched_epoch, d.record->epoch);
    }
    d.entry = std::move(e);
    all.push_back(std::move(d));
  }
  while (first_seen_.size() > kMaxRemembered) {  // forget the peers first seen latest
    auto latest =
        std::max_element(first_seen_.begin(), first_seen_.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    first_seen_.erase(latest);
  }
  // Unproven peers: the earliest seen first, at most the cap; far-ahead epochs dropped.
  std::stable_sort(all.begin(), all.end(), [](const Decoded& a, const Decoded& b) {
    return a.vouched != b.vouched ? a.vouched : a.seen < b.seen;
  });
  const bool formed = vouched_n >= 2;
  const std::size_t cap = formed ? kMaxUnproven : kMaxUnprovenStartup;
  std::size_t unproven = 0;
  std::vector<Decoded> kept;
  for (auto& d : all) {
    if (!d.vouched && d.record) {
      if (require_met_ && !met_.count(d.entry.peer)) {
        ++st.unmet_dropped;
        continue;
      }
      if (formed && d.record->epoch > vouched_epoch + 1) {
        ++st.epoch_dropped;
        continue;
      }
      if (unproven >= cap) {
        ++st.unproven_dropped;
        continue;
      }
      ++unproven;
    }
    kept.push_back(std::move(d));
  }
  // Claims: at most kClaimRatio x the median of the vouched records (all admitted ones at
  // startup), an unproven peer's at most the median.
  std::vector<double> rates;
  std::map<std::uint64_t, std::vector<std::uint64_t>> acc;  // by epoch
  for (const auto& d : kept)
    if (d.record && !d.record->auxiliary && (d.vouched || !formed)) {
      rates.push_back(d.record->samples_per_second);
      acc[d.record->epoch].push_back(d.record->samples_accumulated);
    }
  const double rate_median = median(rates);
  std::vector<training::ProgressEntry> out;
  for (auto& d : kept) {
    if (d.record && rates.size() >= 2) {
      auto& r = *d.record;
      const double ratio = d.vouched || !formed ? kClaimRatio : 1.0;
      const double rate_cap = ratio * rate_median;
      const double m = static_cast<double>(median(acc[r.epoch]));
      const double acc_cap = m > 0 ? ratio * m : rate_cap;
      if (r.samples_per_second > rate_cap || static_cast<double>(r.samples_accumulated) > acc_cap) {
        r.samples_per_second = std::min(r.samples_per_second, rate_cap);
        r.samples_accumulated = std::min<std::uint64_t>(
            r.samples_accumulated, static_cast<std::uint64_t>(std::max(0.0, acc_cap)));
        d.entry.value = training::encode_progress(r);
        ++st.capped;
      }
    }
    out.push_back(std::move(d.entry));
  }
  if (st.unproven_dropped + st.epoch_dropped + st.capped + st.unmet_dropped > 0)
    logger("collab")->debug(
        "progress: {} unproven peer(s) never met, {} over the cap, {} claiming an epoch far "
        "ahead, {} record(s) capped",
        st.unmet_dropped, st.unproven_dropped, st.epoch_dropped, st.capped);
  if (stats) *stats = st;
  return out;
}

}  // namespace starling::collab
