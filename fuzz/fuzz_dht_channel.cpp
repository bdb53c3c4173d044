// libFuzzer target for the DHT request channel (`/starling/dht/1.1.0`, channel.hpp) as a
// DhtNode reads it: the input is the byte stream one peer sent on a channel. The first byte
// picks the side: even = this node serves the channel (each frame's message goes through
// answer_request, whose answer must frame and unframe to the same id); odd = this node is the
// requester (the core runs a get first, and each frame whose id is one it sent goes through
// accept_response, as node_channel.cpp's reader does). Frames are cut as the node cuts them:
// a uvarint length, at most channel_frame_limit() bytes, then decode_channel_frame; the first
// malformed frame ends the stream, as it resets the stream in the node.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "starling/core/log.hpp"
#include "starling/dht/channel.hpp"
#include "starling/dht/node.hpp"

using namespace starling;
using namespace starling::dht;

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "fuzz_dht_channel: %s\n", what);
  std::abort();
}

net::PeerId peer(std::uint8_t i) {
  auto key = crypto::KeyPair::from_seed(Bytes(32, i)).value();
  return net::PeerId::from_public_key(key.public_key());
}

struct Side {
  Now now{TimePoint{} + std::chrono::hours(1), WallTime(std::chrono::seconds(1'700'000'000))};
  DhtCore core;
  net::PeerId remote = peer(2);
  std::map<std::uint64_t, RequestId> sent;

  static DhtConfig config() {
    DhtConfig c;
    c.k = 4;
    c.replicas = 2;
    c.max_stored_keys = 64;
    c.max_stored_bytes = 1 << 20;
    c.limits.max_message_bytes = 64 * 1024;
    return c;
  }
  Side() : core(config(), peer(1), ValidatorChain::standard(), 1, now.mono) {}

  void collect() {
    while (auto r = core.poll_request()) sent.emplace(static_cast<std::uint64_t>(r->id), r->id);
    while (core.poll_result()) {
    }
  }

  void serve(const ChannelFrame& f) {
    auto answer = answer_request(core, remote, f.message, now);
    if (!answer) return;
    const Bytes frame = encode_channel_frame(f.id, answer.value());
    auto len = decode_uvarint(frame);
    if (!len || !len.value() || len.value()->value + len.value()->length != frame.size())
      die("own frame has a wrong length");
    auto back = decode_channel_frame(BytesView(frame).subspan(len.value()->length));
    if (!back || back.value().id != f.id) die("own frame does not decode to its id");
    if (!decode_response(back.value().message)) die("own response does not decode");
    collect();
  }

  void answer(const ChannelFrame& f) {
    auto it = sent.find(f.id);
    if (it == sent.end()) return;  // late or never sent (the node tells these apart by max id)
    const RequestId id = it->second;
    sent.erase(it);
    (void)accept_response(core, id, f.message, now);
    collect();
  }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  starling::set_log_level("off");  // rejected input is logged; that is expected here
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  Side s;
  const bool serving = (data[0] & 1) == 0;
  if (!serving) {
    std::vector<Contact> seeds{Contact::of(s.remote, {}), Contact::of(peer(3), {})};
    s.core.bootstrap(std::move(seeds), s.now);
    s.core.get(RecordKey::from_string("fuzz"), {}, s.now);
    s.collect();
  }
  BytesView in(data + 1, size - 1);
  const std::size_t limit = channel_frame_limit(s.core.config().limits.max_message_bytes);
  for (int frames = 0; !in.empty() && frames < 64; ++frames) {
    auto len = decode_uvarint(in);
    if (!len || !len.value()) break;  // malformed or cut short: the stream ends
    const std::uint64_t n = len.value()->value;
    in = in.subspan(len.value()->length);
    if (n > limit || n > in.size()) break;
    auto f = decode_channel_frame(in.first(static_cast<std::size_t>(n)));
    in = in.subspan(static_cast<std::size_t>(n));
    if (!f) break;
    if (serving)
      s.serve(f.value());
    else
      s.answer(f.value());
  }
  return 0;
}
