// libFuzzer target: the accountability statements and evidence (accountability.hpp) and
// accusation records (ban_list.hpp, acct_records.hpp: whole and detached). Decoders must reject bad
// input with an error, never crash; what they accept must re-encode to the same bytes; verifying
// decoded evidence and judging a decoded accusation must not crash.
#include <cstdint>

#include "starling/averaging/accountability.hpp"
#include "starling/averaging/acct_records.hpp"
#include "starling/averaging/ban_list.hpp"
#include "starling/core/log.hpp"

using namespace starling;
using namespace starling::averaging::acct;

namespace {

template <class D>
void roundtrip(BytesView in, D decode) {
  auto s = decode(in);
  if (!s) return;
  const Bytes again = encode(s.value());
  if (again.size() != in.size() || !std::equal(again.begin(), again.end(), in.begin()))
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool quiet = [] {
    set_log_level("off");
    return true;
  }();
  (void)quiet;
  if (size < 1) return 0;
  BytesView in(data + 1, size - 1);
  switch (data[0] % 7) {
    case 0:
      roundtrip(in, decode_commitment);
      break;
    case 1:
      roundtrip(in, decode_receipt);
      break;
    case 2:
      roundtrip(in, decode_reveal);
      break;
    case 3:
      roundtrip(in, decode_report);
      break;
    case 4: {
      auto e = decode_evidence(in);
      if (e) {
        (void)verify_evidence(e.value(), CheckConfig{});
        if (!decode_evidence(encode(e.value()))) __builtin_trap();
      }
      break;
    }
    case 5: {
      auto a = decode_accusation(in);
      if (a) {
        BanList bans(CheckConfig{}, std::chrono::seconds(10));
        (void)bans.add_accusation(a.value(), TimePoint{});
        bans.tick(TimePoint{} + std::chrono::seconds(20));
        if (!decode_accusation(encode(a.value()))) __builtin_trap();
      }
      break;
    }
    case 6: {
      auto d = decode_detached(in);
      if (d) {
        if (!decode_detached(encode(d.value()))) __builtin_trap();
        std::vector<Bytes> none;
        (void)attach(d.value(), none, none);
      }
      break;
    }
  }
  return 0;
}
