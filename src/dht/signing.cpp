#include "starling/dht/signing.hpp"

#include <algorithm>
#include <string_view>

#include "starling/dht/error.hpp"

namespace starling::dht {

namespace {
constexpr std::string_view kMarkerOpen = "[owner:";
constexpr std::string_view kDomainTag = "/starling/dht/record/1";

void append_lp(Bytes& out, BytesView b) {
  append_uvarint(out, b.size());
  out.insert(out.end(), b.begin(), b.end());
}
}  // namespace

std::string owner_marker(const net::PeerId& peer) {
  return std::string(kMarkerOpen) + peer.to_string() + "]";
}

result<std::vector<net::PeerId>> owners_in(BytesView text) {
  std::vector<net::PeerId> out;
  const std::string_view s = as_string(text);
  std::size_t pos = 0;
  while ((pos = s.find(kMarkerOpen, pos)) != std::string_view::npos) {
    const std::size_t start = pos + kMarkerOpen.size();
    const std::size_t end = s.find(']', start);
    if (end == std::string_view::npos)
      return make_error(dht_errc::bad_owner_marker, "unterminated [owner: marker");
    auto peer = net::PeerId::from_string(s.substr(start, end - start));
    if (!peer)
      return make_error(dht_errc::bad_owner_marker, "owner marker: " + peer.error().message());
    auto pk = peer.value().public_key();
    if (!pk || pk->type() != crypto::KeyType::ed25519)
      return make_error(dht_errc::bad_owner_marker, "owner marker " + peer.value().to_string() +
                                                        " does not inline an Ed25519 public key");
    if (std::find(out.begin(), out.end(), peer.value()) == out.end())
      out.push_back(std::move(peer).value());
    pos = end + 1;
  }
  return out;
}

Bytes signing_payload(const RecordKey& key, const std::optional<SubKey>& subkey,
                      const RecordBody& body) {
  Bytes out;
  out.reserve(kDomainTag.size() + key.raw().size() + body.value.size() +
              (subkey ? subkey->raw().size() : 0) + 48);
  out.insert(out.end(), kDomainTag.begin(), kDomainTag.end());
  out.push_back(0);
  append_lp(out, key.raw());
  if (subkey) {
    out.push_back(1);
    append_lp(out, subkey->raw());
  } else {
    out.push_back(0);
  }
  append_lp(out, body.value);
  append_be64(out, body.version);
  append_be64(out, static_cast<std::uint64_t>(body.lifetime.count()));
  return out;
}

void sign_record(const crypto::KeyPair& owner, const RecordKey& key,
                 const std::optional<SubKey>& subkey, RecordBody& body) {
  body.signature = owner.sign(signing_payload(key, subkey, body));
}

Record make_signed_record(const crypto::KeyPair& owner, const RecordKey& key,
                          std::optional<SubKey> subkey, Bytes value, Millis ttl,
                          std::uint64_t version) {
  Record r;
  r.subkey = std::move(subkey);
  r.body.value = std::move(value);
  r.body.version = version;
  r.body.lifetime = ttl;
  r.ttl = ttl;
  sign_record(owner, key, r.subkey, r.body);
  return r;
}

}  // namespace starling::dht
