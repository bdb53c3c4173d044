// The check of a downloaded training state (state_check.hpp).
#include "state_check.hpp"

#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "starling/training/progress.hpp"
#include "starling/training/state_format.hpp"

namespace starling::collab::detail {
namespace {

namespace sf = training::state_format;

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Adds a floating tensor, as float32 (how the optimizer digests its parameters); false for
// another dtype.
bool digest_tensor(training::StateDigest& d, const sf::TensorView& t) {
  const auto n = static_cast<std::size_t>(t.numel());
  if (t.dtype == sf::Dtype::f32) {
    d.update(t.data.data(), t.data.size());
    return true;
  }
  std::vector<float> f(n);
  const auto* p = t.data.data();
  for (std::size_t i = 0; i < n; ++i) {
    if (t.dtype == sf::Dtype::f64) {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      f[i] = static_cast<float>(v);
    } else if (t.dtype == sf::Dtype::f16 || t.dtype == sf::Dtype::bf16) {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      f[i] =
          t.dtype == sf::Dtype::f16 ? f16_to_f32(h) : std::bit_cast<float>(std::uint32_t{h} << 16);
    } else {
      return false;
    }
  }
  d.update(f.data(), n * sizeof(float));
  return true;
}

}  // namespace

Bytes digest_bytes(std::uint64_t d) {
  Bytes b(8);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(d >> (56 - 8 * i));
  return b;
}

std::uint64_t digest_of(const Bytes& metadata) {
  if (metadata.size() != 8) return 0;
  std::uint64_t d = 0;
  for (auto c : metadata) d = (d << 8) | c;
  return d;
}

result<void> check_training_state(BytesView state, std::uint64_t digest) {
  auto decoded = sf::decode(state);
  if (!decoded) return decoded.error().with_context("downloaded state");
  const auto& s = decoded.value();
  // DiLoCo: the anchors, in index order.
  std::vector<const sf::TensorView*> anchors;
  for (std::size_t i = 0;; ++i) {
    const auto name = fmt::format("anchor_{}", i);
    const sf::NamedTensor* found = nullptr;
    for (const auto& t : s.extra)
      if (t.name == name) found = &t;
    if (!found) break;
    anchors.push_back(&found->tensor);
  }
  if (!anchors.empty()) {
    training::StateDigest d;
    bool ok = true;
    for (const auto* t : anchors) ok = ok && digest_tensor(d, *t);
    if (ok && d.value() == digest) return success();
  }
  // Otherwise the parameters: a prefix of the model tensors.
  training::StateDigest d;
  for (const auto& t : s.model) {
    if (!digest_tensor(d, t.tensor)) break;
    if (d.value() == digest) return success();
  }
  return make_error(errc::invalid_argument,
                    fmt::format("downloaded state: its parameters do not have the announced "
                                "digest {:016x}",
                                digest));
}

result<void> StateCheck::operator()(const averaging::StateManifest& m, BytesView data) const {
  const std::uint64_t digest = digest_of(m.metadata);
  if (digest == 0)
    return make_error(errc::invalid_argument, "downloaded state: the donors announce no digest");
  return check_training_state(data, digest);
}

}  // namespace starling::collab::detail
