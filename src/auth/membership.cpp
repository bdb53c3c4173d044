// Membership: verified certificates and the newest revocation list (membership.hpp).
#include "starling/auth/membership.hpp"

#include <algorithm>
#include <string>

namespace starling::auth {

const char* status_name(MemberStatus s) {
  switch (s) {
    case MemberStatus::member:
      return "member";
    case MemberStatus::unknown:
      return "unknown";
    case MemberStatus::expired:
      return "expired";
    case MemberStatus::revoked:
      return "revoked";
  }
  return "?";
}

result<void> Membership::add_certificate(const net::PeerId& owner, BytesView bytes,
                                         std::uint64_t now) {
  ST_TRY(auto member, member_key(owner));
  std::lock_guard lock(mu_);
  auto it = certs_.find(member);
  if (it != certs_.end() &&
      std::equal(bytes.begin(), bytes.end(), it->second.bytes.begin(), it->second.bytes.end())) {
    ++stats_.cache_hits;
    return success();
  }
  auto c = decode_certificate(bytes);
  if (!c) {
    ++stats_.rejected;
    return c.error().with_context("certificate from " + owner.short_string());
  }
  ++stats_.verified;
  const Refusal r = check_certificate(c.value(), run_key_, member, now, nullptr);
  // An expired certificate is no use; one not yet valid may be soon, but a newer valid one
  // is never replaced by it.
  if (r != Refusal::none) {
    ++stats_.rejected;
    return make_error(errc::permission,
                      std::string(refusal_name(r)) + ": certificate from " + owner.short_string());
  }
  if (it == certs_.end()) {
    certs_.emplace(member, Held{copy_bytes(bytes), c.value()});
  } else if (c.value().issued_at > it->second.cert.issued_at ||
             check_validity(it->second.cert, now, nullptr) != Refusal::none) {
    it->second = Held{copy_bytes(bytes), c.value()};
  }
  return success();
}

result<bool> Membership::update_revocations(BytesView bytes) {
  auto l = decode_revocations(bytes);
  std::lock_guard lock(mu_);
  if (!l) {
    ++stats_.rejected;
    return l.error();
  }
  if (l.value().run_key != run_key_) {
    ++stats_.rejected;
    return make_error(errc::permission, "revocation list for another run key");
  }
  if (revoked_ && l.value().sequence <= revoked_->sequence) return false;
  if (!signature_valid(l.value())) {
    ++stats_.rejected;
    return make_error(errc::permission, "revocation list with a bad signature");
  }
  revoked_ = std::move(l).value();
  revoked_bytes_ = copy_bytes(bytes);
  return true;
}

MemberStatus Membership::status(const net::PeerId& peer, std::uint64_t now) const {
  auto member = member_key(peer);
  if (!member) return MemberStatus::unknown;
  std::lock_guard lock(mu_);
  auto it = certs_.find(member.value());
  if (it == certs_.end()) return MemberStatus::unknown;
  const RevocationList* rl = revoked_ ? &*revoked_ : nullptr;
  switch (check_validity(it->second.cert, now, rl)) {
    case Refusal::none:
      return MemberStatus::member;
    case Refusal::revoked:
      return MemberStatus::revoked;
    case Refusal::expired:
      return MemberStatus::expired;
    default:
      return MemberStatus::unknown;  // not yet valid (held certificates are signed)
  }
}

std::optional<Bytes> Membership::revocations() const {
  std::lock_guard lock(mu_);
  if (!revoked_) return std::nullopt;
  return revoked_bytes_;
}

std::uint64_t Membership::revocation_sequence() const {
  std::lock_guard lock(mu_);
  return revoked_ ? revoked_->sequence : 0;
}

Membership::Stats Membership::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.members = certs_.size();
  return s;
}

}  // namespace starling::auth
