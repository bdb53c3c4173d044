// Wire codec of state transfer messages (proto/averaging.proto: StateAnnouncement,
// StateRequest, StateManifest, StateFrame) and manifest checks.
#include "starling/averaging/schema.hpp"
#include "starling/averaging/wire.hpp"
#include "starling/pb/averaging.pb.h"
#include "wire_scan.hpp"

namespace starling::averaging {

const Bytes& blob_kind() {
  static const Bytes kind = blake2b_256(as_bytes(std::string("starling/averaging/blob")));
  return kind;
}

Bytes snapshot_id(const StateManifest& m) {
  Bytes enc = to_bytes("starling-averaging-snapshot-v2");
  auto put = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) enc.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  };
  put(m.epoch);
  put(m.metadata.size());
  enc.insert(enc.end(), m.metadata.begin(), m.metadata.end());
  enc.insert(enc.end(), m.schema_hash.begin(), m.schema_hash.end());
  put(m.size);
  put(m.part_size);
  put(m.part_hashes.size());
  for (const auto& h : m.part_hashes) enc.insert(enc.end(), h.begin(), h.end());
  return blake2b_256(enc);
}

result<void> validate_manifest(const StateManifest& m) {
  if (m.part_size == 0 || m.part_size > wire::kMaxStatePartBytes)
    return make_error(errc::invalid_argument, "manifest: part size must be 1 byte .. 64 MiB");
  if (m.size > wire::kMaxStateBytes)
    return make_error(errc::invalid_argument, "manifest: size above 1 TiB");
  const std::uint64_t parts = (m.size + m.part_size - 1) / m.part_size;
  if (parts != m.part_hashes.size())
    return make_error(errc::invalid_argument, "manifest: " + std::to_string(m.part_hashes.size()) +
                                                  " part hashes for " + std::to_string(parts) +
                                                  " parts");
  for (const auto& h : m.part_hashes)
    if (h.size() != 32) return make_error(errc::invalid_argument, "manifest: part hash length");
  if (snapshot_id(m) != m.snapshot)
    return make_error(errc::invalid_argument, "manifest: snapshot id does not match its contents");
  return success();
}

namespace wire {
namespace {

namespace pb = starling::pb::averaging;

Error bad(std::string what) {
  return Error(errc::invalid_argument, "averaging wire: " + what);
}
Bytes b_of(const std::string& s) {
  return Bytes(s.begin(), s.end());
}
std::string s_of(const Bytes& b) {
  return std::string(b.begin(), b.end());
}

template <class Msg>
Bytes serialize(const Msg& m) {
  Bytes out(m.ByteSizeLong());
  m.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

}  // namespace

Bytes encode_announcement(const StateAnnouncement& a) {
  pb::StateAnnouncement m;
  auto* d = m.mutable_donor();
  d->set_peer(s_of(a.donor.peer.bytes()));
  for (const auto& x : a.donor.addrs) d->add_addrs(x);
  d->set_bandwidth(a.donor.bandwidth);
  d->set_client(a.donor.client);
  m.set_epoch(a.epoch);
  m.set_schema_hash(s_of(a.schema_hash));
  m.set_expires_ms(to_unix_ms(a.expires));
  return serialize(m);
}

result<StateAnnouncement> decode_announcement(BytesView b) {
  ST_TRY(auto m, scan::parse<pb::StateAnnouncement>(b, scan::kStateAnnouncement));
  StateAnnouncement a;
  if (!m.has_donor() || m.donor().peer().empty() || m.donor().peer().size() > kMaxPeerIdLen)
    return bad("announcement donor");
  a.donor.peer = PeerKey(b_of(m.donor().peer()));
  if (static_cast<std::size_t>(m.donor().addrs_size()) > kMaxAddrs)
    return bad("too many addresses");
  for (const auto& x : m.donor().addrs()) {
    if (x.size() > kMaxAddrLen) return bad("address too long");
    a.donor.addrs.push_back(x);
  }
  a.donor.bandwidth = m.donor().bandwidth();
  a.donor.client = m.donor().client();
  a.epoch = m.epoch();
  if (m.schema_hash().size() != 32) return bad("announcement schema hash");
  a.schema_hash = b_of(m.schema_hash());
  a.expires = from_unix_ms(m.expires_ms());
  return a;
}

Bytes encode_state_request(const StateRequest& r) {
  pb::StateRequest m;
  if (r.manifest) m.set_manifest(true);
  if (!r.snapshot.empty()) m.set_snapshot(s_of(r.snapshot));
  for (auto p : r.parts) m.add_parts(p);
  return serialize(m);
}

result<StateRequest> decode_state_request(BytesView b) {
  ST_TRY(auto m, scan::parse<pb::StateRequest>(b, scan::kStateRequest));
  StateRequest r;
  r.manifest = m.manifest();
  if (m.snapshot().size() > 64) return bad("snapshot id length");
  r.snapshot = b_of(m.snapshot());
  if (m.parts_size() > 256) return bad("too many parts in one request");
  for (auto p : m.parts()) r.parts.push_back(p);
  if (!r.manifest && (r.snapshot.empty() || r.parts.empty()))
    return bad("state request asks for nothing");
  return r;
}

Bytes encode_state_frame(const StateFrame& f) {
  pb::StateFrame m;
  if (f.manifest) {
    auto* x = m.mutable_manifest();
    const auto& s = *f.manifest;
    x->set_snapshot(s_of(s.snapshot));
    x->set_epoch(s.epoch);
    x->set_metadata(s_of(s.metadata));
    x->set_schema_hash(s_of(s.schema_hash));
    x->set_size(s.size);
    x->set_part_size(s.part_size);
    for (const auto& h : s.part_hashes) x->add_part_hashes(s_of(h));
  }
  if (f.part) {
    m.set_part(*f.part);
    m.set_payload_len(f.payload_len);
  }
  if (!f.error.empty()) m.set_error(f.error);
  return serialize(m);
}

result<StateFrame> decode_state_frame(BytesView b) {
  ST_TRY(auto m, scan::parse<pb::StateFrame>(b, scan::kStateFrame));
  StateFrame f;
  const int kinds = m.has_manifest() + m.has_part() + m.has_error();
  if (kinds != 1) return bad("state frame must carry exactly one of manifest, part, error");
  if (m.has_error()) {
    f.error = m.error().substr(0, 256);
    if (f.error.empty()) f.error = "unspecified";
    return f;
  }
  if (m.has_part()) {
    f.part = m.part();
    f.payload_len = m.payload_len();
    return f;
  }
  const auto& x = m.manifest();
  StateManifest s;
  if (x.snapshot().size() != 32) return bad("manifest snapshot id length");
  s.snapshot = b_of(x.snapshot());
  s.epoch = x.epoch();
  if (x.metadata().size() > kMaxMetadata) return bad("manifest metadata too large");
  s.metadata = b_of(x.metadata());
  if (x.schema_hash().size() != 32) return bad("manifest schema hash length");
  s.schema_hash = b_of(x.schema_hash());
  s.size = x.size();
  s.part_size = x.part_size();
  if (static_cast<std::size_t>(x.part_hashes_size()) > kMaxStateParts) return bad("too many parts");
  for (const auto& h : x.part_hashes()) s.part_hashes.push_back(b_of(h));
  auto v = validate_manifest(s);
  if (!v) return bad(v.error().context());
  f.manifest = std::move(s);
  return f;
}

}  // namespace wire
}  // namespace starling::averaging
