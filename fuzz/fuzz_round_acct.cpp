// libFuzzer target: the statements a round member receives in ACCT frames and with PART and
// RESULT frames (src/averaging/round_acct.hpp). Input: a sequence of [from, length, bytes]
// records; each goes to RoundAcct::on_statement() from that member, and bytes that decode as
// a receipt also to on_part() / on_result(). Bad input must be an error, never a crash; the
// checks after the all-gather, the accusations and the owner's answers must not crash on
// whatever was accepted (including evidence reassembled from pieces).
#include <cstdint>

#include "averaging/round_acct.hpp"
#include "starling/core/log.hpp"

using namespace starling;
using namespace starling::averaging;

namespace {

constexpr std::uint32_t kMembers = 3;

crypto::KeyPair key(std::uint8_t i) {
  return crypto::KeyPair::from_seed(Bytes(32, static_cast<std::uint8_t>(i + 1))).value();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool quiet = [] {
    set_log_level("off");
    return true;
  }();
  (void)quiet;
  auto cfg = std::make_shared<detail::RoundAcctConfig>();
  cfg->key = key(0);
  cfg->context = to_bytes("fuzz/round/");
  acct::RoundInfo info;
  info.context = cfg->context;
  for (std::uint8_t i = 0; i < kMembers; ++i) info.members.push_back(acct::key_of(key(i)));
  detail::RoundAcct a(cfg, info, 0);
  (void)a.commit(0, 1.0, {acct::Hash32{}, acct::Hash32{}, acct::Hash32{}});
  const std::vector<float> values(4, 0.5f);
  BytesView in(data, size);
  std::size_t pos = 0;
  while (pos + 2 <= in.size()) {
    const std::uint32_t from = in[pos] % kMembers;
    const std::size_t len = in[pos + 1];
    pos += 2;
    if (pos + len > in.size()) break;
    const BytesView st = in.subspan(pos, len);
    pos += len;
    (void)a.on_statement(from, st);
    auto r = acct::decode_receipt(st);
    if (!r) continue;
    (void)a.on_part(from, r.value());
    ResultMsg m{r.value().subround, r.value().part, Bitset(kMembers), values};
    for (auto c : r.value().counted)
      if (c < kMembers) m.counted.set(c);
    (void)a.on_result(from, m, r.value(), 1.0, values);
  }
  detail::SettledPart p{0, 0, 1, {0, 4}, Bitset(kMembers, true)};
  const std::vector<detail::SettledPart> parts{p};
  (void)a.missing_reports(parts);
  (void)a.relays(1);
  a.settle(parts);
  if (a.have_reveals()) (void)a.check(parts);
  // Accusations and answers (pieces of evidence and markers were fed to on_statement above).
  (void)a.accusations();
  (void)a.accused_owners();
  for (auto& e : a.answer_candidates(values)) (void)detail::RoundAcct::pieces(e);
  a.conclude();
  return 0;
}
