// Fuzzes peer-id strings and bytes, public/private key protobufs and base58/base32 decoding,
// checking that everything accepted re-encodes to an equal value (and byte-exactly where the
// encoding is canonical).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "starling/core/base58.hpp"
#include "starling/net/peer_id.hpp"

using namespace starling;
using starling::net::PeerId;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void check_id(const PeerId& id) {
  check(id.valid());
  auto s = id.to_string();
  auto back = PeerId::from_string(s);
  check(back && back.value() == id);
  auto again = PeerId::from_bytes(id.bytes());
  check(again && again.value() == id);
  check(std::hash<PeerId>{}(again.value()) == std::hash<PeerId>{}(id));
  if (auto key = id.public_key()) check(PeerId::from_public_key(*key) == id);
  (void)id.short_string();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  BytesView bytes(data, size);
  std::string_view text = as_string(bytes);

  if (auto id = PeerId::from_bytes(bytes)) {
    check(copy_bytes(id.value().bytes()) == Bytes(bytes.begin(), bytes.end()));
    check_id(id.value());
  }
  if (auto id = PeerId::from_string(text)) check_id(id.value());

  if (auto key = crypto::PublicKey::from_protobuf(bytes)) {
    check(key.value().to_protobuf() == Bytes(bytes.begin(), bytes.end()));  // canonical only
    check_id(PeerId::from_public_key(key.value()));
    (void)key.value().verify(bytes, bytes);
  }
  if (auto kp = crypto::KeyPair::from_private_protobuf(bytes)) {
    auto pb = kp.value().to_private_protobuf();
    check(pb.size() == 68);
    check(crypto::KeyPair::from_private_protobuf(pb).value().public_key() ==
          kp.value().public_key());
  }

  if (auto b = base58_decode(text)) check(base58_encode(b.value()) == text);
  if (auto b = base32_decode(text)) check(base32_encode(b.value()) == text);
  return 0;
}
