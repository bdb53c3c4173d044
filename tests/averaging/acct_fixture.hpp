// Test fixtures of the accountability core: a round's members with their keys, their
// statements, and one part's aggregation check case (values, result, reveals, reports).
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <cmath>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "starling/averaging/accountability.hpp"
#include "starling/averaging/robust.hpp"
#include "starling/core/async.hpp"

namespace starling::averaging::acct::test {

struct Fixture {
  std::vector<crypto::KeyPair> keys;
  RoundInfo info;
  Hash32 rid{};
  // key_seed 0: fresh random keys; otherwise keys derived from (key_seed, member), so a case
  // built on them (its round id, seed and projections) is the same in every run.
  explicit Fixture(std::size_t n, std::string ctx = "run/grads/7", std::uint64_t key_seed = 0) {
    info.context = to_bytes(ctx);
    for (std::size_t i = 0; i < n; ++i) {
      keys.push_back(key_seed == 0 ? crypto::KeyPair::generate() : seeded_key(key_seed, i));
      info.members.push_back(key_of(keys.back()));
    }
    rid = round_id(info);
  }
  static crypto::KeyPair seeded_key(std::uint64_t key_seed, std::size_t i) {
    Bytes seed(32, 0);
    for (int b = 0; b < 8; ++b) seed[b] = static_cast<std::uint8_t>(key_seed >> (8 * b));
    seed[8] = static_cast<std::uint8_t>(i);
    seed[9] = static_cast<std::uint8_t>(i >> 8);
    auto k = crypto::KeyPair::from_seed(seed);
    if (!k) throw std::runtime_error("seeded key: " + k.error().message());
    return std::move(k.value());
  }
  Commitment commit(std::uint32_t s, std::vector<std::vector<float>> parts) const {
    Commitment c;
    c.round = rid;
    c.sender = s;
    c.nonce_hash = hash_nonce(Hash32{1, 2, 3});
    for (auto& p : parts) c.parts.push_back(hash_floats(p));
    sign(c, keys[s]);
    return c;
  }
  DataReceipt part(std::uint32_t s, std::uint32_t p, const std::vector<float>& v) const {
    DataReceipt r;
    r.round = rid;
    r.part = p;
    r.signer = s;
    r.data_hash = hash_floats(v);
    sign(r, keys[s]);
    return r;
  }
};

inline std::vector<float> vec(std::size_t n, float base) {
  std::vector<float> v(n);
  for (std::size_t j = 0; j < n; ++j) v[j] = base + static_cast<float>(j) * 0.01f;
  return v;
}

// n members' values for one part, the owner's result (CenteredClip or mean), reveals and
// honest reports.
struct CheckCase {
  Fixture f;
  std::vector<std::vector<float>> g;
  std::vector<float> result;
  DataReceipt res;
  std::vector<Reveal> reveals;
  Hash32 seed{};
  CheckCase(std::size_t n, std::size_t m, Aggregation agg, std::uint64_t s)
      : f(n, "run/grads/7", s) {
    std::mt19937_64 rng(s);
    std::normal_distribution<float> nd(0, 1);
    std::vector<float> base(m);
    for (auto& x : base) x = nd(rng);
    for (std::size_t i = 0; i < n; ++i) {
      g.emplace_back(m);
      for (std::size_t j = 0; j < m; ++j) g[i][j] = base[j] + 0.5f * nd(rng);
    }
    g[n - 1][0] = 1e4f;  // one outlier
    result.assign(m, 0);
    std::vector<std::span<const float>> in(g.begin(), g.end());
    AggregationConfig cfg;
    cfg.kind = agg;
    res.kind = DataKind::result;
    res.round = f.rid;
    res.signer = 0;
    for (std::uint32_t i = 0; i < n; ++i) res.counted.push_back(i);
    if (agg == Aggregation::centered_clip) {
      res.clip = true;
      res.tau = centered_clip_checked(result, in, std::vector<double>(n, 1.0), cfg, CheckConfig{})
                    .stats.tau;
    } else {
      for (std::size_t j = 0; j < m; ++j) {
        double t = 0;
        for (auto& v : g) t += v[j];
        result[j] = static_cast<float>(t / static_cast<double>(n));
      }
    }
    std::vector<Hash32> nonces;
    for (std::uint32_t i = 0; i < n; ++i) {
      Reveal r;
      r.round = f.rid;
      r.member = i;
      r.nonce = Hash32{static_cast<std::uint8_t>(i), static_cast<std::uint8_t>(s)};
      sign(r, f.keys[i]);
      reveals.push_back(r);
      nonces.push_back(r.nonce);
    }
    seed = round_seed(f.rid, nonces);
    seal();
  }
  void seal() {
    double nn = 0;
    for (float x : result) nn += static_cast<double>(x) * x;
    res.norm = std::sqrt(nn);
    res.data_hash = hash_floats(result);
    sign(res, f.keys[0]);
  }
  ProjectionReport report(std::uint32_t i) const {
    ProjectionReport r;
    r.round = f.rid;
    r.member = i;
    r.seed = seed;
    r.result_hash = res.data_hash;
    const auto p = project(seed, 0, 0, g[i], result);
    r.proj = p.proj;
    r.dist = p.dist;
    sign(r, f.keys[i]);
    return r;
  }
  Evidence wrong_average(std::vector<ProjectionReport> rs) const {
    Evidence e;
    e.kind = EvidenceKind::wrong_average;
    e.info = f.info;
    e.receipts = {res};
    e.reveals = reveals;
    e.reports = std::move(rs);
    return e;
  }
  std::vector<ProjectionReport> reports() const {
    std::vector<ProjectionReport> rs;
    for (std::uint32_t i = 0; i < g.size(); ++i) rs.push_back(report(i));
    return rs;
  }
};

template <class T>
awaitable<void> store(awaitable<T> a, std::optional<T>* out) {
  out->emplace(co_await std::move(a));
}

// Runs `a` to completion on `io` (the in-memory directory completes without waiting).
template <class T>
T run(asio::io_context& io, awaitable<T> a) {
  std::optional<T> out;
  asio::co_spawn(io, store(std::move(a), &out), asio::detached);
  io.restart();
  io.run();
  if (!out) throw std::runtime_error("coroutine did not finish");
  return std::move(*out);
}

}  // namespace starling::averaging::acct::test
