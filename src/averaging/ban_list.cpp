// BanList and accusations (ban_list.hpp).
#include "starling/averaging/ban_list.hpp"

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
  return net::PeerId::from_public_key(
             crypto::PublicKey(crypto::KeyType::ed25519, Bytes(k.begin(), k.end())))
      .to_string();
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

result<Verdict> BanList::add_evidence(const Evidence& e, TimePoint now) {
  if (!known_round(e)) {
    logger("averaging")->info("evidence rejected: a round of another run");
    return make_error(errc::not_found, "evidence about a round of another run");
  }
  auto v = verify_evidence(e, cfg_);
  if (!v) {
    logger("averaging")->info("evidence rejected: {}", v.error().message());
    return v;
  }
  const Verdict& d = v.value();
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
  return v;
}

bool BanList::seen(const Accusation& a) const {
  return seen_.count(crypto::sha256(BytesView(a.sig.data(), a.sig.size()))) != 0;
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
  // Ed25519 signatures are deterministic and bind the whole record: one judgement each.
  seen_[crypto::sha256(BytesView(a.sig.data(), a.sig.size()))] = true;
  auto v = add_evidence(a.evidence, now);
  if (!v) {
    ban(a.accuser, "false accusation", now);
    return make_error(errc::invalid_argument, "false accusation: " + v.error().message());
  }
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
