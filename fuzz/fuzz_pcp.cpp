// Fuzzes the PCP answer parser (net/pcp.hpp): a gateway's datagram. Must never crash; an
// accepted MAP answer re-encodes to the same fields.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "starling/net/pcp.hpp"

using namespace starling;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto r = net::pcp::parse_response(BytesView(data, size));
  if (!r) return 0;
  if (size < net::pcp::kHeaderSize || size > net::pcp::kMaxMessage || size % 4 != 0) std::abort();
  if (r.value().opcode == net::pcp::kOpMap) {
    if (size < net::pcp::kHeaderSize + net::pcp::kMapSize) std::abort();
    if (r.value().internal_port != (data[40] << 8 | data[41])) std::abort();
  }
  return 0;
}
