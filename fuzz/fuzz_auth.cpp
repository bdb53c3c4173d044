// Fuzzes the private-run parsers (auth/certificate.hpp): membership certificates and revocation
// lists arrive from any peer through the DHT. Decoding either rejects the bytes or yields a
// value that re-encodes to exactly the input; the checks and the Membership registry take
// any bytes without crashing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "starling/auth/membership.hpp"

using namespace starling;

namespace {
void check(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const BytesView in(data, size);
  if (auto c = auth::decode_certificate(in)) {
    check(auth::encode(c.value()) == Bytes(in.begin(), in.end()));
    (void)auth::check_certificate(c.value(), c.value().run_key, c.value().member,
                                  c.value().issued_at, nullptr);
  }
  if (auto l = auth::decode_revocations(in)) {
    check(l.value().entries.size() <= auth::kMaxRevocations);
    check(auth::encode(l.value()) == Bytes(in.begin(), in.end()));
    for (const auto& e : l.value().entries) check(l.value().find(e.member) == &e);
  }
  // The registry with input from a "peer".
  static const auth::Key32 run{};
  auth::Membership m(run);
  const auto peer =
      net::PeerId::from_public_key(crypto::PublicKey(crypto::KeyType::ed25519, Bytes(32, 7)));
  (void)m.add_certificate(peer, in, 1'800'000'000);
  (void)m.update_revocations(in);
  (void)m.status(peer, 1'800'000'000);
  return 0;
}
