#include "starling/averaging/types.hpp"

#include <bit>
#include <cmath>
#include <set>
#include <stdexcept>

namespace starling::averaging {

std::string PeerKey::short_hex() const {
  BytesView v(bytes_);
  return to_hex(v.size() > 6 ? v.last(6) : v);
}

Bitset::Bitset(std::size_t n, bool value) : n_(n), words_((n + 63) / 64, 0) {
  if (value)
    for (std::size_t i = 0; i < n; ++i) set(i);
}

void Bitset::set(std::size_t i, bool v) {
  if (i >= n_) throw std::out_of_range("Bitset::set");
  const std::uint64_t bit = std::uint64_t{1} << (i % 64);
  if (v)
    words_[i / 64] |= bit;
  else
    words_[i / 64] &= ~bit;
}

std::size_t Bitset::count() const noexcept {
  std::size_t c = 0;
  for (auto w : words_) c += static_cast<std::size_t>(std::popcount(w));
  return c;
}

Bitset& Bitset::operator|=(const Bitset& o) {
  if (o.n_ != n_) throw std::logic_error("Bitset size mismatch");
  for (std::size_t i = 0; i < words_.size(); ++i) words_[i] |= o.words_[i];
  return *this;
}

Bitset& Bitset::operator&=(const Bitset& o) {
  if (o.n_ != n_) throw std::logic_error("Bitset size mismatch");
  for (std::size_t i = 0; i < words_.size(); ++i) words_[i] &= o.words_[i];
  return *this;
}

Bitset Bitset::operator~() const {
  Bitset r(n_);
  for (std::size_t i = 0; i < n_; ++i)
    if (!test(i)) r.set(i);
  return r;
}

std::vector<std::uint32_t> Bitset::indices() const {
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < n_; ++i)
    if (test(i)) out.push_back(static_cast<std::uint32_t>(i));
  return out;
}

std::string Bitset::to_string() const {
  std::string s = "{";
  bool first = true;
  for (auto i : indices()) {
    if (!first) s += ",";
    s += std::to_string(i);
    first = false;
  }
  return s + "}";
}

Bytes Bitset::encode() const {
  Bytes out((n_ + 7) / 8, 0);
  for (std::size_t i = 0; i < n_; ++i)
    if (test(i)) out[i / 8] = static_cast<std::uint8_t>(out[i / 8] | (1u << (i % 8)));
  return out;
}

result<Bitset> Bitset::decode(BytesView b, std::size_t n) {
  if (b.size() != (n + 7) / 8)
    return make_error(errc::invalid_argument, "bitset: " + std::to_string(b.size()) +
                                                  " bytes for " + std::to_string(n) + " bits");
  Bitset r(n);
  for (std::size_t byte = 0; byte < b.size(); ++byte)
    for (std::size_t bit = 0; bit < 8; ++bit) {
      if (((b[byte] >> bit) & 1u) == 0) continue;
      const std::size_t i = byte * 8 + bit;
      if (i >= n) return make_error(errc::invalid_argument, "bitset: bit set beyond size");
      r.set(i);
    }
  return r;
}

std::optional<std::size_t> GroupInfo::index_of(const PeerKey& p) const {
  for (std::size_t i = 0; i < members.size(); ++i)
    if (members[i].peer == p) return i;
  return std::nullopt;
}

result<void> validate_members(const std::vector<MemberInfo>& members) {
  if (members.empty()) return make_error(errc::invalid_argument, "group: no members");
  if (members.size() > kMaxGroupSize)
    return make_error(errc::too_large, "group: " + std::to_string(members.size()) + " members");
  std::set<PeerKey> seen;
  bool any_reducer = false;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const auto& m = members[i];
    const std::string who = "group member " + std::to_string(i);
    if (m.peer.empty()) return make_error(errc::invalid_argument, who + ": empty peer id");
    if (!seen.insert(m.peer).second)
      return make_error(errc::invalid_argument, who + ": duplicate peer " + m.peer.short_hex());
    if (m.bandwidth == 0) return make_error(errc::invalid_argument, who + ": zero bandwidth");
    if (!std::isfinite(m.weight) || m.weight < 0)
      return make_error(errc::invalid_argument, who + ": weight must be finite and >= 0");
    any_reducer = any_reducer || !m.client;
  }
  if (!any_reducer) return make_error(errc::invalid_argument, "group: every member is a client");
  return success();
}

}  // namespace starling::averaging
