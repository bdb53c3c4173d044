#include "starling/dht/error.hpp"

#include <string>

namespace starling::dht {

namespace {
class DhtCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "dht"; }
  std::string message(int v) const override {
    switch (static_cast<dht_errc>(v)) {
      case dht_errc::ok:
        return "ok";
      case dht_errc::missing_signature:
        return "owned record without signature";
      case dht_errc::bad_signature:
        return "invalid owner signature";
      case dht_errc::multiple_owners:
        return "key and sub-key name different owners";
      case dht_errc::bad_owner_marker:
        return "malformed owner marker";
      case dht_errc::unexpected_signature:
        return "signature on an unowned record";
      case dht_errc::signature_window:
        return "outside the signed validity window";
      case dht_errc::stale:
        return "older than the stored record";
      case dht_errc::expired:
        return "expired record";
      case dht_errc::schema:
        return "rejected by schema";
      case dht_errc::capacity:
        return "record store full";
    }
    return "unknown dht error";
  }
};
}  // namespace

const std::error_category& dht_category() noexcept {
  static const DhtCategory c;
  return c;
}

}  // namespace starling::dht
