#include "starling/dht/messages.hpp"

#include <map>
#include <string>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include "starling/pb/dht.pb.h"

namespace starling::dht {

namespace pb = starling::pb::dht;

namespace {

std::string str(BytesView b) {
  return std::string(as_string(b));
}
Bytes bytes_of(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

void to_pb(const NodeHeader& h, pb::NodeInfo& out) {
  out.set_client_mode(h.client_mode);
  for (const auto& a : h.addrs) out.add_addrs(str(a));
}

void to_pb(const Record& r, pb::Record& out) {
  out.set_has_subkey(r.subkey.has_value());
  if (r.subkey) out.set_subkey(str(r.subkey->raw()));
  out.set_value(str(r.body.value));
  out.set_version(r.body.version);
  out.set_ttl_ms(static_cast<std::uint64_t>(std::max<Millis::rep>(r.ttl.count(), 0)));
  out.set_lifetime_ms(
      static_cast<std::uint64_t>(std::max<Millis::rep>(r.body.lifetime.count(), 0)));
  out.set_signature(str(r.body.signature));
}

Error violation(std::string what) {
  return make_error(errc::protocol_violation, std::move(what));
}
Error too_large(std::string what) {
  return make_error(errc::too_large, std::move(what));
}

result<NodeHeader> from_pb(const pb::NodeInfo& in, const WireLimits& lim) {
  NodeHeader h;
  h.client_mode = in.client_mode();
  if (static_cast<std::size_t>(in.addrs_size()) > lim.max_addrs_per_peer)
    return too_large("sender lists " + std::to_string(in.addrs_size()) + " addresses");
  for (const auto& a : in.addrs()) {
    if (a.size() > lim.max_addr_bytes) return too_large("sender address too long");
    if (a.empty()) return violation("empty sender address");
    h.addrs.push_back(bytes_of(a));
  }
  return h;
}

result<Record> from_pb(const pb::Record& in, const WireLimits& lim) {
  Record r;
  if (in.has_subkey()) {
    if (in.subkey().size() > lim.max_subkey_bytes) return too_large("sub-key too long");
    r.subkey = SubKey(bytes_of(in.subkey()));
  } else if (!in.subkey().empty()) {
    return violation("sub-key bytes on a plain record");
  }
  if (in.value().size() > lim.max_value_bytes)
    return too_large("value of " + std::to_string(in.value().size()) + " bytes");
  if (in.signature().size() > lim.max_signature_bytes) return too_large("signature too long");
  if (in.ttl_ms() > kMaxWireMillis || in.lifetime_ms() > kMaxWireMillis)
    return violation("ttl or lifetime out of range");
  if (in.version() > kMaxWireVersion) return violation("version out of range");
  r.body.value = bytes_of(in.value());
  r.body.version = in.version();
  r.body.lifetime = Millis(static_cast<Millis::rep>(in.lifetime_ms()));
  r.body.signature = bytes_of(in.signature());
  r.ttl = Millis(static_cast<Millis::rep>(in.ttl_ms()));
  return r;
}

result<PeerInfo> from_pb(const pb::Peer& in, const WireLimits& lim) {
  ST_TRY(auto id, net::PeerId::from_bytes(as_bytes(in.peer_id())));
  PeerInfo p{std::move(id), {}};
  if (static_cast<std::size_t>(in.addrs_size()) > lim.max_addrs_per_peer)
    return too_large("peer lists " + std::to_string(in.addrs_size()) + " addresses");
  for (const auto& a : in.addrs()) {
    if (a.size() > lim.max_addr_bytes) return too_large("peer address too long");
    if (a.empty()) return violation("empty peer address");
    p.addrs.push_back(bytes_of(a));
  }
  return p;
}

Bytes serialize(const google::protobuf::MessageLite& m) {
  Bytes out(m.ByteSizeLong());
  m.SerializeWithCachedSizesToArray(out.data());
  return out;
}

// The message fields of the schema that hold sub-messages (by field number), so the
// pre-scan can descend into them.
struct Shape {
  std::vector<std::pair<int, const Shape*>> children;
  const Shape* child(int field) const {
    for (const auto& [f, s] : children)
      if (f == field) return s;
    return nullptr;
  }
};
const Shape kRecord{}, kPeer{}, kNodeInfo{}, kFindRequest{}, kStoreResponse{};
const Shape kStoreItem{{{2, &kRecord}}};                      // records
const Shape kStoreRequest{{{1, &kStoreItem}}};                // items
const Shape kFindResult{{{1, &kRecord}}};                     // records
const Shape kFindResponse{{{1, &kFindResult}, {2, &kPeer}}};  // results, peers
const Shape kRequest{{{1, &kNodeInfo}, {3, &kStoreRequest}, {4, &kFindRequest}}};
const Shape kResponse{{{1, &kNodeInfo}, {3, &kStoreResponse}, {4, &kFindResponse}}};

// Counts length-delimited elements (sub-messages, strings, packed arrays) at every level
// before protobuf allocates them: a tiny input must not make the parser build millions of
// empty sub-messages.
bool count_elements(google::protobuf::io::CodedInputStream& in, const Shape& shape,
                    std::size_t& count, std::size_t max) {
  using google::protobuf::internal::WireFormatLite;
  while (std::uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormatLite::SkipField(&in, tag)) return false;
      continue;
    }
    std::uint32_t len = 0;
    if (!in.ReadVarint32(&len)) return false;
    if (++count > max) return false;
    const Shape* child = shape.child(WireFormatLite::GetTagFieldNumber(tag));
    if (!child) {
      if (!in.Skip(static_cast<int>(len))) return false;
      continue;
    }
    auto limit = in.PushLimit(static_cast<int>(len));
    if (!count_elements(in, *child, count, max)) return false;
    in.PopLimit(limit);
  }
  return in.ConsumedEntireMessage();
}

result<void> check_size(BytesView bytes, const WireLimits& lim, const char* what,
                        const Shape& shape) {
  if (bytes.size() > lim.max_message_bytes)
    return too_large(std::string(what) + " of " + std::to_string(bytes.size()) + " bytes");
  google::protobuf::io::CodedInputStream in(bytes.data(), static_cast<int>(bytes.size()));
  std::size_t count = 0;
  if (!count_elements(in, shape, count, lim.max_wire_elements)) {
    if (count > lim.max_wire_elements)
      return too_large(std::string(what) + " with over " + std::to_string(lim.max_wire_elements) +
                       " elements");
    return violation(std::string(what) + " is not a valid protobuf message");
  }
  return success();
}

}  // namespace

Bytes encode(const Request& r) {
  pb::Request m;
  to_pb(r.sender, *m.mutable_sender());
  if (std::holds_alternative<PingRequest>(r.body)) {
    m.mutable_ping();
  } else if (auto* s = std::get_if<StoreRequest>(&r.body)) {
    auto* out = m.mutable_store();
    for (const auto& item : s->items) {
      auto* it = out->add_items();
      it->set_key(str(item.key.raw()));
      for (const auto& rec : item.records) to_pb(rec, *it->add_records());
    }
  } else if (auto* f = std::get_if<FindRequest>(&r.body)) {
    auto* out = m.mutable_find();
    out->set_want_values(f->want_values);
    out->set_value_suffices(f->value_suffices);
    for (const auto& t : f->targets) out->add_targets(str(t.bytes()));
  }
  return serialize(m);
}

Bytes encode(const Response& r) {
  pb::Response m;
  to_pb(r.sender, *m.mutable_sender());
  if (std::holds_alternative<PingResponse>(r.body)) {
    m.mutable_ping();
  } else if (auto* s = std::get_if<StoreResponse>(&r.body)) {
    auto* out = m.mutable_store();
    for (auto st : s->status) out->add_status(static_cast<pb::StoreStatus>(st));
  } else if (auto* f = std::get_if<FindResponse>(&r.body)) {
    auto* out = m.mutable_find();
    std::map<net::PeerId, std::uint32_t> index;  // position in out->peers
    for (const auto& res : f->results) {
      auto* o = out->add_results();
      for (const auto& rec : res.records) to_pb(rec, *o->add_records());
      for (const auto& p : res.peers) {
        auto [it, fresh] = index.emplace(p.peer, static_cast<std::uint32_t>(index.size()));
        if (fresh) {
          auto* po = out->add_peers();
          po->set_peer_id(str(p.peer.bytes()));
          for (const auto& a : p.addrs) po->add_addrs(str(a));
        }
        o->add_peers(it->second);
      }
    }
  }
  return serialize(m);
}

result<Request> decode_request(BytesView bytes, const WireLimits& lim) {
  ST_TRY(check_size(bytes, lim, "request", kRequest));
  pb::Request m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return violation("request is not a valid protobuf message");
  Request r;
  ST_TRY(r.sender, from_pb(m.sender(), lim));
  switch (m.body_case()) {
    case pb::Request::kPing:
      r.body = PingRequest{};
      break;
    case pb::Request::kStore: {
      StoreRequest s;
      std::size_t records = 0;
      for (const auto& item : m.store().items()) {
        if (item.key().size() > lim.max_key_bytes)
          return too_large("store key of " + std::to_string(item.key().size()) + " bytes");
        records += static_cast<std::size_t>(item.records_size());
        if (records > lim.max_records_per_message)
          return too_large("store request with over " +
                           std::to_string(lim.max_records_per_message) + " records");
        StoreItem si{RecordKey(bytes_of(item.key())), {}};
        for (const auto& rec : item.records()) {
          ST_TRY(auto x, from_pb(rec, lim));
          si.records.push_back(std::move(x));
        }
        s.items.push_back(std::move(si));
      }
      r.body = std::move(s);
      break;
    }
    case pb::Request::kFind: {
      FindRequest f;
      f.want_values = m.find().want_values();
      f.value_suffices = m.find().value_suffices();
      if (static_cast<std::size_t>(m.find().targets_size()) > lim.max_targets_per_find)
        return too_large("find request for " + std::to_string(m.find().targets_size()) + " keys");
      for (const auto& t : m.find().targets()) {
        auto id = DhtId::from_bytes(as_bytes(t));
        if (!id) return violation("find target: " + id.error().message());
        f.targets.push_back(id.value());
      }
      r.body = std::move(f);
      break;
    }
    default:
      return violation("request without a body");
  }
  return r;
}

result<Response> decode_response(BytesView bytes, const WireLimits& lim) {
  ST_TRY(check_size(bytes, lim, "response", kResponse));
  pb::Response m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return violation("response is not a valid protobuf message");
  Response r;
  ST_TRY(r.sender, from_pb(m.sender(), lim));
  switch (m.body_case()) {
    case pb::Response::kPing:
      r.body = PingResponse{};
      break;
    case pb::Response::kStore: {
      StoreResponse s;
      if (static_cast<std::size_t>(m.store().status_size()) > lim.max_records_per_message)
        return too_large("store response with too many statuses");
      for (int st : m.store().status()) {
        if (st < 0 || st > static_cast<int>(StoreStatus::full))
          return violation("unknown store status " + std::to_string(st));
        s.status.push_back(static_cast<StoreStatus>(st));
      }
      r.body = std::move(s);
      break;
    }
    case pb::Response::kFind: {
      const auto& f = m.find();
      if (static_cast<std::size_t>(f.peers_size()) > lim.max_peers_per_response)
        return too_large("find response with " + std::to_string(f.peers_size()) + " peers");
      if (static_cast<std::size_t>(f.results_size()) > lim.max_targets_per_find)
        return too_large("find response with " + std::to_string(f.results_size()) + " results");
      std::vector<PeerInfo> peers;
      peers.reserve(static_cast<std::size_t>(f.peers_size()));
      for (const auto& p : f.peers()) {
        auto x = from_pb(p, lim);
        if (!x) return x.error().with_context("find response peer");
        peers.push_back(std::move(x).value());
      }
      FindResponse out;
      std::size_t records = 0;
      for (const auto& res : f.results()) {
        FindResult fr;
        records += static_cast<std::size_t>(res.records_size());
        if (records > lim.max_records_per_message)
          return too_large("find response with too many records");
        if (static_cast<std::size_t>(res.peers_size()) > lim.max_peers_per_target)
          return too_large("find result lists " + std::to_string(res.peers_size()) + " peers");
        for (const auto& rec : res.records()) {
          ST_TRY(auto x, from_pb(rec, lim));
          fr.records.push_back(std::move(x));
        }
        for (std::uint32_t i : res.peers()) {
          if (i >= peers.size()) return violation("find result peer index out of range");
          fr.peers.push_back(peers[i]);
        }
        out.results.push_back(std::move(fr));
      }
      r.body = std::move(out);
      break;
    }
    default:
      return violation("response without a body");
  }
  return r;
}

const char* describe(const Request& r) {
  switch (r.body.index()) {
    case 0:
      return "ping";
    case 1:
      return "store";
    default:
      return "find";
  }
}

const char* describe(const Response& r) {
  switch (r.body.index()) {
    case 0:
      return "ping";
    case 1:
      return "store";
    default:
      return "find";
  }
}

}  // namespace starling::dht
