// The training-state format's encoder: one writer, run once to count the bytes and once to
// fill a buffer of that size; the decoder then checks the result (see state_format.hpp).
#include <cstring>

#include <fmt/format.h>

#include "starling/training/state_format.hpp"
#include "state_format_layout.hpp"

namespace starling::training::state_format {
namespace {

using namespace layout;

struct Counter {
  std::size_t n = 0;
  void put(const void*, std::size_t k) { n += k; }
};
struct Filler {
  std::uint8_t* p;
  void put(const void* src, std::size_t k) {
    if (k) std::memcpy(p, src, k);
    p += k;
  }
};

template <class S, class T>
void put_le(S& s, T v) {
  using U = std::make_unsigned_t<T>;
  const auto u = static_cast<U>(v);
  std::uint8_t b[sizeof(T)];
  for (std::size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<std::uint8_t>(u >> (8 * i));
  s.put(b, sizeof(T));
}
template <class S>
void put_f64(S& s, double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, 8);
  put_le(s, bits);
}
template <class S, class Len>
void put_string(S& s, std::string_view str) {
  put_le(s, static_cast<Len>(str.size()));
  s.put(str.data(), str.size());
}

template <class S>
void put_tensor(S& s, const TensorView& t) {
  put_le(s, static_cast<std::uint8_t>(t.dtype));
  put_le(s, static_cast<std::uint8_t>(t.shape.size()));
  for (auto d : t.shape) put_le(s, d);
  s.put(t.data.data(), t.data.size());
}

template <class S>
void put_list(S& s, const std::vector<NamedTensor>& list) {
  put_le(s, static_cast<std::uint32_t>(list.size()));
  for (const auto& t : list) {
    put_string<S, std::uint16_t>(s, t.name);
    put_tensor(s, t.tensor);
  }
}

template <class S>
void put_optimizer(S& s, const OptimizerState& o) {
  put_le(s, static_cast<std::uint8_t>(o.kind));
  put_le(s, static_cast<std::uint32_t>(o.groups.size()));
  for (const auto& g : o.groups) {
    put_le(s, static_cast<std::uint8_t>(g.options.size()));
    for (const auto& opt : g.options) {
      put_string<S, std::uint8_t>(s, opt.name);
      put_f64(s, opt.value);
    }
    put_le(s, g.params);
    put_le(s, static_cast<std::uint32_t>(g.states.size()));
    for (const auto& st : g.states) {
      put_le(s, st.index);
      put_le(s, st.step);
      put_le(s, static_cast<std::uint8_t>(st.slots.size()));
      for (const auto& slot : st.slots) {
        put_le(s, slot.id);
        put_tensor(s, slot.tensor);
      }
    }
  }
}

template <class S, class Body>
void put_section(S& s, std::uint8_t tag, const Body& body) {
  Counter c;
  body(c);
  put_le(s, tag);
  put_le(s, static_cast<std::uint64_t>(c.n));
  body(s);
}

template <class S>
void put_state(S& s, const TrainingState& st) {
  s.put(kMagic, sizeof(kMagic));
  put_le(s, kVersion);
  put_le(s, std::uint32_t{0});
  put_section(s, kModel, [&](auto& b) { put_list(b, st.model); });
  if (st.optimizer) put_section(s, kOptimizer, [&](auto& b) { put_optimizer(b, *st.optimizer); });
  if (!st.extra.empty()) put_section(s, kExtra, [&](auto& b) { put_list(b, st.extra); });
  if (!st.metadata.empty())
    put_section(s, kMetadata, [&](auto& b) { b.put(st.metadata.data(), st.metadata.size()); });
}

}  // namespace

result<Bytes> encode(const TrainingState& state, const Limits& limits) {
  Counter c;
  put_state(c, state);
  if (c.n > limits.max_bytes)
    return Error(errc::too_large,
                 fmt::format("state format: state of {} bytes (limit {})", c.n, limits.max_bytes));
  Bytes out(c.n);
  Filler f{out.data()};
  put_state(f, state);
  // The writer is mechanical; the decoder holds the rules. Decoding touches no tensor data
  // (except bools), so this costs little beside the copy.
  ST_TRY(decode(out, limits));
  return out;
}

}  // namespace starling::training::state_format
