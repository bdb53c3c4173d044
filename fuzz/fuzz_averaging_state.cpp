// libFuzzer target: the averaging messages not covered by fuzz_averaging_wire: state-transfer
// frames (announcement, request, donor frame), manifests, and the compressed all-reduce part
// payload (per-tensor segments, part_codec.hpp). Parsers must reject bad input with an error,
// never crash; what they accept must re-encode to something they accept again.
#include <cstdint>
#include <vector>

#include "averaging/part_codec.hpp"
#include "starling/averaging/wire.hpp"
#include "starling/core/log.hpp"

using namespace starling;
using namespace starling::averaging;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool quiet = [] {
    set_log_level("off");
    return true;
  }();
  (void)quiet;
  if (size < 1) return 0;
  BytesView in(data + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      auto a = wire::decode_announcement(in);
      if (a && !wire::decode_announcement(wire::encode_announcement(a.value()))) __builtin_trap();
      break;
    }
    case 1: {
      auto r = wire::decode_state_request(in);
      if (r && !wire::decode_state_request(wire::encode_state_request(r.value()))) __builtin_trap();
      break;
    }
    case 2: {
      auto f = wire::decode_state_frame(in);
      if (f) {
        if (f.value().manifest && !validate_manifest(*f.value().manifest)) __builtin_trap();
        if (!wire::decode_state_frame(wire::encode_state_frame(f.value()))) __builtin_trap();
      }
      break;
    }
    default: {
      // A compressed part of at most 4096 values; what decodes must have at most that many
      // finite values.
      FloatBuffer out;
      if (detail::TensorCodecs::decode(in, 4096, out)) {
        if (out.size() > 4096) __builtin_trap();
        for (float v : out)
          if (!(v == v) || v - v != 0.0f) __builtin_trap();
      }
      break;
    }
  }
  return 0;
}
