// A joiner's check of a downloaded training state (src/collab/state_check.hpp): the bytes must
// decode as a training state whose parameters have the digest the donors announce. Over the
// network: one donor serves poisoned parameters under the collaboration's digest, at a newer
// epoch than the honest donors (so the choice of snapshot alone would take it); the joiner
// refuses it and ends with the honest state.
#include <gtest/gtest.h>

#include <atomic>

#include "collab/state_check.hpp"
#include "starling/training/progress.hpp"
#include "starling/training/state_format.hpp"
#include "support/crashable_node.hpp"

using namespace starling;
namespace sf = starling::training::state_format;

namespace {

struct Params {
  std::vector<float> w = std::vector<float>(3000), b = std::vector<float>(7);
  std::vector<float> buffer = std::vector<float>(5, 1.0f);
  explicit Params(float seed) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = seed * static_cast<float>(i % 97) - 3.0f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = seed + static_cast<float>(i);
  }
};

BytesView bytes_of(const std::vector<float>& v) {
  return BytesView(reinterpret_cast<const std::uint8_t*>(v.data()), v.size() * sizeof(float));
}

sf::NamedTensor named(std::string name, const std::vector<float>& v) {
  return {std::move(name), {sf::Dtype::f32, {static_cast<std::int64_t>(v.size())}, bytes_of(v)}};
}

// What the optimizer serves: parameters, then buffers (and DiLoCo's anchors as extras).
Bytes encode(const Params& p, bool anchors = false) {
  sf::TrainingState s;
  s.model = {named("w", p.w), named("b", p.b), named("bn.running_mean", p.buffer)};
  if (anchors) s.extra = {named("anchor_0", p.w), named("anchor_1", p.b)};
  auto out = sf::encode(s);
  if (!out) throw std::runtime_error(out.error().message());
  return std::move(out).value();
}

// The optimizer's digest: StateDigest over each parameter's float32 bytes.
std::uint64_t digest(const Params& p) {
  training::StateDigest d;
  d.update(p.w.data(), p.w.size() * sizeof(float));
  d.update(p.b.data(), p.b.size() * sizeof(float));
  return d.value();
}

}  // namespace

TEST(StateCheck, AcceptsTheParametersOfTheDigestOnly) {
  const Params honest(0.5f);
  Params poisoned(0.5f);
  poisoned.w[1234] += 1.0f;
  const auto d = digest(honest);
  EXPECT_TRUE(collab::detail::check_training_state(encode(honest), d));
  EXPECT_TRUE(collab::detail::check_training_state(encode(honest, true), d));
  EXPECT_FALSE(collab::detail::check_training_state(encode(poisoned), d));
  EXPECT_FALSE(collab::detail::check_training_state(encode(honest), d ^ 1));
  Bytes garbage = encode(honest);
  garbage.resize(garbage.size() - 3);
  EXPECT_FALSE(collab::detail::check_training_state(garbage, d));
  // Through the manifest: the digest is its metadata; none is refused.
  averaging::StateManifest m;
  m.metadata = collab::detail::digest_bytes(d);
  EXPECT_TRUE(collab::detail::StateCheck{}(m, encode(honest)));
  m.metadata.clear();
  EXPECT_FALSE(collab::detail::StateCheck{}(m, encode(honest)));
}

namespace {

// A provider serving fixed state bytes (a function object owning them), counting requests.
struct FixedState {
  std::uint64_t epoch, digest;
  std::shared_ptr<const Bytes> bytes;
  std::shared_ptr<std::atomic<int>> asked;
  awaitable<result<training::Collaboration::State>> operator()() const {
    ++*asked;
    training::Collaboration::State s;
    s.epoch = epoch;
    s.bytes = *bytes;
    s.digest = digest;
    co_return s;
  }
};

void serve(test::CrashableNode& n, FixedState f) {
  auto c = n.collaboration();
  auto r = block_on(
      c->executor(),
      [c, f]() -> awaitable<result<void>> {
        c->serve_state(f);
        co_return success();
      },
      10s);
  ASSERT_TRUE(r) << r.error().message();
}

}  // namespace

TEST(StateCheck, JoinerRefusesAPoisonedDonorAndLoadsTheHonestState) {
  collab::NetCollaborationConfig cfg;
  cfg.run_id = "statecheck";
  cfg.open_timeout = 20s;
  std::vector<std::unique_ptr<test::CrashableNode>> nodes;
  nodes.push_back(test::CrashableNode::start({}, cfg));
  const auto seed = nodes[0]->listen_addresses();
  for (int i = 0; i < 3; ++i) nodes.push_back(test::CrashableNode::start(seed, cfg));

  const Params honest(0.5f);
  Params poisoned(0.5f);
  for (auto& x : poisoned.w) x = 1e3f;
  const auto d = digest(honest);
  auto honest_bytes = std::make_shared<const Bytes>(encode(honest));
  auto honest_asked = std::make_shared<std::atomic<int>>(0);
  auto poison_asked = std::make_shared<std::atomic<int>>(0);
  serve(*nodes[0], FixedState{5, d, honest_bytes, honest_asked});
  serve(*nodes[1], FixedState{5, d, honest_bytes, honest_asked});
  // The liar: a newer epoch, the honest digest, other parameters.
  serve(*nodes[2], FixedState{6, d, std::make_shared<const Bytes>(encode(poisoned)), poison_asked});

  // Until the liar's announcement is visible to the joiner (its manifest was asked for).
  auto joiner = nodes[3]->collaboration();
  const TimePoint until = Clock::now() + 90s;
  result<training::Collaboration::State> got = make_error(errc::timeout, "not tried");
  while (*poison_asked == 0 && Clock::now() < until) {
    got = block_on(
        joiner->executor(), [joiner]() { return joiner->download_state(Clock::now() + 30s, 0); },
        40s);
  }
  ASSERT_GT(poison_asked->load(), 0) << "the poisoned donor was never asked";
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got.value().epoch, 5u);
  EXPECT_EQ(got.value().digest, d);
  EXPECT_TRUE(got.value().bytes == *honest_bytes) << "the joiner took the poisoned state";
}
