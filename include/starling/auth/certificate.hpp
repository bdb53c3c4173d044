// Private runs: membership certificates and revocation lists (docs/security.md, "Private
// runs"). A run authority key (Ed25519, kept offline by the organiser) signs a certificate for
// each member's identity key with an expiry, and signs revocation lists. Both are fixed binary
// formats, versioned, each signature over a domain tag and every byte before it, so a
// signature of one kind can never pass as the other or as any other Starling signature.
//
// Certificate (149 bytes, integers big-endian, times in Unix seconds):
//   "SRMC" | version 1 | run key (32) | member key (32) | issued_at (8) | expires_at (8)
//   | Ed25519 signature by the run key of "starling/run-membership/v1\0" || bytes 0..84 (64)
// Revocation list (121 + 40 n bytes, n <= kMaxRevocations, entries sorted by member key):
//   "SRRL" | version 1 | run key (32) | sequence (8) | issued_at (8) | n (4)
//   | n x (member key (32) | revoked_at (8))
//   | Ed25519 signature by the run key of "starling/run-revocations/v1\0" || all before it (64)
// A certificate is revoked when the newest list (highest sequence) names its member with
// revoked_at >= its issued_at: the organiser re-admits a peer by signing a newer certificate.
//
// Threading rule: pure functions and values.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "starling/core/bytes.hpp"
#include "starling/core/clock.hpp"
#include "starling/core/result.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::auth {

using Key32 = std::array<std::uint8_t, 32>;
using Sig64 = std::array<std::uint8_t, 64>;

inline constexpr std::size_t kCertificateBytes = 149;
inline constexpr std::size_t kMaxRevocations = 4096;
inline constexpr std::size_t kRevocationHeaderBytes = 57;
inline constexpr std::size_t kRevocationEntryBytes = 40;
// A certificate issued up to this far in a peer's future (clocks differ) is already valid.
inline constexpr std::uint64_t kClockSkew = 600;

struct Certificate {
  Key32 run_key{};
  Key32 member{};
  std::uint64_t issued_at = 0;   // Unix seconds
  std::uint64_t expires_at = 0;  // Unix seconds; valid while now < expires_at
  Sig64 signature{};
  friend bool operator==(const Certificate&, const Certificate&) = default;
};

struct Revocation {
  Key32 member{};
  std::uint64_t revoked_at = 0;  // certificates issued at or before this are revoked
  friend bool operator==(const Revocation&, const Revocation&) = default;
};

struct RevocationList {
  Key32 run_key{};
  std::uint64_t sequence = 0;  // a higher sequence replaces a lower one
  std::uint64_t issued_at = 0;
  std::vector<Revocation> entries;  // sorted by member key, unique
  Sig64 signature{};
  // The entry for `member`, if any.
  const Revocation* find(const Key32& member) const;
  friend bool operator==(const RevocationList&, const RevocationList&) = default;
};

// Why a certificate does not admit its holder (errors carry errc::permission and one of these
// words first in their message, so logs and tests can tell them apart).
enum class Refusal : std::uint8_t {
  none,
  wrong_key,
  bad_signature,
  wrong_member,
  expired,
  not_yet_valid,
  revoked
};
const char* refusal_name(Refusal r);

// Ed25519 keys as 32 raw bytes. errc::invalid_argument for another key type.
result<Key32> key32(const crypto::PublicKey& key);
result<Key32> member_key(const net::PeerId& peer);  // the peer id's inlined Ed25519 key
crypto::PublicKey public_key(const Key32& k);

Bytes encode(const Certificate& c);
Bytes encode(const RevocationList& l);
// Bounds-checked parsers: errc::invalid_argument on a wrong size, magic or version, too many
// or unsorted entries. They check the format only, not signatures.
result<Certificate> decode_certificate(BytesView in);
result<RevocationList> decode_revocations(BytesView in);

// Signs with the run authority key. issued_at < expires_at is required.
result<Certificate> sign_certificate(const crypto::KeyPair& run_key, const Key32& member,
                                     std::uint64_t issued_at, std::uint64_t expires_at);
// A list with `entries` (sorted and de-duplicated here: the latest revoked_at per member wins).
result<RevocationList> sign_revocations(const crypto::KeyPair& run_key, std::uint64_t sequence,
                                        std::uint64_t issued_at, std::vector<Revocation> entries);

// The signature checks alone.
bool signature_valid(const Certificate& c);
bool signature_valid(const RevocationList& l);

// Whether `c` admits `member` into the run of `run_key` at `now` (Unix seconds), given the
// newest revocation list known (or none). Refusal::none when it does.
Refusal check_certificate(const Certificate& c, const Key32& run_key, const Key32& member,
                          std::uint64_t now, const RevocationList* revocations);
// The time and revocation checks alone, for a certificate whose signature was checked.
Refusal check_validity(const Certificate& c, std::uint64_t now, const RevocationList* revocations);
// The same as a result (errc::permission, "<refusal>: ..." naming the member).
result<void> verify_certificate(const Certificate& c, const Key32& run_key, const Key32& member,
                                std::uint64_t now, const RevocationList* revocations);

// The text form of a run key, as on the command line: the libp2p peer id of the authority's
// Ed25519 key ("12D3KooW..."); parse_run_key also takes 64 hex digits.
std::string format_run_key(const Key32& k);
result<Key32> parse_run_key(std::string_view s);

// Unix seconds of a wall-clock time.
std::uint64_t unix_seconds(WallTime t);

}  // namespace starling::auth
