// Steps over the caller's flat buffers (StepData) in tests: node i's input and output, the
// step options, the check that every member got the same exact weighted mean; early steps
// (begin_on) and the nodes whose round started (RoundStarted).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>

#include "net_harness.hpp"

namespace starling::averaging::test {

struct Flat {
  std::vector<float> in, out;
};

// Node i's input: its tensors' values scaled and shifted (so they differ from the tensors, and
// from round to round with another `shift`); the output starts as NaN.
inline std::shared_ptr<Flat> flat_for(Cluster& c, std::size_t i, float shift = 0.0f) {
  auto f = std::make_shared<Flat>();
  f->in = c.flat(i);
  for (auto& x : f->in) x = x * 0.25f + static_cast<float>(i) + shift;
  f->out.assign(f->in.size(), std::nanf(""));
  return f;
}

inline StepData data_of(const std::shared_ptr<Flat>& f) {
  return StepData{f->in, f->out, f};
}

inline void expect_mean(const std::vector<std::shared_ptr<Flat>>& flats,
                        const std::vector<double>& w) {
  double wsum = 0;
  for (double x : w) wsum += x;
  const auto& ref = flats[0]->out;
  for (const auto& f : flats)
    ASSERT_EQ(std::memcmp(f->out.data(), ref.data(), ref.size() * sizeof(float)), 0);
  for (std::size_t e = 0; e < ref.size(); ++e) {
    double want = 0;
    for (std::size_t j = 0; j < flats.size(); ++j) want += w[j] / wsum * flats[j]->in[e];
    ASSERT_NEAR(ref[e], want, 2e-5 * (1 + std::abs(want))) << "element " << e;
  }
}

inline StepOptions flat_options(double weight) {
  StepOptions so;
  so.weight = weight;
  so.timeout = 90s;
  so.matchmaking_timeout = 20s;
  so.data_timeout = 60s;
  return so;
}

// Counts the nodes whose round started (a phase that is not matchmaking). Declare it before
// the cluster it hooks: the cluster's shutdown still reports phases.
struct RoundStarted {
  std::mutex m;
  std::condition_variable cv;
  std::set<std::size_t> nodes;
  void hook(Cluster& c) {
    c.on_phase = [this](std::size_t i, const std::string& ph) {
      if (ph.rfind("matchmaking", 0) == 0) return;
      std::lock_guard lock(m);
      nodes.insert(i);
      cv.notify_all();
    };
  }
  bool wait_for(std::size_t n, Duration d) {
    std::unique_lock lock(m);
    return cv.wait_for(lock, d, [&] { return nodes.size() >= n; });
  }
};

inline std::shared_ptr<PendingStep> begin_on(Cluster& c, std::size_t i, StepOptions o) {
  auto r =
      c.node(i).run([a = c.node(i).avg, o]() -> awaitable<result<std::shared_ptr<PendingStep>>> {
        co_return a->begin(o);
      });
  if (!r) throw std::runtime_error("begin: " + r.error().message());
  return r.value();
}

}  // namespace starling::averaging::test
