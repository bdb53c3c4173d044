// Fuzzes the DCUtR HolePunch parser and feeds what it accepts to both roles' state machines.
// Must never crash; a message that parses must re-encode to one that parses the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "starling/net/dcutr.hpp"

using namespace starling;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  BytesView in(data, size);
  auto m = net::parse_hole_punch(in);
  if (!m) return 0;
  auto again = net::parse_hole_punch(net::encode_hole_punch(m.value()));
  if (!again || again.value().type != m.value().type || again.value().addrs != m.value().addrs)
    std::abort();
  TimePoint t{};
  const std::vector<net::Multiaddr> ours{net::Multiaddr::parse("/ip4/8.8.8.8/tcp/1").value()};
  for (auto role : {net::DcutrRole::initiator, net::DcutrRole::responder}) {
    net::DcutrMachine sm(role, ours);
    (void)sm.start(t);
    for (int i = 0; i < 4 && !sm.done(); ++i) {
      (void)sm.on_message(m.value(), t);
      (void)sm.on_dial_result(false, t);
    }
    (void)net::dcutr_filter(m.value().addrs, size % 2 == 0);
  }
  return 0;
}
