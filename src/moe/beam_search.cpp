// BeamSearchCore (see beam_search.hpp).
#include "starling/moe/beam_search.hpp"

#include <algorithm>
#include <limits>

namespace starling::moe {

BeamSearchCore::BeamSearchCore(std::string grid,
                               std::vector<std::vector<std::vector<float>>> scores, std::size_t k,
                               std::size_t max_expansions)
    : grid_(std::move(grid)), scores_(std::move(scores)), k_(k), max_expansions_(max_expansions) {
  dims_ = scores_.empty() ? 0 : scores_.front().size();
  samples_.resize(scores_.size());
  results_.resize(scores_.size());
  for (std::size_t i = 0; i < scores_.size(); ++i) {
    Sample& s = samples_[i];
    s.rest.assign(dims_ + 1, 0.0f);
    bool empty_dim = scores_[i].size() != dims_;
    for (std::size_t d = dims_; d-- > 0;) {
      const auto& v = d < scores_[i].size() ? scores_[i][d] : std::vector<float>{};
      if (v.empty()) empty_dim = true;
      const float best = v.empty() ? 0.0f : *std::max_element(v.begin(), v.end());
      s.rest[d] = s.rest[d + 1] + best;
    }
    if (k_ == 0 || dims_ == 0 || empty_dim) {
      s.done = true;
      continue;
    }
    s.heap.push_back(Node{s.rest[0], 0.0f, {}});
  }
}

std::string BeamSearchCore::prefix_of(const std::vector<std::uint32_t>& coords) const {
  std::string p = grid_ + ".";
  for (auto c : coords) {
    p += std::to_string(c);
    p += '.';
  }
  return p;
}

void BeamSearchCore::provide(const std::string& prefix, std::vector<std::uint32_t> children) {
  std::sort(children.begin(), children.end());
  children.erase(std::unique(children.begin(), children.end()), children.end());
  known_[prefix] = std::move(children);
  wanted_.erase(prefix);
}

bool BeamSearchCore::advance_sample(std::size_t i) {
  Sample& s = samples_[i];
  const auto& sc = scores_[i];
  while (!s.done) {
    if (results_[i].size() >= k_ || s.heap.empty() || s.expansions >= max_expansions_) {
      s.done = true;
      s.heap.clear();
      break;
    }
    const Node& top = s.heap.front();
    if (top.coords.size() == dims_) {
      results_[i].push_back(ExpertChoice{top.coords, top.score});
      std::pop_heap(s.heap.begin(), s.heap.end());
      s.heap.pop_back();
      continue;
    }
    const std::string prefix = prefix_of(top.coords);
    auto it = known_.find(prefix);
    if (it == known_.end()) {
      wanted_.insert(prefix);
      return false;
    }
    std::pop_heap(s.heap.begin(), s.heap.end());
    Node node = std::move(s.heap.back());
    s.heap.pop_back();
    ++s.expansions;
    const std::size_t d = node.coords.size();
    for (auto c : it->second) {
      if (c >= sc[d].size()) continue;
      Node child;
      child.score = node.score + sc[d][c];
      child.bound = child.score + s.rest[d + 1];
      child.coords = node.coords;
      child.coords.push_back(c);
      s.heap.push_back(std::move(child));
      std::push_heap(s.heap.begin(), s.heap.end());
    }
  }
  return true;
}

bool BeamSearchCore::advance() {
  bool all = true;
  for (std::size_t i = 0; i < samples_.size(); ++i)
    if (!advance_sample(i)) all = false;
  return all;
}

bool BeamSearchCore::done() const {
  return std::all_of(samples_.begin(), samples_.end(), [](const Sample& s) { return s.done; });
}

std::vector<ExpertChoice> exhaustive_top_k(const std::vector<std::vector<float>>& scores,
                                           const std::vector<std::vector<std::uint32_t>>& alive,
                                           std::size_t k) {
  std::vector<ExpertChoice> all;
  for (const auto& coords : alive) {
    if (coords.size() != scores.size()) continue;
    float s = 0;
    bool ok = true;
    for (std::size_t d = 0; d < coords.size(); ++d) {
      if (coords[d] >= scores[d].size()) {
        ok = false;
        break;
      }
      s += scores[d][coords[d]];
    }
    if (ok) all.push_back(ExpertChoice{coords, s});
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const ExpertChoice& a, const ExpertChoice& b) { return a.score > b.score; });
  if (all.size() > k) all.resize(k);
  return all;
}

}  // namespace starling::moe
