// A group running one accountable all-reduce sub-round in process, over the accountability
// cores (no network): commitments, signed parts, owners' CenteredClip or mean, signed results,
// reveals, projection reports, the aggregation check, accusations and every member's BanList.
// Attackers (test-only) cheat in one of the ways the protocol must catch.
#pragma once

#include <map>
#include <random>
#include <set>
#include <vector>

#include "starling/averaging/accountability.hpp"
#include "starling/averaging/ban_list.hpp"
#include "starling/averaging/robust.hpp"

namespace starling::averaging::acct::sim {

enum class Attack {
  none,
  different_parts,
  wrong_average,
  false_report,
  false_accusation,
  different_commitments,
};
inline const char* to_string(Attack a) {
  const char* names[] = {"none",         "different-parts",  "wrong-average",
                         "false-report", "false-accusation", "different-commitments"};
  return names[static_cast<int>(a)];
}

struct Peer {
  crypto::KeyPair key;
  PubKey pub{};
  bool attacker = false;
  BanList bans{CheckConfig{}, 10s};
};

struct RoundOutcome {
  std::vector<std::uint32_t> members;       // peer indices in group order
  std::vector<std::vector<float>> outputs;  // per group member: the averaged vector
  std::size_t accusations = 0;
};

class Group {
 public:
  Group(std::size_t n_peers, std::vector<std::size_t> attackers, Attack attack,
        Aggregation agg = Aggregation::centered_clip, std::size_t elems = 4096)
      : attack_(attack), elems_(elems) {
    cfg_.kind = agg;
    for (std::size_t i = 0; i < n_peers; ++i) {
      peers_.push_back(Peer{crypto::KeyPair::generate()});
      peers_.back().pub = key_of(peers_.back().key);
    }
    for (auto a : attackers) peers_[a].attacker = true;
  }
  Peer& peer(std::size_t i) { return peers_[i]; }
  std::size_t size() const { return peers_.size(); }

  // One round among the peers no honest peer has banned (bans are decided by evidence, so
  // honest peers agree). `now` advances past the grace period after the accusations.
  RoundOutcome round(std::uint64_t seed, TimePoint& now);

  // Honest peers that ban `k`.
  std::size_t honest_bans_of(const PubKey& k) const {
    std::size_t n = 0;
    for (const auto& p : peers_)
      if (!p.attacker && p.bans.banned(k)) ++n;
    return n;
  }
  std::size_t honest_peers_banned() const {
    std::size_t n = 0;
    for (const auto& p : peers_)
      if (!p.attacker && honest_bans_of(p.pub) > 0) ++n;
    return n;
  }
  CheckConfig check;

 private:
  Attack attack_;
  std::size_t elems_;
  AggregationConfig cfg_;
  std::vector<Peer> peers_;
};

inline RoundOutcome Group::round(std::uint64_t seed, TimePoint& now) {
  RoundOutcome out;
  for (std::uint32_t i = 0; i < peers_.size(); ++i) {
    bool banned = false;
    for (const auto& p : peers_)
      if (!p.attacker && p.bans.banned(peers_[i].pub)) banned = true;
    if (!banned) out.members.push_back(i);
  }
  const std::size_t n = out.members.size();
  RoundInfo info;
  info.context = to_bytes("run/grads/" + std::to_string(seed));
  for (auto m : out.members) info.members.push_back(peers_[m].pub);
  const Hash32 rid = round_id(info);
  auto K = [&](std::size_t i) -> const crypto::KeyPair& { return peers_[out.members[i]].key; };
  auto attacker = [&](std::size_t i) { return peers_[out.members[i]].attacker; };

  // Values: a common direction plus per-member noise; parts: equal slices, part p owned by p.
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> base(elems_);
  for (auto& x : base) x = nd(rng);
  std::vector<std::vector<float>> g(n, std::vector<float>(elems_));
  for (auto& v : g)
    for (std::size_t j = 0; j < elems_; ++j) v[j] = base[j] + 0.5f * nd(rng);
  const std::size_t per = elems_ / n;
  auto lo = [&](std::size_t p) { return p * per; };
  auto len = [&](std::size_t p) { return p + 1 == n ? elems_ - lo(p) : per; };
  auto slice = [&](const std::vector<float>& v, std::size_t p) {
    return std::span<const float>(v.data() + lo(p), len(p));
  };

  // 1. Commitments (and nonces).
  std::vector<Hash32> nonces(n);
  std::vector<Commitment> com(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (auto& b : nonces[i]) b = static_cast<std::uint8_t>(rng());
    com[i].round = rid;
    com[i].sender = static_cast<std::uint32_t>(i);
    com[i].nonce_hash = hash_nonce(nonces[i]);
    for (std::size_t p = 0; p < n; ++p) com[i].parts.push_back(hash_floats(slice(g[i], p)));
    sign(com[i], K(i));
  }
  std::vector<std::vector<Evidence>> found(n);
  // What each member receives: the same commitment from every sender, except that a
  // different-commitments attacker commits its tampered part to that part's owner.
  std::vector<CommitmentLedger> ledger;
  for (std::size_t i = 0; i < n; ++i) ledger.emplace_back(info);
  auto tampered = [&](std::size_t s, std::size_t o) {
    return (attack_ == Attack::different_parts || attack_ == Attack::different_commitments) &&
           attacker(s) && o == (s + 1) % n;
  };
  auto tamper = [](std::vector<float>& d) {
    for (auto& x : d) x = -1000.f * x;
  };
  for (std::size_t o = 0; o < n; ++o) {
    for (std::size_t s = 0; s < n; ++s) {
      Commitment c = com[s];
      if (attack_ == Attack::different_commitments && tampered(s, o)) {
        std::vector<float> d(slice(g[s], o).begin(), slice(g[s], o).end());
        tamper(d);
        c.parts[o] = hash_floats(d);
        sign(c, K(s));
      }
      (void)ledger[o].add(c);
    }
  }

  // 2. Parts to owners, checked against the commitment.
  std::vector<std::vector<float>> result(n);
  std::vector<DataReceipt> res_receipt(n);
  std::vector<std::vector<std::vector<float>>> held(n, std::vector<std::vector<float>>(n));
  std::vector<std::vector<DataReceipt>> part_receipt(n, std::vector<DataReceipt>(n));
  for (std::size_t o = 0; o < n; ++o) {
    std::vector<std::span<const float>> inputs;
    std::vector<double> weights;
    DataReceipt rr;
    rr.kind = DataKind::result;
    rr.round = rid;
    rr.part = static_cast<std::uint32_t>(o);
    rr.signer = static_cast<std::uint32_t>(o);
    for (std::size_t s = 0; s < n; ++s) {
      std::vector<float> data(slice(g[s], o).begin(), slice(g[s], o).end());
      if (tampered(s, o)) tamper(data);  // this owner gets other values than the others
      DataReceipt pr;
      pr.round = rid;
      pr.part = static_cast<std::uint32_t>(o);
      pr.signer = static_cast<std::uint32_t>(s);
      pr.data_hash = hash_floats(data);
      sign(pr, K(s));
      const Commitment& cs = *ledger[o].get(0, static_cast<std::uint32_t>(s));
      if (!check_part(pr, rid, 0, static_cast<std::uint32_t>(o), static_cast<std::uint32_t>(s),
                      info.members[s], data))
        continue;
      if (contradicts(cs, pr)) {
        found[o].push_back(part_mismatch(info, cs, pr));
        continue;  // dropped from the reduction (the real round fences the sender)
      }
      held[o][s] = std::move(data);
      part_receipt[o][s] = pr;
      rr.counted.push_back(static_cast<std::uint32_t>(s));
    }
    for (auto s : rr.counted) {
      inputs.emplace_back(held[o][s]);
      weights.push_back(1.0);
    }
    result[o].assign(len(o), 0.f);
    if (cfg_.kind == Aggregation::centered_clip) {
      rr.clip = true;
      rr.tau = centered_clip_checked(result[o], inputs, weights, cfg_, check).stats.tau;
    } else {
      for (std::size_t j = 0; j < len(o); ++j) {
        double s = 0;
        for (auto& in : inputs) s += in[j];
        result[o][j] = static_cast<float>(s / static_cast<double>(inputs.size()));
      }
    }
    if (attack_ == Attack::wrong_average && attacker(o))
      for (std::size_t j = 0; j < len(o); ++j) result[o][j] += 0.2f * base[lo(o) + j];
    double nn = 0;
    for (float x : result[o]) nn += static_cast<double>(x) * x;
    rr.norm = std::sqrt(nn);
    rr.data_hash = hash_floats(result[o]);
    sign(rr, K(o));
    res_receipt[o] = rr;
  }

  // Members compare the digests of the commitments they hold (in their fin reports) and relay
  // a copy where they differ.
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < n; ++k)
      for (std::uint32_t s = 0; s < n; ++s) {
        const auto d = ledger[k].digest(0, s);
        if (i == k || !d || !ledger[i].differs(0, s, *d)) continue;
        auto e = ledger[i].add(*ledger[k].get(0, s));
        if (e && e.value()) found[i].push_back(std::move(*e.value()));
      }

  // 3. Reveals and the seed; 4. reports from every counted member.
  std::vector<Reveal> reveals(n);
  for (std::size_t i = 0; i < n; ++i) {
    reveals[i].round = rid;
    reveals[i].member = static_cast<std::uint32_t>(i);
    reveals[i].nonce = nonces[i];
    sign(reveals[i], K(i));
  }
  const Hash32 rseed = round_seed(rid, nonces);
  std::vector<std::vector<ProjectionReport>> reports(n);  // per part
  for (std::size_t p = 0; p < n; ++p) {
    for (auto m : res_receipt[p].counted) {
      ProjectionReport r;
      r.round = rid;
      r.part = static_cast<std::uint32_t>(p);
      r.member = m;
      r.seed = rseed;
      r.result_hash = res_receipt[p].data_hash;
      r.weight = 1.0;
      const Projection pj =
          project(rseed, 0, static_cast<std::uint32_t>(p), slice(g[m], p), result[p]);
      r.proj = pj.proj;
      r.dist = pj.dist;
      if (attack_ == Attack::false_report && attacker(m) && !attacker(p)) r.proj += 10 * pj.dist;
      sign(r, K(m));
      reports[p].push_back(r);
    }
  }

  // 5. The aggregation check by every member; owners check the reports of their parts.
  for (std::size_t p = 0; p < n; ++p) {
    const auto fp = check_fixed_point(reports[p], res_receipt[p].clip, res_receipt[p].tau,
                                      res_receipt[p].norm, check);
    for (std::size_t i = 0; i < n && !fp.ok(); ++i) {
      Evidence e;
      e.kind = EvidenceKind::wrong_average;
      e.info = info;
      e.receipts = {res_receipt[p]};
      e.reveals = reveals;
      e.reports = reports[p];
      found[i].push_back(std::move(e));
    }
    for (const auto& r : reports[p]) {
      const Projection pj =
          project(rseed, 0, static_cast<std::uint32_t>(p), held[p][r.member], result[p]);
      Evidence e;
      e.kind = EvidenceKind::false_report;
      e.info = info;
      e.receipts = {part_receipt[p][r.member], res_receipt[p]};
      e.reveals = reveals;
      e.reports = {r};
      e.data = held[p][r.member];
      e.data2 = result[p];
      if (verify_evidence(e, check)) found[p].push_back(std::move(e));
      (void)pj;
    }
  }
  // A false accusation: an attacker "proves" that an honest member sent a part other than the
  // one it committed, by a receipt it altered.
  if (attack_ == Attack::false_accusation) {
    for (std::size_t i = 0; i < n; ++i) {
      if (!attacker(i)) continue;
      const std::size_t victim = (i + 1) % n;
      DataReceipt forged = part_receipt[i][victim];
      forged.data_hash[0] ^= 1;
      found[i].push_back(part_mismatch(info, com[victim], forged));
    }
  }

  // 6. Accusations to everyone (a DHT record each); every peer judges them itself.
  std::vector<Accusation> acc;
  for (std::size_t i = 0; i < n; ++i)
    for (auto& e : found[i]) {
      auto a = make_accusation(std::move(e), K(i));
      auto d = decode_accusation(encode(a));  // through the record's bytes
      if (d) acc.push_back(std::move(d).value());
    }
  out.accusations = acc.size();
  for (auto& p : peers_)
    for (const auto& a : acc) (void)p.bans.add_accusation(a, now);
  now += 11s;
  for (auto& p : peers_) p.bans.tick(now);

  for (std::size_t i = 0; i < n; ++i) {
    std::vector<float> o(elems_);
    for (std::size_t p = 0; p < n; ++p)
      std::copy(result[p].begin(), result[p].end(), o.begin() + lo(p));
    out.outputs.push_back(std::move(o));
  }
  return out;
}

}  // namespace starling::averaging::acct::sim
