// DHT wire messages as C++ values, and their protobuf codec (proto/dht.proto). The protocol
// core works on these structs only; decode_* are the single entry point for untrusted bytes
// and enforce every WireLimits bound, rejecting with errc::too_large or
// errc::protocol_violation and a reason.
//
// Threading rule: stateless functions on plain values.
#pragma once

#include <variant>
#include <vector>

#include "starling/dht/config.hpp"
#include "starling/dht/record.hpp"

namespace starling::dht {

// The sender of a message (see NodeInfo in dht.proto).
struct NodeHeader {
  bool client_mode = false;
  std::vector<Bytes> addrs;
  friend bool operator==(const NodeHeader&, const NodeHeader&) = default;
};

struct PingRequest {
  friend bool operator==(const PingRequest&, const PingRequest&) = default;
};
struct StoreItem {
  RecordKey key;
  std::vector<Record> records;
  friend bool operator==(const StoreItem&, const StoreItem&) = default;
};
struct StoreRequest {
  std::vector<StoreItem> items;
  friend bool operator==(const StoreRequest&, const StoreRequest&) = default;
};
struct FindRequest {
  std::vector<DhtId> targets;
  bool want_values = false;
  bool value_suffices = false;  // a target answered with a plain value may go without peers
  friend bool operator==(const FindRequest&, const FindRequest&) = default;
};
struct Request {
  NodeHeader sender;
  std::variant<PingRequest, StoreRequest, FindRequest> body;
  friend bool operator==(const Request&, const Request&) = default;
};

struct PingResponse {
  friend bool operator==(const PingResponse&, const PingResponse&) = default;
};
enum class StoreStatus : std::uint8_t { accepted = 0, stale = 1, rejected = 2, full = 3 };
struct StoreResponse {
  std::vector<StoreStatus> status;  // one per record, items flattened, in request order
  friend bool operator==(const StoreResponse&, const StoreResponse&) = default;
};
struct PeerInfo {
  net::PeerId peer;
  std::vector<Bytes> addrs;
  friend bool operator==(const PeerInfo&, const PeerInfo&) = default;
};
struct FindResult {
  std::vector<Record> records;
  std::vector<PeerInfo> peers;  // closest first
  friend bool operator==(const FindResult&, const FindResult&) = default;
};
struct FindResponse {
  std::vector<FindResult> results;  // one per target, in request order
  friend bool operator==(const FindResponse&, const FindResponse&) = default;
};
struct Response {
  NodeHeader sender;
  std::variant<PingResponse, StoreResponse, FindResponse> body;
  friend bool operator==(const Response&, const Response&) = default;
};

// Encoding never fails for messages that satisfy the limits (peers shared between results of
// one FindResponse are written once).
Bytes encode(const Request& r);
Bytes encode(const Response& r);
result<Request> decode_request(BytesView bytes, const WireLimits& limits = {});
result<Response> decode_response(BytesView bytes, const WireLimits& limits = {});

// Largest ttl or signed lifetime accepted on the wire (about 139 years), and the largest
// version (2^62 microseconds, year 148,000): above that a record is malformed.
inline constexpr std::uint64_t kMaxWireMillis = std::uint64_t{1} << 42;
inline constexpr std::uint64_t kMaxWireVersion = std::uint64_t{1} << 62;

const char* describe(const Request& r);  // "ping", "store", "find"
const char* describe(const Response& r);

}  // namespace starling::dht
