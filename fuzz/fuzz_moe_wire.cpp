// libFuzzer target: the /starling/moe/1.0.0 parsers (expert requests, responses, schemas,
// DHT declarations) and the uid/pattern parsers. They must reject bad input with an error,
// never crash; what they accept must re-encode to something they accept again.
#include <cstdint>
#include <string_view>

#include "starling/moe/uid.hpp"
#include "starling/moe/wire.hpp"
#include "starling/pb/moe.pb.h"

using namespace starling;
using namespace starling::moe;

namespace {

WireLimits small_limits() {
  WireLimits l;
  l.max_elements = 1u << 16;  // keeps decodes of fuzzed shapes cheap
  return l;
}

void check_tensors(const std::vector<TensorData>& ts) {
  for (const auto& t : ts) {
    if (t.values.size() != t.numel()) __builtin_trap();
    pb::MoeTensor again;
    averaging::CodecSpec none;
    if (!encode_tensor(none, t.shape, t.values, again)) __builtin_trap();
    auto back = decode_tensor(again, small_limits());
    if (!back || back.value().values != t.values) __builtin_trap();
  }
}

void fuzz_uids(std::string_view text) {
  if (auto u = parse_uid(text)) {
    auto again = parse_uid(u.value().to_string());
    if (!again || !(again.value() == u.value())) __builtin_trap();
    if (declaration_prefixes(u.value()).size() != u.value().coords.size()) __builtin_trap();
  }
  if (auto p = expand_pattern(text)) {
    if (p.value().empty() || p.value().size() > kMaxPatternUids) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const BytesView all(data + 1, size - 1);
  switch (data[0] % 5) {
    case 0:
      if (auto r = parse_request(all, small_limits())) check_tensors(r.value().tensors);
      break;
    case 1:
      if (auto r = parse_response(all, small_limits())) check_tensors(r.value());
      break;
    case 2:
      if (auto s = parse_info(all, small_limits())) {
        pb::ExpertInfo m;
        to_proto(s.value(), m);
        auto again = from_proto(m, small_limits());
        if (!again || !(again.value() == s.value())) __builtin_trap();
      }
      break;
    case 3:
      if (auto d = decode_declaration(all)) {
        auto again = decode_declaration(encode_declaration(d.value()));
        if (!again || again.value().coordinate != d.value().coordinate ||
            !(again.value().peer == d.value().peer))
          __builtin_trap();
      }
      break;
    default:
      fuzz_uids(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  }
  return 0;
}
