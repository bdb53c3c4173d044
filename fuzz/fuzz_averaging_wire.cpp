// libFuzzer target: the averaging wire parsers (matchmaking entries, join-stream frames, round
// frames) and the all-reduce core fed with decoded frames from fuzzed members. Parsers must
// reject bad input with an error, never crash; what they accept must re-encode to something
// they accept again; the core must survive any sequence of accepted messages.
#include <cstdint>
#include <cstring>
#include <vector>

#include "starling/averaging/round_core.hpp"
#include "starling/averaging/wire.hpp"

using namespace starling;
using namespace starling::averaging;

namespace {

void round_trip_match(BytesView in) {
  auto m = wire::decode_match(in);
  if (!m) return;
  auto again = wire::decode_match(wire::encode_match(m.value()));
  if (!again) __builtin_trap();
}

void round_trip_entry(BytesView in) {
  auto e = wire::decode_entry(in);
  if (!e) return;
  auto again = wire::decode_entry(wire::encode_entry(e.value()));
  if (!again || !(again.value().info.peer == e.value().info.peer)) __builtin_trap();
}

// Feeds a 4-member round (this core is member 0) with frames cut from the input:
// [from byte][len byte][frame bytes...][payload floats if the frame announces them].
void drive_core(BytesView in) {
  std::vector<float> local(300, 1.0f), out(300);
  std::vector<RoundMember> ms{
      {{10, false}, 1.0}, {{20, false}, 2.0}, {{5, true}, 0.5}, {{7, false}, 0.0}};
  RoundConfig cfg;
  cfg.part_elems = 37;
  TimePoint t{};
  RoundCore core(ms, 0, local, out, cfg, t, t + std::chrono::seconds(100));
  if (!core.start(t)) return;
  std::size_t pos = 0;
  while (pos + 2 <= in.size()) {
    const std::uint32_t from = 1 + in[pos] % 3;
    const std::size_t len = in[pos + 1];
    pos += 2;
    if (pos + len > in.size()) break;
    auto f = wire::decode_round(in.subspan(pos, len), ms.size());
    pos += len;
    t += std::chrono::milliseconds(10);
    core.tick(t);
    if (!f) continue;
    auto* msg = std::get_if<RoundMessage>(&f.value().msg);
    if (!msg) continue;
    std::vector<float> data;
    if (f.value().payload_len > 0) {
      const std::size_t want = std::min<std::uint64_t>(f.value().payload_len, 4096);
      const std::size_t take = std::min(want, in.size() - pos);
      data.resize(take / sizeof(float));
      std::memcpy(data.data(), in.data() + pos, data.size() * sizeof(float));
      pos += take;
    }
    if (auto* p = std::get_if<PartMsg>(msg)) p->data = data;
    if (auto* r = std::get_if<ResultMsg>(msg)) r->data = data;
    (void)core.on_message(from, *msg, t);
    (void)core.take_outbox();
    for (auto& j : core.take_reduce_jobs()) run_reduce_job(j);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  BytesView in(data + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      round_trip_entry(in);
      break;
    case 1:
      round_trip_match(in);
      break;
    case 2: {
      auto r = wire::decode_round(in, 1 + data[0] / 4 % 20);
      if (r) {
        if (auto* m = std::get_if<RoundMessage>(&r.value().msg)) (void)wire::encode_round(*m);
      }
      break;
    }
    default:
      drive_core(in);
      break;
  }
  return 0;
}
