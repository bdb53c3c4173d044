// Fuzzes the training-state format's torch-free decoder (state_format.hpp): the bytes a joining
// peer receives from a donor by state transfer, and checkpoint payloads. decode either rejects
// the input or yields a state within the limits whose encoding is the input itself (the format
// is canonical) and decodes to an equal value.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "starling/training/state_format.hpp"

using namespace starling;
namespace sf = starling::training::state_format;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void check_tensor(const sf::TensorView& t, const sf::Limits& lim) {
  check(sf::dtype_size(t.dtype) != 0 && t.shape.size() <= lim.max_rank);
  for (auto d : t.shape) check(d >= 0);
  check(static_cast<std::uint64_t>(t.numel()) * sf::dtype_size(t.dtype) == t.data.size());
  (void)sf::all_finite(t);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Small limits, so that the fuzzer reaches them with small inputs.
  sf::Limits lim;
  lim.max_bytes = 1 << 20;
  lim.max_tensors = 64;
  lim.max_rank = 6;
  lim.max_name_bytes = 32;
  lim.max_groups = 8;
  lim.max_group_params = 64;
  lim.max_metadata_bytes = 256;
  BytesView in(data, size);
  auto st = sf::decode(in, lim);
  if (!st) return 0;
  const auto& s = st.value();
  check(s.model.size() <= lim.max_tensors && s.extra.size() <= lim.max_tensors);
  for (const auto& t : s.model) check_tensor(t.tensor, lim);
  for (const auto& t : s.extra) check_tensor(t.tensor, lim);
  if (s.optimizer) {
    check(s.optimizer->groups.size() <= lim.max_groups);
    for (const auto& g : s.optimizer->groups) {
      check(g.states.size() <= g.params);
      for (const auto& p : g.states) {
        check(p.index < g.params);
        for (const auto& slot : p.slots) {
          check(slot.id < sf::slot_names(s.optimizer->kind).size());
          check_tensor(slot.tensor, lim);
        }
      }
    }
  }
  check(s.metadata.size() <= lim.max_metadata_bytes);
  auto again = sf::encode(s, lim);
  check(again.has_value());
  check(again.value().size() == size &&
        std::equal(again.value().begin(), again.value().end(), data));
  auto back = sf::decode(again.value(), lim);
  check(back.has_value() && back.value() == s);
  return 0;
}
