// Testing robustness only (NetCollaborationConfig::attack): the corrupted gradients a gradient
// attacker sends. Never used unless a test or `starling train --attack` asks for it.
#include <cmath>
#include <random>

#include "net_collaboration_impl.hpp"
#include "starling/dht/signing.hpp"
#include "starling/training/progress.hpp"

namespace starling::collab {

bool corrupt_gradient(NetCollaborationConfig::Attack attack, std::span<const float> in,
                      const std::string& round, NetCollaboration::Impl& impl, double& weight) {
  using Attack = NetCollaborationConfig::Attack;
  auto& out = impl.attack_buf;
  switch (attack) {
    case Attack::sign_flip:  // reversed and scaled, claiming 10x the samples
      out.assign(in.begin(), in.end());
      for (auto& x : out) x *= -10.0f;
      weight *= 10;
      return true;
    case Attack::random: {  // noise 100x the gradient's RMS, claiming 10x the samples
      double sq = 0;
      for (float x : in) sq += double(x) * x;
      const double rms = std::sqrt(sq / double(std::max<std::size_t>(1, in.size())));
      std::mt19937 rng(static_cast<std::uint32_t>(std::hash<std::string>{}(round)));
      std::normal_distribution<float> noise(0.0f, static_cast<float>(100 * rms));
      out.resize(in.size());
      for (auto& x : out) x = noise(rng);
      weight *= 10;
      return true;
    }
    case Attack::alie: {
      // "A little is enough": mean - z * std per coordinate, z = 1. The spread of the honest
      // peers' gradients is estimated by the spread of this peer's own recent ones
      // (exponential moving moments, beta 0.9); the first round sends the gradient itself.
      constexpr float kBeta = 0.9f, kZ = 1.0f;
      auto& m = impl.alie_mean;
      auto& s = impl.alie_sq;
      if (m.size() != in.size()) {
        m.assign(in.begin(), in.end());
        s.resize(in.size());
        for (std::size_t i = 0; i < in.size(); ++i) s[i] = in[i] * in[i];
      }
      out.resize(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) {
        m[i] = kBeta * m[i] + (1 - kBeta) * in[i];
        s[i] = kBeta * s[i] + (1 - kBeta) * in[i] * in[i];
        const float sd = std::sqrt(std::max(0.0f, s[i] - m[i] * m[i]));
        out[i] = in[i] - kZ * sd;
      }
      return true;
    }
    case Attack::stale:  // the previous round's gradient (the first round: its own)
      if (impl.stale_prev.size() != in.size()) {
        impl.stale_prev.assign(in.begin(), in.end());
        return false;
      }
      out = impl.stale_prev;
      impl.stale_prev.assign(in.begin(), in.end());
      return true;
    case Attack::inflated:  // its own gradient, claiming 4x the samples
      weight *= 4;
      return false;
    default:
      return false;
  }
}

std::vector<dht::Record> flood_records(NetCollaboration::Impl& impl, BytesView own,
                                       dht::Millis ttl) {
  auto rec = training::decode_progress(own);
  if (!rec) return {};
  const training::ProgressLimits limits;
  rec.value().samples_accumulated =
      std::min<std::uint64_t>(limits.max_samples, rec.value().samples_accumulated * 1000 + 1000);
  rec.value().samples_per_second =
      std::min(limits.max_samples_per_second, rec.value().samples_per_second * 1000 + 1000);
  const Bytes value = training::encode_progress(rec.value());
  while (impl.flood_keys.size() < kFloodIdentities)
    impl.flood_keys.push_back(crypto::KeyPair::generate());
  std::vector<dht::Record> out;
  for (const auto& k : impl.flood_keys) {
    const auto id = net::PeerId::from_public_key(k.public_key());
    dht::SubKey sub(to_bytes("progress" + dht::owner_marker(id)));
    dht::Record r = dht::make_signed_record(k, impl.progress_key, std::move(sub), value, ttl,
                                            impl.flood_clock.next(WallClock::now()));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace starling::collab
