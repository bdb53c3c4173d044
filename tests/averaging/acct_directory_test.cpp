// wrong_average accusations read from the directory (ban_list.hpp, docs/security.md "Directory
// accusations"): a member can publish one built from its own lying report, which verifies and
// which the owner never sees inside the round. Such an accusation is only a vote: an owner is
// suspected (and banned after the grace) only once more than half of the round's members
// accused it of the same part. A minority of liars cannot get an honest owner banned; a
// cheating owner accused by its honest members still is. One judgement per accuser and
// subject; one accuser's junk detached records cannot keep the owner's answer from a reader.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <optional>
#include <stdexcept>

#include "acct_fixture.hpp"
#include "starling/averaging/acct_records.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace starling::averaging::acct;
using namespace starling::averaging::acct::test;

namespace {

// The reports of `c` with member `liar`'s report pushed off by 10x its distance (signed by it).
std::vector<ProjectionReport> with_lie(const CheckCase& c, std::uint32_t liar) {
  auto rs = c.reports();
  rs[liar].proj += 10 * rs[liar].dist;
  sign(rs[liar], c.f.keys[liar]);
  return rs;
}

// The owner's answer to `liar`'s report: its signed part and values, the result and values.
Evidence false_report(const CheckCase& c, const std::vector<ProjectionReport>& rs,
                      std::uint32_t liar) {
  Evidence e;
  e.kind = EvidenceKind::false_report;
  e.info = c.f.info;
  e.receipts = {c.f.part(liar, 0, c.g[liar]), c.res};
  e.reveals = c.reveals;
  e.reports = {rs[liar]};
  e.data = c.g[liar];
  e.data2 = c.result;
  return e;
}

constexpr auto kGrace = std::chrono::seconds(5);

}  // namespace

// Two liars of seven (a minority) each publish a verified wrong_average accusation against an
// honest owner: nobody suspects or bans it, however long the readers wait.
TEST(AcctDirectory, MinorityCannotGetAnHonestOwnerBanned) {
  asio::io_context io;
  MemoryDirectory dir;
  CheckCase c(7, 2000, Aggregation::centered_clip, 21);
  const auto expires = WallClock::now() + std::chrono::minutes(10);
  for (std::uint32_t liar : {4u, 5u}) {  // not 6, the outlier: the cut counts its report 0
    const auto e = c.wrong_average(with_lie(c, liar));
    ASSERT_TRUE(verify_evidence(e, {})) << "the lie verifies as a wrong average";
    ASSERT_TRUE(
        run(io, publish_accusation(dir, "run", make_accusation(e, c.f.keys[liar]), expires)));
  }
  for (int reader = 0; reader < 3; ++reader) {
    BanList bans(CheckConfig{}, kGrace);
    bans.set_run_prefix(to_bytes("run/"));
    const TimePoint t0{};
    auto st = run(io, collect_accusations(dir, "run", bans, t0));
    ASSERT_TRUE(st);
    EXPECT_EQ(st.value().verified, 2u);
    EXPECT_EQ(bans.votes(c.f.rid, 0, 0), 2u);
    EXPECT_FALSE(bans.suspected(c.f.info.members[0]));
    EXPECT_TRUE(bans.accused(c.f.info.members[0]));
    bans.tick(t0 + 10 * kGrace);
    EXPECT_TRUE(bans.bans().empty());
  }
}

// An owner that shifts its result is accused by its honest members: a reader outside the round
// suspects it once a majority of the members (3 of 5) accused it and bans it after the grace.
TEST(AcctDirectory, MajorityOfMembersBansACheatingOwner) {
  CheckCase c(5, 2000, Aggregation::mean, 4);
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd(0.5f, 0.25f);
  for (auto& x : c.result) x += nd(rng);
  c.seal();
  const auto e = c.wrong_average(c.reports());
  ASSERT_TRUE(verify_evidence(e, {}));
  BanList bans(CheckConfig{}, kGrace);
  const TimePoint t0{};
  const auto owner = c.f.info.members[0];
  for (std::uint32_t m : {1u, 2u})
    ASSERT_TRUE(bans.add_accusation(make_accusation(e, c.f.keys[m]), t0));
  EXPECT_FALSE(bans.suspected(owner));  // two of five
  // A second accusation by the same member about the same part is not another vote.
  auto again = e;
  again.reports[3].proj += 1;  // other bytes, same subject
  sign(again.reports[3], c.f.keys[3]);
  const auto dup = make_accusation(again, c.f.keys[2]);
  EXPECT_FALSE(bans.add_accusation(dup, t0));
  EXPECT_TRUE(bans.seen(dup));
  EXPECT_EQ(bans.votes(c.f.rid, 0, 0), 2u);
  // The owner accusing itself, or a peer outside the round, is not a vote.
  EXPECT_FALSE(bans.add_accusation(make_accusation(e, c.f.keys[0]), t0));
  EXPECT_FALSE(bans.add_accusation(make_accusation(e, crypto::KeyPair::generate()), t0));
  EXPECT_FALSE(bans.suspected(owner));
  EXPECT_TRUE(bans.add_accusation(make_accusation(e, c.f.keys[3]), t0));
  EXPECT_TRUE(bans.suspected(owner));  // three of five
  bans.tick(t0 + kGrace / 2);
  EXPECT_FALSE(bans.banned(owner));
  bans.tick(t0 + kGrace);
  EXPECT_TRUE(bans.banned(owner));
  EXPECT_EQ(bans.bans().size(), 1u);  // no accuser banned
}

// One liar publishes many detached records whose chunks never exist, besides its accusation;
// the framed owner's detached false_report answer is still judged at every reader's first
// read (a reader fetches at most kMaxDetachedPerAccuser records of one accuser, and an accused
// peer's records first), so the liar is banned and the owner cleared.
TEST(AcctDirectory, JunkDetachedRecordsCannotCrowdOutTheAnswer) {
  asio::io_context io;
  MemoryDirectory dir;
  const std::uint32_t liar = 4;
  CheckCase c(5, 70000, Aggregation::centered_clip, 8);
  const auto rs = with_lie(c, liar);
  const auto expires = WallClock::now() + std::chrono::minutes(10);
  ASSERT_TRUE(
      run(io, publish_accusation(dir, "run", make_accusation(c.wrong_average(rs), c.f.keys[liar]),
                                 expires)));
  const auto answer = make_accusation(false_report(c, rs, liar), c.f.keys[0]);
  ASSERT_GT(encode(answer).size(), kMaxAccusationRecord);  // published detached
  ASSERT_TRUE(run(io, publish_accusation(dir, "run", answer, expires)));
  // The junk: the liar's signed answer-like records pointing at chunks nobody stored.
  const auto fake = make_accusation(false_report(c, rs, liar), c.f.keys[liar]);
  for (int j = 0; j < 3 * static_cast<int>(kMaxDetachedPerRead); ++j) {
    auto d = detach(fake);
    d.chunks1[0][0] = static_cast<std::uint8_t>(j);
    d.chunks1[0][1] = static_cast<std::uint8_t>(j >> 8);
    Bytes v = encode(d);
    Bytes sub(c.f.info.members[liar].begin(), c.f.info.members[liar].end());
    sub.push_back(static_cast<std::uint8_t>(j));
    ASSERT_TRUE(run(io, dir.put(accusation_key("run"), std::move(sub), std::move(v), expires)));
  }
  for (int reader = 0; reader < 5; ++reader) {
    BanList bans(CheckConfig{}, kGrace);
    auto st = run(io, collect_accusations(dir, "run", bans, TimePoint{}));
    ASSERT_TRUE(st);
    EXPECT_TRUE(bans.banned(c.f.info.members[liar])) << "reader " << reader;
    EXPECT_FALSE(bans.banned(c.f.info.members[0]));
    EXPECT_FALSE(bans.accused(c.f.info.members[0]) && bans.suspected(c.f.info.members[0]));
  }
}

// A member that reported honestly inside the round and lies in the directory has signed two
// reports for one part: a reader that received the first in the round holds report_conflict
// evidence (self-contained) and bans the liar; a reader outside the round bans it on that
// evidence published as an accusation. The owner is not suspected anywhere.
TEST(AcctDirectory, LiarWhoToldTheRoundOtherwiseIsBanned) {
  CheckCase c(5, 2000, Aggregation::centered_clip, 31);
  const std::uint32_t liar = 3;  // not 4, the outlier: the cut counts its report 0
  const auto honest = c.reports();
  const auto lie = c.wrong_average(with_lie(c, liar));
  const TimePoint t0{};
  BanList member(CheckConfig{}, kGrace);
  for (const auto& r : honest) member.remember(r);
  ASSERT_TRUE(member.add_accusation(make_accusation(lie, c.f.keys[liar]), t0));
  EXPECT_TRUE(member.banned(c.f.info.members[liar]));
  EXPECT_FALSE(member.suspected(c.f.info.members[0]));
  auto found = member.take_found();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, EvidenceKind::report_conflict);
  EXPECT_TRUE(member.take_found().empty());

  BanList outsider(CheckConfig{}, kGrace);
  ASSERT_TRUE(outsider.add_accusation(make_accusation(found[0], c.f.keys[1]), t0));
  EXPECT_TRUE(outsider.banned(c.f.info.members[liar]));
  // Two copies of one report prove nothing: whoever claims so is banned.
  BanList other(CheckConfig{}, kGrace);
  const auto same = report_conflict(c.f.info, honest[2], honest[2]);
  EXPECT_FALSE(verify_evidence(same, {}));
  EXPECT_FALSE(other.add_accusation(make_accusation(same, c.f.keys[1]), t0));
  EXPECT_TRUE(other.banned(c.f.info.members[1]));
  EXPECT_FALSE(other.banned(c.f.info.members[2]));
}

// The reports a member remembers are bounded (a peer's rounds feed them without end): after
// kMaxRemembered others, the memory holds exactly that many, and the latest still expose a
// liar.
TEST(AcctDirectory, RememberedReportsStayBounded) {
  CheckCase c(5, 2000, Aggregation::centered_clip, 32);
  const std::uint32_t liar = 3;
  BanList member(CheckConfig{}, kGrace);
  ProjectionReport filler = c.reports()[0];
  for (std::uint32_t i = 0; i < BanList::kMaxRemembered + 1000; ++i) {
    filler.part = i;  // another slot each time (unsigned: remember() stores, never verifies)
    member.remember(filler);
  }
  EXPECT_EQ(member.memory_entries(), BanList::kMaxRemembered);
  for (const auto& r : c.reports()) member.remember(r);
  EXPECT_EQ(member.memory_entries(), BanList::kMaxRemembered);
  const TimePoint t0{};
  ASSERT_TRUE(member.add_accusation(
      make_accusation(c.wrong_average(with_lie(c, liar)), c.f.keys[liar]), t0));
  EXPECT_TRUE(member.banned(c.f.info.members[liar]));
}
