#include "starling/averaging/group_key.hpp"

#include "starling/averaging/schema.hpp"

namespace starling::averaging {
namespace {

result<void> check(const GroupKeyConfig& cfg) {
  if (cfg.prefix.empty() || cfg.prefix.size() > 64 ||
      cfg.prefix.find_first_of("/[]") != std::string::npos)
    return make_error(errc::invalid_argument,
                      "group key: prefix must be 1..64 characters without '/', '[' or ']'");
  for (unsigned char c : cfg.prefix)
    if (c <= 0x20 || c >= 0x7f)
      return make_error(errc::invalid_argument, "group key: prefix must be printable ASCII");
  if (cfg.grid < 2 || cfg.grid > 65536)
    return make_error(errc::invalid_argument, "group key: grid must be in 2..65536");
  if (cfg.dims > 16) return make_error(errc::invalid_argument, "group key: at most 16 dims");
  return success();
}

}  // namespace

result<GroupKey> GroupKey::initial(const GroupKeyConfig& cfg, std::uint64_t seed) {
  ST_TRY(check(cfg));
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> d;
  for (std::uint32_t i = 0; i < cfg.dims; ++i)
    d.push_back(static_cast<std::uint32_t>(rng() % cfg.grid));
  return from_digits(cfg, std::move(d));
}

result<GroupKey> GroupKey::from_digits(const GroupKeyConfig& cfg,
                                       std::vector<std::uint32_t> digits) {
  ST_TRY(check(cfg));
  if (digits.size() != cfg.dims)
    return make_error(errc::invalid_argument, "group key: wrong number of digits");
  for (auto d : digits)
    if (d >= cfg.grid) return make_error(errc::invalid_argument, "group key: digit out of range");
  GroupKey k;
  k.cfg_ = cfg;
  k.digits_ = std::move(digits);
  return k;
}

result<void> GroupKey::valid_round(const std::string& round) {
  if (round.size() > 128 || round.find_first_of("[]") != std::string::npos)
    return make_error(errc::invalid_argument,
                      "group key: a round is at most 128 characters without '[' or ']'");
  for (unsigned char c : round)
    if (c < 0x20 || c >= 0x7f)
      return make_error(errc::invalid_argument, "group key: a round must be printable ASCII");
  return success();
}

GroupKey GroupKey::with_round(std::string round) const {
  GroupKey k = *this;
  k.round_ = std::move(round);
  return k;
}

std::string GroupKey::to_string() const {
  std::string s = cfg_.prefix;
  if (!round_.empty()) s += "[" + round_ + "]";
  for (std::size_t i = 0; i < digits_.size(); ++i) {
    s += i == 0 ? "/" : ".";
    s += std::to_string(digits_[i]);
  }
  return s;
}

Bytes GroupKey::dht_key() const {
  return blake2b_256(as_bytes("starling/averaging/match/" + to_string()));
}

GroupKey GroupKey::next(std::uint32_t rank, std::uint32_t group_size) const {
  GroupKey k = *this;
  if (k.digits_.empty() || group_size == 0) return k;
  const std::uint64_t d = std::uint64_t{rank} * cfg_.grid / group_size;
  k.digits_.erase(k.digits_.begin());
  k.digits_.push_back(static_cast<std::uint32_t>(std::min<std::uint64_t>(d, cfg_.grid - 1)));
  return k;
}

}  // namespace starling::averaging
