// Public sample indices of the gradient check (training/public_samples.hpp).
#include <sodium.h>

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "starling/training/public_samples.hpp"

namespace starling::training {
namespace {

void put(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}

// The documented derivation, written out independently: word j % 4 of
// BLAKE2b-256(tag \0 || len(run) || run || len(peer) || peer || epoch || j / 4), mod n.
std::uint32_t reference(const std::string& run, const std::string& peer, std::uint64_t epoch,
                        std::uint64_t j, std::uint64_t n) {
  std::string in = std::string("starling/samples/v1") + '\0';
  put(in, run.size());
  in += run;
  put(in, peer.size());
  in += peer;
  put(in, epoch);
  put(in, j / 4);
  unsigned char h[32];
  crypto_generichash(h, sizeof h, reinterpret_cast<const unsigned char*>(in.data()), in.size(),
                     nullptr, 0);
  std::uint64_t w = 0;
  for (int i = 0; i < 8; ++i) w |= std::uint64_t{h[(j % 4) * 8 + i]} << (8 * i);
  return static_cast<std::uint32_t>(w % n);
}

TEST(PublicSamples, MatchesTheDocumentedDerivation) {
  const PublicSamples s("run-a", "12D3KooWPeer", 60000);
  std::vector<std::uint32_t> got;
  s.indices(7, 5, 11, got);
  ASSERT_EQ(got.size(), 11u);
  for (std::uint64_t j = 0; j < 11; ++j)
    EXPECT_EQ(got[j], reference("run-a", "12D3KooWPeer", 7, 5 + j, 60000)) << j;
}

TEST(PublicSamples, AnyChunkingGivesTheSameStream) {
  const PublicSamples s("r", "p", 1000);
  std::vector<std::uint32_t> whole, parts;
  s.indices(3, 0, 100, whole);
  for (std::uint64_t first = 0; first < 100; first += 7)
    s.indices(3, first, std::min<std::uint64_t>(7, 100 - first), parts);
  EXPECT_EQ(whole, parts);
  for (auto i : whole) EXPECT_LT(i, 1000u);
}

TEST(PublicSamples, RunPeerAndEpochEachChangeTheStream) {
  auto draw = [](const std::string& run, const std::string& peer, std::uint64_t epoch) {
    std::vector<std::uint32_t> v;
    PublicSamples(run, peer, 60000).indices(epoch, 0, 64, v);
    return v;
  };
  const auto base = draw("run", "peer", 1);
  EXPECT_NE(base, draw("run", "peer", 2));
  EXPECT_NE(base, draw("run", "peeR", 1));
  EXPECT_NE(base, draw("run2", "peer", 1));
  // Length prefixes: moving a byte between run and peer is another stream.
  EXPECT_NE(draw("ab", "c", 1), draw("a", "bc", 1));
  // Spread: 64 draws from 60000 are (almost surely) distinct.
  EXPECT_GT(std::set<std::uint32_t>(base.begin(), base.end()).size(), 60u);
}

TEST(PublicSamples, RejectsAnEmptyDataset) {
  EXPECT_THROW(PublicSamples("r", "p", 0), std::invalid_argument);
}

}  // namespace
}  // namespace starling::training
