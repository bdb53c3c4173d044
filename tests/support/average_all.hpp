// Runs one round on several collaborations at once (one thread each, as separate trainers
// would): collaboration i averages kW-float vector `values[i]` with weight 1 under `key`.
// Used by the private-run tests and bench_private_run.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "starling/core/blocking.hpp"
#include "support/round_data.hpp"

namespace starling::test {

struct RoundOutcome {
  result<training::RoundResult> r = make_error(errc::internal, "not run");
  std::vector<float> w;  // the result (the input if the round failed)
};

struct RoundSpec {
  std::string key;
  std::size_t floats = 1000;
  Duration timeout = 20s;
  std::vector<float> values;          // one per collaboration
  std::vector<std::size_t> expected;  // RoundOptions::expected_members, one per collaboration
  std::size_t expected_group = 0;     // RoundOptions::expected_group (0: none)
  std::size_t live_peers = 0;         // RoundOptions::live_peers (0: unknown)
};

namespace detail {
inline awaitable<result<training::RoundResult>> average_into(
    std::shared_ptr<training::Collaboration> c, std::shared_ptr<RoundOutcome> out,
    training::RoundOptions o) {
  auto d = round_data({{"w", out->w}});
  auto r = co_await c->average(d, o);
  if (r) split(d, {out->w});
  co_return r;
}
}  // namespace detail

template <class C>
std::vector<RoundOutcome> average_all(const std::vector<std::shared_ptr<C>>& cs,
                                      const RoundSpec& spec) {
  std::vector<std::shared_ptr<RoundOutcome>> outs;
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    auto out = std::make_shared<RoundOutcome>();
    out->w.assign(spec.floats, spec.values[i]);
    outs.push_back(out);
    training::RoundOptions o;
    o.key = spec.key;
    o.weight = 1;
    o.deadline = Clock::now() + spec.timeout;
    o.expected_members = spec.expected[i];
    o.expected_group = spec.expected_group;
    o.live_peers = spec.live_peers;
    std::shared_ptr<training::Collaboration> c = cs[i];
    const Duration bound = spec.timeout + 30s;
    threads.emplace_back([c, out, o, bound] {
      out->r = block_on(
          c->executor(), [c, out, o] { return detail::average_into(c, out, o); }, bound);
    });
  }
  for (auto& th : threads) th.join();
  std::vector<RoundOutcome> v;
  for (auto& o : outs) v.push_back(std::move(*o));
  return v;
}

}  // namespace starling::test
