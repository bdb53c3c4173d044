// BeamSearchCore: the I/O-free core of choosing, for every sample of a batch, its k best
// alive experts on a grid. A sample's score of expert (c0, c1, ...) is the sum of its gating
// scores s[0][c0] + s[1][c1] + ...; which experts are alive is learnt prefix by prefix from
// the directory (the children of "ffn." are the alive first coordinates, those of "ffn.3."
// the alive second coordinates under 3, ...).
//
// The search is best-first with an exact bound: a prefix's bound is its score so far plus the
// best score every remaining dimension could add, so experts come out of the queue in
// descending score order. The result is the exact top-k of the alive experts (full or sparse
// grid) and never holds fewer than min(k, alive) experts. Prefix lookups are shared by the
// whole batch: the driver asks wanted(), fetches those prefixes (in parallel), provide()s
// them, and calls advance() until done().
//
// Threading: a plain object of one caller.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "starling/moe/uid.hpp"

namespace starling::moe {

struct ExpertChoice {
  std::vector<std::uint32_t> coords;
  float score = 0;
};

class BeamSearchCore {
 public:
  // scores[sample][dim][index]; every sample has the same number of dimensions (>= 1).
  // `max_expansions` bounds the prefixes one sample may expand (a hostile directory cannot
  // make the search run forever).
  BeamSearchCore(std::string grid, std::vector<std::vector<std::vector<float>>> scores,
                 std::size_t k, std::size_t max_expansions = 4096);

  // Runs every sample as far as the known prefixes allow. True when every sample is done.
  bool advance();
  bool done() const;
  // Prefixes some sample waits for (after advance()).
  std::vector<std::string> wanted() const { return {wanted_.begin(), wanted_.end()}; }
  // The alive coordinates that follow `prefix` (coordinates beyond the gating's range of
  // that dimension are ignored). A prefix provided empty is a dead end.
  void provide(const std::string& prefix, std::vector<std::uint32_t> children);

  // Each sample's choices, best first (valid once done()).
  const std::vector<std::vector<ExpertChoice>>& results() const { return results_; }
  std::string prefix_of(const std::vector<std::uint32_t>& coords) const;

 private:
  struct Node {
    float bound;
    float score;
    std::vector<std::uint32_t> coords;
    bool operator<(const Node& o) const { return bound < o.bound; }
  };
  struct Sample {
    std::vector<Node> heap;   // max-heap on bound
    std::vector<float> rest;  // rest[d] = sum of max scores of dims d.. (rest[D] = 0)
    std::size_t expansions = 0;
    bool done = false;
  };
  bool advance_sample(std::size_t i);

  std::string grid_;
  std::vector<std::vector<std::vector<float>>> scores_;
  std::size_t k_;
  std::size_t max_expansions_;
  std::size_t dims_ = 0;
  std::vector<Sample> samples_;
  std::vector<std::vector<ExpertChoice>> results_;
  std::map<std::string, std::vector<std::uint32_t>> known_;
  std::set<std::string> wanted_;
};

// Exhaustive top-k over the given alive experts (reference for tests and tiny grids).
std::vector<ExpertChoice> exhaustive_top_k(const std::vector<std::vector<float>>& scores,
                                           const std::vector<std::vector<std::uint32_t>>& alive,
                                           std::size_t k);

}  // namespace starling::moe
