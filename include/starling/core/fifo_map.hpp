// FifoMap: a std::map that keeps at most `capacity` keys and forgets the oldest inserted key
// first. For memories fed by peers (judged evidence, seen records, remembered reports), whose
// growth a peer controls: forgetting costs a re-check, never correctness.
//
// Threading rule: none (the owner's).
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <utility>

namespace starling {

template <class K, class V>
class FifoMap {
 public:
  explicit FifoMap(std::size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}
  // Keys are only ever removed by insertion (oldest first): order_ lists each key once.

  // The value at `k`, inserted (default-constructed, the oldest key forgotten if full) when
  // missing. The reference is valid until the next insertion.
  V& operator[](const K& k) { return try_emplace(k).first->second; }
  // (iterator, inserted) like std::map::try_emplace.
  template <class... A>
  std::pair<typename std::map<K, V>::iterator, bool> try_emplace(const K& k, A&&... a) {
    auto r = map_.try_emplace(k, std::forward<A>(a)...);
    if (!r.second) return r;
    order_.push_back(k);
    if (order_.size() > capacity_) {
      map_.erase(order_.front());  // never `k`: it was not in the map
      order_.pop_front();
    }
    return r;
  }
  auto find(const K& k) { return map_.find(k); }
  auto find(const K& k) const { return map_.find(k); }
  auto begin() const { return map_.begin(); }
  auto end() const { return map_.end(); }
  auto end() { return map_.end(); }
  std::size_t count(const K& k) const { return map_.count(k); }
  std::size_t size() const { return map_.size(); }
  std::size_t capacity() const { return capacity_; }

 private:
  std::size_t capacity_;
  std::map<K, V> map_;
  std::deque<K> order_;  // insertion order; keys are never erased except the oldest
};

}  // namespace starling
