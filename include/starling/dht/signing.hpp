// Owned records. A key or sub-key that contains the marker "[owner:<base58 peer id>]" (an
// Ed25519 libp2p peer id, "12D3KooW...") can be written only with that owner's signature.
//
// The signature covers, length-prefixed and after a domain tag, the key bytes, the sub-key
// (or its absence), the value, the version and the signed lifetime. So a signature cannot be
// moved to another key, sub-key or value (re-targeting), and an old record cannot be replayed
// over a newer one (versions order them; the newer one wins every merge). An old record can
// neither be brought back after its life: receivers accept a signed record only while
//   version <= now + max_clock_skew   and   now < version + lifetime + max_clock_skew
// on their own wall clock, and cut its time-to-live to that end. Only this coarse window uses
// wall clocks, with a generous skew bound (10 minutes by default); expiry itself travels as a
// relative time-to-live.
//
// Threading rule: stateless functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "starling/crypto/keys.hpp"
#include "starling/dht/record.hpp"

namespace starling::dht {

// "[owner:12D3KooW...]" for `peer`.
std::string owner_marker(const net::PeerId& peer);
// The owners named in `text` (deduplicated, in order). dht_errc::bad_owner_marker if a marker
// is unterminated or does not hold an Ed25519 peer id.
result<std::vector<net::PeerId>> owners_in(BytesView text);

// The exact bytes an owner signs.
Bytes signing_payload(const RecordKey& key, const std::optional<SubKey>& subkey,
                      const RecordBody& body);

// Sets body.signature to `owner`'s signature of the record.
void sign_record(const crypto::KeyPair& owner, const RecordKey& key,
                 const std::optional<SubKey>& subkey, RecordBody& body);

// A signed record: version `version` (from a VersionClock), lifetime and ttl `ttl`.
Record make_signed_record(const crypto::KeyPair& owner, const RecordKey& key,
                          std::optional<SubKey> subkey, Bytes value, Millis ttl,
                          std::uint64_t version);

}  // namespace starling::dht
