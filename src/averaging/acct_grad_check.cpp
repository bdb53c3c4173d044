// The gradient check's draw (grad_check.hpp).
#include "starling/averaging/grad_check.hpp"

#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <numeric>

namespace starling::averaging::acct {

std::vector<std::uint32_t> grad_check_targets(const Hash32& seed, std::uint32_t members,
                                              std::uint32_t k) {
  std::vector<std::uint32_t> all(members);
  std::iota(all.begin(), all.end(), 0u);
  if (k >= members) return all;
  // A partial Fisher-Yates shuffle driven by a BLAKE2b counter stream over the seed.
  static constexpr char kTag[] = "starling/grad-check/v1";
  std::uint64_t counter = 0;
  auto next = [&]() {
    std::uint8_t in[sizeof kTag + 32 + 8];
    std::memcpy(in, kTag, sizeof kTag);
    std::memcpy(in + sizeof kTag, seed.data(), 32);
    for (int i = 0; i < 8; ++i)
      in[sizeof kTag + 32 + i] = static_cast<std::uint8_t>(counter >> (8 * i));
    ++counter;
    std::uint8_t h[8];
    crypto_generichash(h, sizeof h, in, sizeof in, nullptr, 0);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{h[i]} << (8 * i);
    return v;
  };
  for (std::uint32_t i = 0; i < k; ++i) {
    const std::uint64_t left = members - i;
    const auto j = static_cast<std::uint32_t>(i + next() % left);  // bias < 2^-50 here
    std::swap(all[i], all[j]);
  }
  all.resize(k);
  std::sort(all.begin(), all.end());
  return all;
}

}  // namespace starling::averaging::acct
