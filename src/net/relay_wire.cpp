// Circuit relay v2 wire helpers: message framing and parsing, status names, vouchers.
#include <fmt/format.h>

#include "relay_internal.hpp"
#include "starling/core/bytes.hpp"

namespace starling::net {

namespace {
constexpr std::string_view kVoucherDomain = "libp2p-relay-rsvp";
const Bytes kVoucherType{0x03, 0x02};  // multicodec libp2p-relay-rsvp (0x0302), big-endian

Bytes envelope_signed_bytes(BytesView payload_type, BytesView payload) {
  Bytes out;
  append_uvarint(out, kVoucherDomain.size());
  out.insert(out.end(), kVoucherDomain.begin(), kVoucherDomain.end());
  append_uvarint(out, payload_type.size());
  out.insert(out.end(), payload_type.begin(), payload_type.end());
  append_uvarint(out, payload.size());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}
}  // namespace

std::string_view relay_status_name(int status) {
  switch (status) {
    case 100:
      return "OK";
    case 200:
      return "RESERVATION_REFUSED";
    case 201:
      return "RESOURCE_LIMIT_EXCEEDED";
    case 202:
      return "PERMISSION_DENIED";
    case 203:
      return "CONNECTION_FAILED";
    case 204:
      return "NO_RESERVATION";
    case 400:
      return "MALFORMED_MESSAGE";
    case 401:
      return "UNEXPECTED_MESSAGE";
    default:
      return "unknown status";
  }
}

Bytes encode_message(const google::protobuf::MessageLite& m) {
  Bytes out(m.ByteSizeLong());
  m.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

result<pb::HopMessage> parse_hop(BytesView b) {
  pb::HopMessage m;
  if (b.size() > kMaxRelayMessage || !m.ParseFromArray(b.data(), static_cast<int>(b.size())))
    return make_error(errc::invalid_argument, "malformed hop message");
  return m;
}

result<pb::StopMessage> parse_stop(BytesView b) {
  pb::StopMessage m;
  if (b.size() > kMaxRelayMessage || !m.ParseFromArray(b.data(), static_cast<int>(b.size())))
    return make_error(errc::invalid_argument, "malformed stop message");
  return m;
}

awaitable<result<std::pair<Bytes, Bytes>>> read_relay_message(ByteStream& s, Duration timeout) {
  BufferedReader reader(s);
  auto msg = co_await with_timeout(reader.read_length_prefixed(kMaxRelayMessage), timeout,
                                   "relay message");
  if (!msg) co_return msg.error();
  co_return std::make_pair(std::move(msg).value(), reader.take_buffered());
}

awaitable<result<void>> write_hop_status(ByteStream& s, RelayStatus st) {
  pb::HopMessage m;
  m.set_type(pb::HopMessage::STATUS);
  m.set_status(static_cast<pb::RelayStatus>(st));
  auto bytes = encode_message(m);
  co_return co_await write_length_prefixed(s, bytes);
}

awaitable<result<void>> write_stop_status(ByteStream& s, RelayStatus st) {
  pb::StopMessage m;
  m.set_type(pb::StopMessage::STATUS);
  m.set_status(static_cast<pb::RelayStatus>(st));
  auto bytes = encode_message(m);
  co_return co_await write_length_prefixed(s, bytes);
}

Bytes seal_voucher(const crypto::KeyPair& relay_key, const RelayVoucher& v) {
  // Canonical form: fields in field-number order (protobuf's serializer writes them so).
  pb::Voucher pv;
  pv.set_relay(v.relay.bytes().data(), v.relay.bytes().size());
  pv.set_peer(v.peer.bytes().data(), v.peer.bytes().size());
  pv.set_expiration(v.expiration);
  auto payload = encode_message(pv);
  pb::Envelope env;
  auto pk = relay_key.public_key().to_protobuf();
  env.set_public_key(pk.data(), pk.size());
  env.set_payload_type(kVoucherType.data(), kVoucherType.size());
  env.set_payload(payload.data(), payload.size());
  auto sig = relay_key.sign(envelope_signed_bytes(kVoucherType, payload));
  env.set_signature(sig.data(), sig.size());
  return encode_message(env);
}

result<RelayVoucher> open_voucher(BytesView envelope) {
  pb::Envelope env;
  if (envelope.size() > kMaxRelayMessage ||
      !env.ParseFromArray(envelope.data(), static_cast<int>(envelope.size())))
    return make_error(errc::invalid_argument, "voucher: malformed envelope");
  if (as_bytes(env.payload_type()).size() != kVoucherType.size() ||
      !std::equal(kVoucherType.begin(), kVoucherType.end(), env.payload_type().begin(),
                  [](std::uint8_t a, char b) { return a == static_cast<std::uint8_t>(b); }))
    return make_error(errc::invalid_argument, "voucher: payload type is not 0x0302");
  ST_TRY(auto pk, crypto::PublicKey::from_protobuf(as_bytes(env.public_key())));
  if (!pk.verify(envelope_signed_bytes(kVoucherType, as_bytes(env.payload())),
                 as_bytes(env.signature())))
    return make_error(errc::invalid_argument, "voucher: bad signature");
  pb::Voucher pv;
  if (!pv.ParseFromString(env.payload()))
    return make_error(errc::invalid_argument, "voucher: malformed payload");
  RelayVoucher v;
  ST_TRY(v.relay, PeerId::from_bytes(as_bytes(pv.relay())));
  ST_TRY(v.peer, PeerId::from_bytes(as_bytes(pv.peer())));
  v.expiration = pv.expiration();
  if (PeerId::from_public_key(pk) != v.relay)
    return make_error(errc::invalid_argument, "voucher: not signed by its relay");
  return v;
}

}  // namespace starling::net
