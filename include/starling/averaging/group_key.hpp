// Moshpit group keys. Peers that average under a prefix sit on a virtual grid of `dims`
// dimensions with `grid` cells per dimension; a peer's group key is the prefix plus its `dims`
// coordinates, and only peers with the same key are grouped. After a round each member drops
// its oldest coordinate and appends a new one derived from its rank in the group
// (rank * grid / group size), so members of one group land under different keys in the next
// round and the following rounds mix different peers (Moshpit SGD's grid averaging: with
// grid^dims groups of `grid` peers, dims rounds reach the exact global mean). dims = 0 is the
// plain mode: one key per prefix, groups of the target size formed among everyone.
//
// Threading rule: plain values.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "starling/core/bytes.hpp"
#include "starling/core/result.hpp"

namespace starling::averaging {

struct GroupKeyConfig {
  std::string prefix;       // e.g. "mymodel.grads"
  std::uint32_t grid = 16;  // cells per dimension (usually the target group size)
  std::uint32_t dims = 0;   // 0 = one key per prefix
};

class GroupKey {
 public:
  GroupKey() = default;
  // Validates the config (non-empty prefix of at most 64 printable characters without '/',
  // '[' or ']' (it also names the averager's protocols), grid in 2..65536, dims <= 16).
  static result<GroupKey> initial(const GroupKeyConfig& cfg, std::uint64_t seed);
  static result<GroupKey> from_digits(const GroupKeyConfig& cfg, std::vector<std::uint32_t> digits);

  // The same key for one named round (e.g. "grads/12"): peers average together only if their
  // rounds match, so peers at different epochs never mix. Validated by valid_round().
  GroupKey with_round(std::string round) const;
  static result<void> valid_round(const std::string& round);

  // "prefix", "prefix/3.0.12" (dims digits), "prefix[round]/3.0.12" with a round.
  std::string to_string() const;
  // The DHT key the group's matchmaking dictionary lives under: BLAKE2b of
  // "starling/averaging/match/" + to_string().
  Bytes dht_key() const;
  // The key for the next round after being member `rank` of a group of `group_size`.
  GroupKey next(std::uint32_t rank, std::uint32_t group_size) const;

  const std::vector<std::uint32_t>& digits() const noexcept { return digits_; }
  const GroupKeyConfig& config() const noexcept { return cfg_; }
  const std::string& round() const noexcept { return round_; }
  friend bool operator==(const GroupKey& a, const GroupKey& b) {
    return a.cfg_.prefix == b.cfg_.prefix && a.round_ == b.round_ && a.digits_ == b.digits_;
  }

 private:
  GroupKeyConfig cfg_;
  std::string round_;
  std::vector<std::uint32_t> digits_;
};

}  // namespace starling::averaging
