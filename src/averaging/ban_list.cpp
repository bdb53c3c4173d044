// BanList and accusations (ban_list.hpp).
#include "starling/averaging/ban_list.hpp"

#include <algorithm>

#include "averaging/acct_codec.hpp"
#include "starling/core/log.hpp"

namespace starling::averaging::acct {

namespace {

constexpr std::uint8_t kTagAccusation = 0xCA;
constexpr std::string_view kDomAccusation = "starling/acct/accusation/1";

Bytes signed_bytes(const Accusation& a) {
  Bytes out(kDomAccusation.begin(), kDomAccusation.end());
  out.push_back(0);
  out.insert(out.end(), a.accuser.begin(), a.accuser.end());
  const Bytes ev = encode(a.evidence);
  out.insert(out.end(), ev.begin(), ev.end());
  return out;
}

// The peer id of a key (as `starling id` prints it), so that logs name the banned peer.
std::string peer_name(const PubKey& k) {
  return peer_of_key(k).to_string();
}

// What an accusation is about, with its accuser: the kind, the round and the statement naming
// the accused (read unverified: a forged subject fails verification and bans its accuser).
Hash32 subject_of(const Accusation& a) {
  const Evidence& e = a.evidence;
  Writer w;
  w.fixed(a.accuser);
  w.u8(static_cast<std::uint8_t>(e.kind));
  w.fixed(round_id(e.info));
  auto put = [&w](const PubKey& k, std::uint32_t sub, std::uint32_t part) {
    w.fixed(k);
    w.u32(sub);
    w.u32(part);
  };
  if (e.kind == EvidenceKind::false_report && !e.reports.empty()) {
    put(e.reports[0].key, e.reports[0].subround, e.reports[0].part);
  } else if (!e.commitments.empty()) {
    const auto& c = e.commitments[0];
    put(c.key, c.subround, e.receipts.empty() ? 0 : e.receipts[0].part);
  } else if (!e.receipts.empty()) {
    put(e.receipts[0].key, e.receipts[0].subround, e.receipts[0].part);
  }
  return crypto::sha256(w.out);
}

}  // namespace

Accusation make_accusation(Evidence e, const crypto::KeyPair& accuser) {
  Accusation a;
  a.accuser = key_of(accuser);
  a.evidence = std::move(e);
  const Bytes sig = accuser.sign(signed_bytes(a));
  std::copy(sig.begin(), sig.end(), a.sig.begin());
  return a;
}

bool verify_sig(const Accusation& a) {
  const crypto::PublicKey pk(crypto::KeyType::ed25519, Bytes(a.accuser.begin(), a.accuser.end()));
  return pk.verify(signed_bytes(a), BytesView(a.sig.data(), a.sig.size()));
}

Bytes encode(const Accusation& a) {
  Writer w;
  w.u8(kTagAccusation);
  w.fixed(a.accuser);
  const Bytes ev = encode(a.evidence);
  w.u32(static_cast<std::uint32_t>(ev.size()));
  w.raw(ev);
  w.fixed(a.sig);
  return std::move(w.out);
}

result<Accusation> decode_accusation(BytesView b) {
  Reader r(b);
  Accusation a;
  if (r.u8() != kTagAccusation) return r.fail("not an accusation");
  r.fixed(a.accuser);
  const std::uint32_t n = r.u32();
  if (!r.has(n)) return r.fail("accusation: truncated evidence");
  ST_TRY(a.evidence, decode_evidence(r.raw(n)));
  r.fixed(a.sig);
  ST_TRY(r.finish("accusation"));
  return a;
}

bool BanList::known_round(const Evidence& e) const {
  const auto& c = e.info.context;
  return c.size() >= run_prefix_.size() &&
         std::equal(run_prefix_.begin(), run_prefix_.end(), c.begin());
}

result<Verdict> BanList::judge(const Evidence& e) {
  const Hash32 h = crypto::sha256(encode(e));
  auto it = judged_.find(h);
  if (it == judged_.end()) {
    auto v = verify_evidence(e, cfg_);
    Judged j;
    j.ok = v.has_value();
    if (v)
      j.verdict = v.value();
    else
      j.why = v.error().message();
    it = judged_.try_emplace(h, std::move(j)).first;
  }
  if (!it->second.ok) return make_error(errc::invalid_argument, it->second.why);
  return it->second.verdict;
}

void BanList::apply(const Verdict& d, TimePoint now) {
  const Slot slot{d.round, d.subround, d.part};
  if (d.kind == EvidenceKind::false_report) {
    cleared_[slot] = true;
    pending_.erase(slot);
  }
  if (d.pending) {
    if (!cleared_.count(slot) && !banned(d.guilty) && !pending_.count(slot))
      pending_[slot] = Pending{d.guilty, now};
  } else {
    ban(d.guilty, to_string(d.kind), now);
  }
}

result<Verdict> BanList::add_evidence(const Evidence& e, TimePoint now) {
  if (!known_round(e)) {
    logger("averaging")->info("evidence rejected: a round of another run");
    return make_error(errc::not_found, "evidence about a round of another run");
  }
  auto v = judge(e);
  if (!v) {
    logger("averaging")->info("evidence rejected: {}", v.error().message());
    return v;
  }
  apply(v.value(), now);
  return v;
}

bool BanList::seen(const Accusation& a) const {
  return seen_.count(crypto::sha256(BytesView(a.sig.data(), a.sig.size()))) != 0 ||
         subjects_.count(subject_of(a)) != 0;
}

// A verified wrong_average accusation: one member's vote against the owner of its part.
result<Verdict> BanList::vote(const Accusation& a, const Verdict& d, TimePoint now) {
  const auto& members = a.evidence.info.members;
  if (a.accuser == d.guilty ||
      std::find(members.begin(), members.end(), a.accuser) == members.end())
    return make_error(errc::unsupported,
                      "wrong_average accusation by a peer outside the round: not counted");
  const Slot slot{d.round, d.subround, d.part};
  Votes& v = votes_[slot];
  v.owner = d.guilty;
  v.members = members.size();
  v.accusers.insert(a.accuser);
  if (2 * v.accusers.size() > v.members) {
    apply(d, now);
  } else {
    logger("averaging")
        ->info(
            "wrong_average accusation against {}: {} of {} members so far (a majority "
            "suspects)",
            peer_name(d.guilty), v.accusers.size(), v.members);
  }
  return d;
}

void BanList::remember(const ProjectionReport& r) {
  reports_.try_emplace(ReportSlot{r.round, r.subround, r.part, r.member}, r);
}

std::size_t BanList::memory_entries() const {
  return std::max({cleared_.size(), seen_.size(), subjects_.size(), votes_.size(), judged_.size(),
                   reports_.size()});
}

void BanList::expose_conflicts(const Evidence& e, TimePoint now) {
  for (const auto& rp : e.reports) {
    auto it = reports_.find(ReportSlot{rp.round, rp.subround, rp.part, rp.member});
    if (it == reports_.end() || it->second == rp) continue;
    Evidence c = report_conflict(e.info, it->second, rp);
    if (add_evidence(c, now)) found_.push_back(std::move(c));
  }
}

std::size_t BanList::votes(const Hash32& round, std::uint32_t subround, std::uint32_t part) const {
  auto it = votes_.find(Slot{round, subround, part});
  return it == votes_.end() ? 0 : it->second.accusers.size();
}

result<Verdict> BanList::add_accusation(const Accusation& a, TimePoint now) {
  if (!verify_sig(a)) {
    logger("averaging")->info("accusation ignored: bad signature");
    return make_error(errc::invalid_argument, "accusation: bad signature");
  }
  if (banned(a.accuser)) return make_error(errc::invalid_argument, "accusation: accuser banned");
  if (!known_round(a.evidence)) {
    logger("averaging")->info("accusation ignored: a round of another run");
    return make_error(errc::not_found, "accusation about a round of another run");
  }
  // Ed25519 signatures are deterministic and bind the whole record: one judgement each, and
  // one per accuser and subject.
  seen_[crypto::sha256(BytesView(a.sig.data(), a.sig.size()))] = true;
  if (!subjects_.try_emplace(subject_of(a), true).second)
    return make_error(errc::already_exists, "accusation: this accuser's subject was judged");
  auto v = judge(a.evidence);
  if (!v) {
    logger("averaging")->info("evidence rejected: {}", v.error().message());
    ban(a.accuser, "false accusation", now);
    return make_error(errc::invalid_argument, "false accusation: " + v.error().message());
  }
  if (v.value().kind == EvidenceKind::wrong_average) expose_conflicts(a.evidence, now);
  if (v.value().pending) return vote(a, v.value(), now);
  apply(v.value(), now);
  return v;
}

void BanList::tick(TimePoint now) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (now - it->second.since >= grace_) {
      ban(it->second.owner, "wrong_average", now);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

bool BanList::suspected(const PubKey& k) const {
  for (const auto& [slot, p] : pending_)
    if (p.owner == k) return true;
  return false;
}

bool BanList::accused(const PubKey& k) const {
  if (suspected(k)) return true;
  for (const auto& [slot, v] : votes_)
    if (v.owner == k) return true;
  return false;
}

std::vector<BanRecord> BanList::bans() const {
  std::vector<BanRecord> out;
  for (const auto& [k, r] : bans_) out.push_back(r);
  return out;
}

void BanList::ban(const PubKey& k, std::string reason, TimePoint now) {
  if (banned(k)) return;
  logger("averaging")->warn("banned peer {} ({})", peer_name(k), reason);
  bans_[k] = BanRecord{k, std::move(reason), now};
}

}  // namespace starling::averaging::acct
