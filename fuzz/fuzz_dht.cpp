// libFuzzer target for every DHT message: arbitrary bytes go to the request and response
// decoders, what decodes is re-encoded (and must decode to the same value), and is then fed to
// a DhtCore: requests to handle_request, responses to on_response for an outstanding lookup
// (get and store), store and ping request.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "starling/core/log.hpp"
#include "starling/dht/core.hpp"

using namespace starling;
using namespace starling::dht;

namespace {
struct Fixture {
  crypto::KeyPair me = crypto::KeyPair::from_seed(Bytes(32, 1)).value();
  crypto::KeyPair other = crypto::KeyPair::from_seed(Bytes(32, 2)).value();
  net::PeerId me_id = net::PeerId::from_public_key(me.public_key());
  net::PeerId other_id = net::PeerId::from_public_key(other.public_key());
};
const Fixture& fixture() {
  static const Fixture f;
  return f;
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "fuzz_dht: %s\n", what);
  std::abort();
}

const Now t0{TimePoint{} + std::chrono::hours(1), WallTime(std::chrono::seconds(1'700'000'000))};

DhtCore make_core() {
  DhtConfig cfg;
  cfg.k = 4;
  cfg.replicas = 2;
  return DhtCore(cfg, fixture().me_id, ValidatorChain::standard(), 1, t0.mono);
}

void drain(DhtCore& core) {
  while (core.poll_request()) {
  }
  while (core.poll_result()) {
  }
}

void fuzz_request(BytesView data) {
  auto req = decode_request(data);
  if (!req) return;
  if (decode_request(encode(req.value())).value() != req.value()) die("request round trip");
  DhtCore core = make_core();
  auto resp = core.handle_request(fixture().other_id, req.value(), t0);
  // What we answer must itself decode.
  if (!decode_response(encode(resp))) die("own response does not decode");
  core.handle_request(fixture().other_id, req.value(), Now{t0.mono + 1s, t0.wall});
  core.tick(Now{t0.mono + std::chrono::hours(30), t0.wall});
  drain(core);
}

void fuzz_response(BytesView data) {
  auto resp = decode_response(data);
  if (!resp) return;
  if (decode_response(encode(resp.value())).value() != resp.value()) die("response round trip");
  DhtCore core = make_core();
  // Make `other` known, then start a get and a store (lookups to `other`) and a bootstrap.
  core.handle_request(fixture().other_id,
                      Request{NodeHeader{false, {to_bytes("a")}}, PingRequest{}}, t0);
  core.get(RecordKey::from_string("key"), {}, t0);
  core.get(RecordKey::from_string("key2"), {true}, t0);
  core.store(
      RecordKey::from_string("key3"),
      {Record{SubKey::from_string("s"), RecordBody{to_bytes("v"), 1, {}, {}}, Millis(60000)}}, {},
      t0);
  std::vector<OutgoingRequest> out;
  while (auto r = core.poll_request()) out.push_back(std::move(*r));
  for (const auto& r : out) core.on_response(r.id, resp.value(), t0);
  // Whatever followed (store phase, cache stores, pings) gets the same answer.
  for (int round = 0; round < 3; ++round) {
    out.clear();
    while (auto r = core.poll_request()) out.push_back(std::move(*r));
    for (const auto& r : out) core.on_response(r.id, resp.value(), Now{t0.mono + 1s, t0.wall});
  }
  core.tick(Now{t0.mono + std::chrono::hours(30), t0.wall});
  drain(core);
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  starling::set_log_level("off");  // rejected input is logged; that is expected here
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const BytesView rest(data + 1, size - 1);
  if (data[0] & 1)
    fuzz_response(rest);
  else
    fuzz_request(rest);
  return 0;
}
