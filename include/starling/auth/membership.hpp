// Membership: what one peer knows about the members of a private run, with no I/O. It holds
// the certificates it has verified (per member, the newest valid one), the newest revocation
// list, and answers "is this peer a member now?". Certificates come from wherever a driver
// finds them (MembershipService: the run's members dictionary in the DHT); each distinct
// certificate is verified once (its signature check is cached; expiry and revocation are
// checked at every question).
//
// Threading rule: every method locks; safe from any thread.
#pragma once

#include <map>
#include <mutex>
#include <optional>

#include "starling/auth/certificate.hpp"

namespace starling::auth {

enum class MemberStatus : std::uint8_t { member, unknown, expired, revoked };
const char* status_name(MemberStatus s);

class Membership {
 public:
  explicit Membership(Key32 run_key) : run_key_(run_key) {}

  const Key32& run_key() const noexcept { return run_key_; }

  // `bytes` is a certificate published by `owner` (the signer of the record that carried it).
  // Verified against the run key and the owner (the revocation list is not consulted here: a
  // revoked certificate is remembered and reported as revoked). Replaces the owner's known
  // certificate when it was issued later. Errors: malformed, or Refusal words (certificate.hpp).
  result<void> add_certificate(const net::PeerId& owner, BytesView bytes, std::uint64_t now);
  // A signed revocation list for this run: installed when its sequence is above the current
  // one's. Returns whether it was installed; errors when malformed, for another run key or
  // badly signed.
  result<bool> update_revocations(BytesView bytes);

  MemberStatus status(const net::PeerId& peer, std::uint64_t now) const;
  bool admits(const net::PeerId& peer, std::uint64_t now) const {
    return status(peer, now) == MemberStatus::member;
  }

  // The newest revocation list (encoded), if any, and its sequence (0: none).
  std::optional<Bytes> revocations() const;
  std::uint64_t revocation_sequence() const;

  struct Stats {
    std::uint64_t verified = 0;    // certificate signatures checked
    std::uint64_t cache_hits = 0;  // certificates seen again (no signature check)
    std::uint64_t rejected = 0;    // certificates or lists that failed their checks
    std::size_t members = 0;       // certificates held
  };
  Stats stats() const;

 private:
  struct Held {
    Bytes bytes;
    Certificate cert;
  };
  const Key32 run_key_;
  mutable std::mutex mu_;
  std::map<Key32, Held> certs_;  // by member key
  std::optional<RevocationList> revoked_;
  Bytes revoked_bytes_;
  Stats stats_;
};

}  // namespace starling::auth
