// DHT-specific error codes (category "dht"): why a record was rejected. Generic failures
// (timeouts, sizes, malformed messages) use starling::errc.
//
// Threading rule: stateless.
#pragma once

#include <system_error>

#include "starling/core/error.hpp"

namespace starling::dht {

enum class dht_errc {
  ok = 0,
  missing_signature = 1,  // the key or sub-key names an owner but the record is unsigned
  bad_signature,          // the signature does not verify under the owner's key
  multiple_owners,        // key and sub-key name different owners
  bad_owner_marker,       // an [owner:...] marker that is not a valid Ed25519 peer id
  unexpected_signature,   // a signature on a record nobody owns
  signature_window,       // signed version too far in the future, or signed lifetime over
  stale,                  // older than (or equal to) the record already held
  expired,                // time-to-live is zero
  schema,                 // a schema validator rejected the record
  capacity,               // the local store is full
};

const std::error_category& dht_category() noexcept;
inline std::error_code make_error_code(dht_errc e) noexcept {
  return {static_cast<int>(e), dht_category()};
}

}  // namespace starling::dht

template <>
struct std::is_error_code_enum<starling::dht::dht_errc> : std::true_type {};
