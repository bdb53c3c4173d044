#include "starling/dht/record.hpp"

#include <algorithm>
#include <tuple>

namespace starling::dht {

bool newer(const RecordBody& a, const RecordBody& b) noexcept {
  return std::tie(a.version, a.value, a.lifetime, a.signature) >
         std::tie(b.version, b.value, b.lifetime, b.signature);
}

std::size_t Slot::size_of(const std::optional<SubKey>& sk, const RecordBody& b) noexcept {
  return b.value.size() + b.signature.size() + (sk ? sk->raw().size() : 0) + 32;
}

namespace {
// Merges `body` into an entry already held for the same (sub-)key.
MergeResult merge_into(Entry& held, const RecordBody& body, TimePoint deadline, bool& replaced) {
  replaced = false;
  if (held.body == body) {
    if (deadline > held.deadline) {
      held.deadline = deadline;
      return MergeResult::refreshed;
    }
    return MergeResult::unchanged;
  }
  if (!newer(body, held.body)) return MergeResult::stale;
  replaced = true;
  return MergeResult::stored;
}
}  // namespace

MergeResult Slot::merge(const std::optional<SubKey>& subkey, const RecordBody& body,
                        TimePoint deadline) {
  if (!subkey) {
    if (plain_) {
      bool replaced = false;
      auto r = merge_into(*plain_, body, deadline, replaced);
      if (!replaced) return r;
      bytes_ -= size_of(std::nullopt, plain_->body);
    }
    plain_ = Entry{body, deadline};
    bytes_ += size_of(std::nullopt, body);
    // A plain write replaces every dictionary entry that is not newer than it.
    for (auto it = dict_.begin(); it != dict_.end();) {
      if (it->second.body.version <= body.version) {
        bytes_ -= size_of(it->first, it->second.body);
        it = dict_.erase(it);
      } else {
        ++it;
      }
    }
    return MergeResult::stored;
  }
  if (plain_ && body.version <= plain_->body.version) return MergeResult::stale;
  auto it = dict_.find(*subkey);
  if (it != dict_.end()) {
    bool replaced = false;
    auto r = merge_into(it->second, body, deadline, replaced);
    if (!replaced) return r;
    bytes_ -= size_of(subkey, it->second.body);
    it->second = Entry{body, deadline};
  } else {
    dict_.emplace(*subkey, Entry{body, deadline});
  }
  bytes_ += size_of(subkey, body);
  return MergeResult::stored;
}

void Slot::merge_all(const Slot& other) {
  if (other.plain_) merge(std::nullopt, other.plain_->body, other.plain_->deadline);
  for (const auto& [sk, e] : other.dict_) merge(sk, e.body, e.deadline);
}

void Slot::expire(TimePoint now) {
  if (plain_ && plain_->deadline <= now) {
    bytes_ -= size_of(std::nullopt, plain_->body);
    plain_.reset();
  }
  for (auto it = dict_.begin(); it != dict_.end();) {
    if (it->second.deadline <= now) {
      bytes_ -= size_of(it->first, it->second.body);
      it = dict_.erase(it);
    } else {
      ++it;
    }
  }
}

const Entry* Slot::find(const std::optional<SubKey>& subkey) const {
  if (!subkey) return plain_ ? &*plain_ : nullptr;
  auto it = dict_.find(*subkey);
  return it == dict_.end() ? nullptr : &it->second;
}

std::vector<Record> Slot::to_records(TimePoint now) const {
  std::vector<Record> out;
  auto add = [&](const std::optional<SubKey>& sk, const Entry& e) {
    if (e.deadline <= now) return;
    auto ttl = std::chrono::duration_cast<Millis>(e.deadline - now);
    if (ttl.count() <= 0) return;
    out.push_back(Record{sk, e.body, ttl});
  };
  if (plain_) add(std::nullopt, *plain_);
  for (const auto& [sk, e] : dict_) add(sk, e);
  return out;
}

std::optional<TimePoint> Slot::last_deadline() const {
  std::optional<TimePoint> r;
  if (plain_) r = plain_->deadline;
  for (const auto& [sk, e] : dict_)
    if (!r || e.deadline > *r) r = e.deadline;
  return r;
}

std::uint64_t VersionClock::next(WallTime wall) noexcept {
  const std::int64_t w = wall_micros(wall);
  const std::uint64_t now = w > 0 ? static_cast<std::uint64_t>(w) : 0;
  last_ = std::max(now, last_ + 1);
  return last_;
}

void VersionClock::observe(std::uint64_t version, WallTime wall, Millis max_skew) noexcept {
  const std::int64_t bound =
      wall_micros(wall) + std::chrono::duration_cast<std::chrono::microseconds>(max_skew).count();
  if (bound > 0 && version <= static_cast<std::uint64_t>(bound)) last_ = std::max(last_, version);
}

}  // namespace starling::dht
