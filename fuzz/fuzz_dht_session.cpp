// libFuzzer target for the DHT messages as a DhtNode receives them from the network, in
// sequence against one node: each input is a script of steps run on one DhtCore (so a store
// can be followed by a find of the same key, an eviction ping by its answer, and so on):
//   request  - bytes wrapped as the typed RPC wraps them (google.protobuf.BytesValue), parsed
//              like the RPC server parses them, then answer_request() from one of four peers;
//              the node's own answer must decode;
//   response - bytes handed to accept_response() for the oldest request the core sent;
//   operate  - the core starts a get / latest get / store / find_node / bootstrap;
//   advance  - time moves on (up to 255 s) and the core ticks.
// Step format: 1 byte (kind in the low 2 bits, peer or operation in the next bits), 2 bytes
// length (little endian), payload.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>

#include <google/protobuf/wrappers.pb.h>

#include "starling/core/log.hpp"
#include "starling/dht/node.hpp"

using namespace starling;
using namespace starling::dht;

namespace {
struct Peers {
  std::vector<net::PeerId> ids;
  Peers() {
    for (std::uint8_t i = 1; i <= 5; ++i) {
      auto key = crypto::KeyPair::from_seed(Bytes(32, i)).value();
      ids.push_back(net::PeerId::from_public_key(key.public_key()));
    }
  }
};
const Peers& peers() {
  static const Peers p;
  return p;
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "fuzz_dht_session: %s\n", what);
  std::abort();
}

struct Session {
  Now now{TimePoint{} + std::chrono::hours(1), WallTime(std::chrono::seconds(1'700'000'000))};
  DhtCore core;
  std::deque<OutgoingRequest> sent;

  static DhtConfig config() {
    DhtConfig c;
    c.k = 4;
    c.replicas = 2;
    c.max_stored_keys = 64;
    c.max_stored_bytes = 1 << 20;
    return c;
  }
  Session() : core(config(), peers().ids[0], ValidatorChain::standard(), 1, now.mono) {}

  void collect() {
    while (auto r = core.poll_request()) {
      if (!decode_request(encode(r->request))) die("own request does not decode");
      sent.push_back(std::move(*r));
      if (sent.size() > 256) sent.pop_front();
    }
    while (core.poll_result()) {
    }
  }

  void request(std::uint8_t who, BytesView payload) {
    google::protobuf::BytesValue envelope;
    if (!envelope.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return;
    const auto& from = peers().ids[1 + who % 4];
    auto answer = answer_request(core, from, as_bytes(envelope.value()), now);
    if (answer && !decode_response(answer.value())) die("own response does not decode");
    collect();
  }

  void response(BytesView payload) {
    if (sent.empty()) return;
    const RequestId id = sent.front().id;
    sent.pop_front();
    (void)accept_response(core, id, payload, now);
    collect();
  }

  void operate(std::uint8_t what, BytesView payload) {
    const RecordKey key(Bytes(payload.begin(), payload.end()));
    switch (what % 5) {
      case 0:
        core.get(key, {}, now);
        break;
      case 1:
        core.get(key, {true}, now);
        break;
      case 2: {
        std::vector<Record> recs{
            Record{SubKey::from_string("s"), RecordBody{to_bytes("v"), 1, {}, {}}, Millis(60000)}};
        core.store(key, std::move(recs), {}, now);
        break;
      }
      case 3:
        core.find_node(key.id(), now);
        break;
      default: {
        std::vector<Contact> seeds{Contact::of(peers().ids[1], {to_bytes("a")}),
                                   Contact::of(peers().ids[2], {})};
        core.bootstrap(std::move(seeds), now);
      }
    }
    collect();
  }

  void advance(BytesView payload) {
    const int secs = payload.empty() ? 1 : payload[0];
    now.mono += std::chrono::seconds(secs);
    now.wall += std::chrono::seconds(secs);
    core.tick(now);
    collect();
  }
};
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  starling::set_log_level("off");  // rejected input is logged; that is expected here
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Session s;
  std::size_t at = 0;
  for (int steps = 0; at + 3 <= size && steps < 64; ++steps) {
    const std::uint8_t tag = data[at];
    std::size_t len = data[at + 1] | (std::size_t{data[at + 2]} << 8);
    at += 3;
    len = std::min(len, size - at);
    const BytesView payload(data + at, len);
    at += len;
    switch (tag & 3) {
      case 0:
        s.request(static_cast<std::uint8_t>(tag >> 2), payload);
        break;
      case 1:
        s.response(payload);
        break;
      case 2:
        s.operate(static_cast<std::uint8_t>(tag >> 2), payload);
        break;
      default:
        s.advance(payload);
    }
  }
  s.advance(Bytes{255});
  return 0;
}
