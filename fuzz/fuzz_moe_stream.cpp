// libFuzzer target: the streamed-call frames of /starling/moe/1.0.0 (moe/stream.hpp). Two
// modes: raw frames (length-prefixed byte strings fed to the assembler as they are), and
// valid streams built by the slicer from fuzzed shapes, chunk size and codec, then damaged
// (a frame dropped, repeated, swapped or truncated). The assembler must refuse bad streams
// with an error, never crash; what it completes must hold exactly the values of its shapes,
// and an undamaged stream must come back exactly (codec none) or complete (lossy codecs).
#include <cstdint>
#include <cstring>
#include <vector>

#include "starling/moe/stream.hpp"
#include "starling/pb/moe.pb.h"

using namespace starling;
using namespace starling::moe;

namespace {

WireLimits small_limits() {
  WireLimits l;
  l.max_stream_elements = 1u << 14;  // keeps allocations of fuzzed shapes cheap
  l.max_chunk_elements = 1u << 12;
  return l;
}

struct Input {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
};

void check_complete(StreamAssembler& a) {
  if (a.complete() != static_cast<bool>(a.finish())) __builtin_trap();
  if (!a.complete()) return;
  const auto shapes = a.header().shapes;
  auto ts = a.take();
  if (ts.size() != shapes.size()) __builtin_trap();
  for (std::size_t i = 0; i < ts.size(); ++i)
    if (ts[i].shape != shapes[i] || ts[i].values.size() != ts[i].numel()) __builtin_trap();
}

void raw_frames(Input in) {
  StreamAssembler a(small_limits());
  while (in.n >= 2) {
    std::size_t len = in.byte();
    len = (len << 8) | in.byte();
    len = std::min(len, in.n);
    (void)a.feed_bytes(BytesView(in.p, len));
    in.p += len;
    in.n -= len;
  }
  check_complete(a);
}

void damaged_stream(Input in) {
  std::vector<TensorData> ts(1 + in.byte() % 2);
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<std::span<const float>> spans;
  for (auto& t : ts) {
    const std::size_t rank = in.byte() % 4;
    for (std::size_t d = 0; d < rank; ++d) t.shape.push_back(in.byte() % 24);
    t.values.resize(t.numel());
    for (std::size_t i = 0; i < t.values.size(); ++i)
      t.values[i] = static_cast<float>(static_cast<std::int8_t>(in.byte())) / 16.0f;
    shapes.push_back(t.shape);
    spans.emplace_back(t.values);
  }
  static const averaging::CodecId codecs[] = {averaging::CodecId::none, averaging::CodecId::float16,
                                              averaging::CodecId::uniform8,
                                              averaging::CodecId::blockwise8};
  const averaging::CodecSpec codec{codecs[in.byte() % 4]};
  pb::MoeStreamHeader h;
  h.set_uid("ffn.1");
  StreamSlicer slicer(h, shapes, spans, codec, 1 + in.byte() % 97);
  std::vector<std::string> frames;
  for (;;) {
    auto f = slicer.next();
    if (!f) __builtin_trap();  // finite values, matching shapes: never an error
    if (!f.value()) break;
    frames.push_back(f.value()->SerializeAsString());
  }
  const std::uint8_t damage = in.byte();
  const std::size_t at = frames.empty() ? 0 : in.byte() % frames.size();
  switch (damage % 5) {
    case 0:
      break;  // intact
    case 1:
      frames.erase(frames.begin() + static_cast<std::ptrdiff_t>(at));
      break;
    case 2:
      frames.insert(frames.begin() + static_cast<std::ptrdiff_t>(at), frames[at]);
      break;
    case 3:
      std::swap(frames[at], frames[(at + 1) % frames.size()]);
      break;
    default:
      frames[at].resize(frames[at].size() * in.byte() / 256);
  }
  StreamAssembler a(small_limits());
  bool ok = true;
  for (const auto& f : frames) ok = a.feed_bytes(as_bytes(f)) && ok;
  if (damage % 5 == 0) {
    if (!ok || !a.complete()) __builtin_trap();
    if (codec.codec == averaging::CodecId::none) {
      auto got = a.take();
      for (std::size_t i = 0; i < ts.size(); ++i)
        if (got[i].values != ts[i].values) __builtin_trap();
      return;
    }
  }
  check_complete(a);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  Input in{data + 1, size - 1};
  if (data[0] % 2)
    damaged_stream(in);
  else
    raw_frames(in);
  return 0;
}
