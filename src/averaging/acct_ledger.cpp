// CommitmentLedger (accountability.hpp): the commitments a member holds, and the conflicts
// between copies of one sender's commitment.
#include "starling/averaging/accountability.hpp"

namespace starling::averaging::acct {

result<std::optional<Evidence>> CommitmentLedger::add(const Commitment& c) {
  if (c.sender >= info_.members.size())
    return make_error(errc::invalid_argument, "commitment from a non-member");
  ST_TRY(check_commitment(c, round_, c.subround, c.sender, info_.members[c.sender]));
  const auto slot = std::make_pair(c.subround, c.sender);
  auto it = held_.find(slot);
  if (it == held_.end()) {
    held_.emplace(slot, c);
    return std::optional<Evidence>{};
  }
  if (encode(it->second) == encode(c)) return std::optional<Evidence>{};
  return std::optional<Evidence>{commitment_conflict(info_, it->second, c)};
}

const Commitment* CommitmentLedger::get(std::uint32_t subround, std::uint32_t sender) const {
  auto it = held_.find({subround, sender});
  return it == held_.end() ? nullptr : &it->second;
}

std::optional<Hash32> CommitmentLedger::digest(std::uint32_t subround, std::uint32_t sender) const {
  const Commitment* c = get(subround, sender);
  if (!c) return std::nullopt;
  const Bytes b = encode(*c);
  return crypto::sha256(b);
}

bool CommitmentLedger::differs(std::uint32_t subround, std::uint32_t sender,
                               const Hash32& other) const {
  const auto d = digest(subround, sender);
  return d && *d != other;
}

}  // namespace starling::averaging::acct
