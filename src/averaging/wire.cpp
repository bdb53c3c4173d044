#include "starling/averaging/wire.hpp"

#include <cmath>

#include "starling/pb/averaging.pb.h"
#include "wire_scan.hpp"

namespace starling::averaging::wire {
namespace {

namespace pb = starling::pb::averaging;

Error bad(std::string what) {
  return Error(errc::invalid_argument, "averaging wire: " + what);
}

template <class Msg>
Bytes serialize(const Msg& m) {
  Bytes out(m.ByteSizeLong());
  m.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

Bytes to_bytes_s(const std::string& s) {
  return Bytes(s.begin(), s.end());
}
std::string to_str(BytesView b) {
  return std::string(b.begin(), b.end());
}

void put_member(pb::Member* out, const MemberInfo& m) {
  out->set_peer(to_str(m.peer.bytes()));
  for (const auto& a : m.addrs) out->add_addrs(a);
  out->set_bandwidth(m.bandwidth);
  out->set_client(m.client);
  out->set_weight(m.weight);
}

result<MemberInfo> get_member(const pb::Member& m) {
  MemberInfo out;
  if (m.peer().empty() || m.peer().size() > kMaxPeerIdLen) return bad("member peer id length");
  out.peer = PeerKey(to_bytes_s(m.peer()));
  if (static_cast<std::size_t>(m.addrs_size()) > kMaxAddrs) return bad("too many addresses");
  for (const auto& a : m.addrs()) {
    if (a.size() > kMaxAddrLen) return bad("address too long");
    out.addrs.push_back(a);
  }
  out.bandwidth = m.bandwidth();
  if (out.bandwidth == 0 || out.bandwidth > (std::uint64_t{1} << 40))
    return bad("member bandwidth out of range");
  out.client = m.client();
  out.weight = m.has_weight() ? m.weight() : 1.0;
  if (!std::isfinite(out.weight) || out.weight < 0) return bad("member weight");
  return out;
}

result<Bitset> get_bits(const std::string& s, std::size_t n, const char* what) {
  auto r = Bitset::decode(as_bytes(s), n);
  if (!r) return bad(std::string(what) + ": " + r.error().context());
  return r;
}

}  // namespace

std::int64_t to_unix_ms(WallTime t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}
WallTime from_unix_ms(std::int64_t ms) {
  // Clamp far-off values instead of overflowing the clock's representation.
  constexpr std::int64_t kMax = std::int64_t{1} << 50;
  ms = std::clamp<std::int64_t>(ms, -kMax, kMax);
  return WallTime(std::chrono::duration_cast<WallClock::duration>(std::chrono::milliseconds(ms)));
}

Bytes encode_entry(const MatchEntry& e) {
  pb::MatchEntry m;
  put_member(m.mutable_info(), e.info);
  m.set_schema_hash(to_str(e.schema_hash));
  m.set_deadline_ms(to_unix_ms(e.deadline));
  m.set_open(e.open);
  m.set_group_size(e.group_size);
  return serialize(m);
}

result<MatchEntry> decode_entry(BytesView b) {
  ST_TRY(auto m, scan::parse<pb::MatchEntry>(b, scan::kMatchEntry));
  MatchEntry e;
  if (!m.has_info()) return bad("match entry without member");
  ST_TRY(e.info, get_member(m.info()));
  if (m.schema_hash().size() != 32) return bad("schema hash length");
  e.schema_hash = to_bytes_s(m.schema_hash());
  e.deadline = from_unix_ms(m.deadline_ms());
  e.open = m.open();
  e.group_size = m.has_group_size() ? m.group_size() : 1;
  if (e.group_size == 0 || e.group_size > kMaxGroupSize) return bad("group size");
  return e;
}

Bytes encode_match(const MatchFrame& f) {
  pb::MatchFrame m;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, JoinRequest>) {
          auto* j = m.mutable_join();
          put_member(j->mutable_member(), x.member);
          j->set_schema_hash(to_str(x.schema_hash));
          j->set_group_key(x.group_key);
          j->set_deadline_ms(to_unix_ms(x.deadline));
        } else if constexpr (std::is_same_v<T, JoinReply>) {
          m.set_reply(static_cast<std::uint32_t>(x.verdict));
        } else if constexpr (std::is_same_v<T, BeginMsg>) {
          m.set_begin(to_str(x.group_id));
        } else if constexpr (std::is_same_v<T, ConfirmMsg>) {
          m.set_confirm(to_str(x.group_id));
        } else if constexpr (std::is_same_v<T, StartMsg>) {
          auto* g = m.mutable_start();
          g->set_group_id(to_str(x.group.group_id));
          g->set_schema_hash(to_str(x.group.schema_hash));
          for (const auto& mem : x.group.members) put_member(g->add_members(), mem);
        } else if constexpr (std::is_same_v<T, DisbandMsg>) {
          m.set_disband(x.reason);
        } else {
          m.set_leave(true);
        }
      },
      f);
  return serialize(m);
}

result<MatchFrame> decode_match(BytesView b) {
  ST_TRY(auto m, scan::parse<pb::MatchFrame>(b, scan::kMatchFrame));
  const int set = m.has_join() + m.has_reply() + m.has_begin() + m.has_confirm() + m.has_start() +
                  m.has_disband() + m.has_leave();
  if (set != 1) return bad("match frame must carry exactly one message");
  if (m.has_join()) {
    const auto& j = m.join();
    JoinRequest r;
    if (!j.has_member()) return bad("join without member");
    ST_TRY(r.member, get_member(j.member()));
    if (j.schema_hash().size() != 32) return bad("join schema hash length");
    r.schema_hash = to_bytes_s(j.schema_hash());
    if (j.group_key().size() > 1024) return bad("group key too long");
    r.group_key = j.group_key();
    r.deadline = from_unix_ms(j.deadline_ms());
    return MatchFrame{r};
  }
  if (m.has_reply()) {
    if (m.reply() > static_cast<std::uint32_t>(JoinVerdict::banned)) return bad("join verdict");
    return MatchFrame{JoinReply{static_cast<JoinVerdict>(m.reply())}};
  }
  if (m.has_begin()) {
    if (m.begin().empty() || m.begin().size() > 64) return bad("group id length");
    return MatchFrame{BeginMsg{to_bytes_s(m.begin())}};
  }
  if (m.has_confirm()) {
    if (m.confirm().empty() || m.confirm().size() > 64) return bad("group id length");
    return MatchFrame{ConfirmMsg{to_bytes_s(m.confirm())}};
  }
  if (m.has_start()) {
    const auto& g = m.start();
    StartMsg s;
    if (g.group_id().empty() || g.group_id().size() > 64) return bad("group id length");
    s.group.group_id = to_bytes_s(g.group_id());
    if (g.schema_hash().size() != 32) return bad("group schema hash length");
    s.group.schema_hash = to_bytes_s(g.schema_hash());
    if (static_cast<std::size_t>(g.members_size()) > kMaxGroupSize) return bad("group too large");
    for (const auto& mem : g.members()) {
      ST_TRY(auto mi, get_member(mem));
      s.group.members.push_back(std::move(mi));
    }
    auto v = validate_members(s.group.members);
    if (!v) return bad("group: " + v.error().context());
    return MatchFrame{std::move(s)};
  }
  if (m.has_disband()) return MatchFrame{DisbandMsg{m.disband().substr(0, 256)}};
  return MatchFrame{LeaveMsg{}};
}

Bytes encode_hello(const Hello& h) {
  pb::RoundFrame m;
  m.set_kind(pb::RoundFrame::HELLO);
  m.set_group_id(to_str(h.group_id));
  m.set_from(h.from);
  m.set_to(h.to);
  return serialize(m);
}

Bytes encode_keepalive() {
  pb::RoundFrame m;
  m.set_kind(pb::RoundFrame::KEEPALIVE);
  return serialize(m);
}

Bytes encode_acct(BytesView statement) {
  pb::RoundFrame m;
  m.set_kind(pb::RoundFrame::ACCT);
  m.set_statement(to_str(statement));
  return serialize(m);
}

Bytes encode_round(const RoundMessage& msg, std::uint64_t payload_len, BytesView receipt) {
  pb::RoundFrame m;
  if (!receipt.empty()) m.set_receipt(to_str(receipt));
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        m.set_subround(x.subround);
        if constexpr (std::is_same_v<T, PartMsg>) {
          m.set_kind(pb::RoundFrame::PART);
          m.set_part(x.part);
          m.set_weight(x.weight);
          m.set_payload_len(payload_len);
        } else if constexpr (std::is_same_v<T, ResultMsg>) {
          m.set_kind(pb::RoundFrame::RESULT);
          m.set_part(x.part);
          m.set_members(to_str(x.counted.encode()));
          m.set_payload_len(payload_len);
        } else {
          m.set_kind(pb::RoundFrame::FIN);
          m.set_stage(x.stage);
          for (const auto& r : x.reports) {
            auto* o = m.add_reports();
            o->set_member(r.member);
            o->set_missing(to_str(r.missing.encode()));
            o->set_failed(to_str(r.failed.encode()));
            o->set_blamed(to_str(r.blamed.encode()));
            o->set_counted(to_str(r.counted.encode()));
            m.set_part(static_cast<std::uint32_t>(r.missing.size()));  // parts in the sub-round
          }
        }
      },
      msg);
  return serialize(m);
}

result<RoundFrame> decode_round(BytesView b, std::size_t members) {
  ST_TRY(auto m, scan::parse<pb::RoundFrame>(b, scan::kRoundFrame));
  if (!m.has_kind()) return bad("round frame without kind");
  RoundFrame out;
  switch (m.kind()) {
    case pb::RoundFrame::HELLO: {
      if (m.group_id().empty() || m.group_id().size() > 64) return bad("hello group id");
      out.msg = Hello{to_bytes_s(m.group_id()), m.from(), m.to()};
      return out;
    }
    case pb::RoundFrame::KEEPALIVE:
      out.msg = Keepalive{};
      return out;
    case pb::RoundFrame::ACCT:
      if (m.statement().empty()) return bad("acct frame without a statement");
      out.msg = Acct{to_bytes_s(m.statement())};
      return out;
    case pb::RoundFrame::PART: {
      if (!m.has_payload_len()) return bad("part without payload length");
      if (!m.has_weight() || !std::isfinite(m.weight()) || m.weight() < 0)
        return bad("part weight");
      out.payload_len = m.payload_len();
      out.receipt = to_bytes_s(m.receipt());
      out.msg = RoundMessage{PartMsg{m.subround(), m.part(), {}, m.weight()}};
      return out;
    }
    case pb::RoundFrame::RESULT: {
      if (!m.has_payload_len()) return bad("result without payload length");
      ST_TRY(auto bits, get_bits(m.members(), members, "result"));
      out.payload_len = m.payload_len();
      out.receipt = to_bytes_s(m.receipt());
      out.msg = RoundMessage{ResultMsg{m.subround(), m.part(), std::move(bits), {}}};
      return out;
    }
    case pb::RoundFrame::FIN: {
      if (m.stage() != 1 && m.stage() != 2) return bad("fin stage");
      if (m.part() > kMaxParts) return bad("fin part count");
      if (static_cast<std::size_t>(m.reports_size()) > members) return bad("fin report count");
      FinMsg f;
      f.subround = m.subround();
      f.stage = static_cast<std::uint8_t>(m.stage());
      for (const auto& r : m.reports()) {
        FinReport fr;
        fr.member = r.member();
        if (fr.member >= members) return bad("fin report member");
        ST_TRY(fr.missing, get_bits(r.missing(), m.part(), "fin missing"));
        ST_TRY(fr.failed, get_bits(r.failed(), members, "fin failed"));
        ST_TRY(fr.blamed, get_bits(r.blamed(), members, "fin blamed"));
        ST_TRY(fr.counted, get_bits(r.counted(), members, "fin counted"));
        f.reports.push_back(std::move(fr));
      }
      out.msg = RoundMessage{std::move(f)};
      return out;
    }
    default:
      return bad("round frame kind");
  }
}

}  // namespace starling::averaging::wire
