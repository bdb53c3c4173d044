// Public sample indices (public_samples.hpp).
#include "starling/training/public_samples.hpp"

#include <sodium.h>

#include <stdexcept>

namespace starling::training {
namespace {
void put_u64(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
}  // namespace

PublicSamples::PublicSamples(std::string run, std::string peer, std::uint64_t n) : n_(n) {
  if (n == 0) throw std::invalid_argument("PublicSamples: empty dataset");
  prefix_ = "starling/samples/v1";
  prefix_.push_back('\0');
  put_u64(prefix_, run.size());
  prefix_ += run;
  put_u64(prefix_, peer.size());
  prefix_ += peer;
}

void PublicSamples::indices(std::uint64_t epoch, std::uint64_t first, std::size_t count,
                            std::vector<std::uint32_t>& out) const {
  std::string in = prefix_;
  put_u64(in, epoch);
  const std::size_t at = in.size();
  put_u64(in, 0);
  std::uint64_t block = ~std::uint64_t{0};
  std::uint8_t h[32];
  for (std::uint64_t j = first; j < first + count; ++j) {
    if (j / 4 != block) {
      block = j / 4;
      for (int i = 0; i < 8; ++i) in[at + i] = static_cast<char>(block >> (8 * i));
      crypto_generichash(h, sizeof h, reinterpret_cast<const unsigned char*>(in.data()), in.size(),
                         nullptr, 0);
    }
    std::uint64_t w = 0;
    for (int i = 0; i < 8; ++i) w |= std::uint64_t{h[(j % 4) * 8 + i]} << (8 * i);
    out.push_back(static_cast<std::uint32_t>(w % n_));
  }
}

}  // namespace starling::training
