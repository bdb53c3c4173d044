// Fuzzes the multistream-select codec: arbitrary bytes must decode or be rejected, never
// crash; whatever decodes must re-encode to the same bytes. The same bytes as a listener's
// answer to a lazy proposal must parse or be rejected, consuming no more than given.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "starling/net/multistream.hpp"

using namespace starling;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  BytesView in(data, size);
  auto answer = net::multistream_parse_answer(in, "/x/1.0.0");
  if (answer && answer.value() && (*answer.value() == 0 || *answer.value() > size)) std::abort();
  while (!in.empty()) {
    auto r = net::multistream_decode(in);
    if (!r || !r.value()) break;
    auto& m = *r.value();
    if (m.consumed == 0 || m.consumed > in.size()) std::abort();
    auto again = net::multistream_encode(m.text);
    if (again.size() != m.consumed || !std::equal(again.begin(), again.end(), in.begin()))
      std::abort();
    in = in.subspan(m.consumed);
  }
  return 0;
}
