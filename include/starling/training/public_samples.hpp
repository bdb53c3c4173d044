// Public sample indices for the gradient check (issue 20 item 2c; docs/security.md "Gradient
// check"): under `starling train --grad-check`, sample j (j = 0, 1, ...) that peer P trains
// on toward epoch e of run R is a public function of (R, P, e, j), so anyone holding the
// dataset and the epoch's parameters re-computes P's contribution for e from the sample count
// it declared. Indices are drawn with replacement: blocks of four 64-bit words
// BLAKE2b-256("starling/samples/v1" || len(R) || R || len(P) || P || e || j / 4), word j % 4,
// modulo the dataset size (bias below 2^-40 for datasets under 2^24 samples).
//
// Threading rule: plain functions and values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace starling::training {

class PublicSamples {
 public:
  // `peer`: the peer id string (base58), `n`: the dataset's size (> 0).
  PublicSamples(std::string run, std::string peer, std::uint64_t n);
  // Appends indices first .. first + count - 1 of `epoch` to out.
  void indices(std::uint64_t epoch, std::uint64_t first, std::size_t count,
               std::vector<std::uint32_t>& out) const;
  std::uint64_t dataset_size() const noexcept { return n_; }

 private:
  std::string prefix_;  // the tag, run and peer, length-prefixed
  std::uint64_t n_;
};

}  // namespace starling::training
