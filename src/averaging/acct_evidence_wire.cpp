// The encoding of Evidence (accountability.hpp): a tag, the kind, the round info, then each
// list as a count and length-prefixed statements, then two float vectors.
#include <bit>
#include <cstring>

#include "averaging/acct_codec.hpp"
#include "starling/averaging/accountability.hpp"

namespace starling::averaging::acct {

namespace {

constexpr std::uint8_t kTagEvidence = 0xCE;
constexpr std::size_t kMaxContext = 1024;
constexpr std::size_t kMaxStatement = 16 + kMaxCommittedParts * 32 + 256;

template <class T>
void put_list(Writer& w, const std::vector<T>& v) {
  w.u32(static_cast<std::uint32_t>(v.size()));
  for (const auto& s : v) {
    const Bytes b = encode(s);
    w.u32(static_cast<std::uint32_t>(b.size()));
    w.raw(b);
  }
}

template <class T, class Decode>
result<void> get_list(Reader& r, std::vector<T>& v, std::size_t max, Decode decode,
                      const char* what) {
  const std::uint32_t n = r.u32();
  if (n > max) return make_error(errc::too_large, std::string("evidence: too many ") + what);
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::uint32_t len = r.u32();
    if (len > kMaxStatement) return make_error(errc::too_large, "evidence: statement too big");
    if (!r.has(len)) return r.fail(std::string("evidence: truncated ") + what);
    ST_TRY(auto s, decode(r.raw(len)));
    v.push_back(std::move(s));
  }
  return success();
}

void put_floats(Writer& w, const std::vector<float>& v) {
  w.u32(static_cast<std::uint32_t>(v.size()));
  w.raw(BytesView(reinterpret_cast<const std::uint8_t*>(v.data()), v.size() * 4));
}

result<void> get_floats(Reader& r, std::vector<float>& v) {
  static_assert(std::endian::native == std::endian::little, "little-endian hosts only");
  const std::uint32_t n = r.u32();
  if (n > kMaxEvidenceFloats) return make_error(errc::too_large, "evidence: too many values");
  if (!r.has(std::size_t{n} * 4)) return r.fail("evidence: truncated values");
  const BytesView b = r.raw(std::size_t{n} * 4);
  v.resize(n);
  if (n > 0) std::memcpy(v.data(), b.data(), b.size());
  for (float x : v)
    if (!std::isfinite(x)) return r.fail("evidence: non-finite value");
  return success();
}

}  // namespace

Bytes encode(const Evidence& e) {
  Writer w;
  w.u8(kTagEvidence);
  w.u8(static_cast<std::uint8_t>(e.kind));
  w.u32(static_cast<std::uint32_t>(e.info.context.size()));
  w.raw(e.info.context);
  w.u32(static_cast<std::uint32_t>(e.info.members.size()));
  for (const auto& k : e.info.members) w.fixed(k);
  put_list(w, e.commitments);
  put_list(w, e.receipts);
  put_list(w, e.reveals);
  put_list(w, e.reports);
  put_floats(w, e.data);
  put_floats(w, e.data2);
  return std::move(w.out);
}

result<Evidence> decode_evidence(BytesView b) {
  Reader r(b);
  Evidence e;
  if (r.u8() != kTagEvidence) return r.fail("not evidence");
  const std::uint8_t kind = r.u8();
  if (kind < 1 || kind > 7) return r.fail("evidence: unknown kind");
  e.kind = static_cast<EvidenceKind>(kind);
  const std::uint32_t clen = r.u32();
  if (clen > kMaxContext) return make_error(errc::too_large, "evidence: context too long");
  if (!r.has(clen)) return r.fail("evidence: truncated context");
  const BytesView ctx = r.raw(clen);
  e.info.context.assign(ctx.begin(), ctx.end());
  const std::uint32_t nm = r.u32();
  if (nm > kMaxMembers) return make_error(errc::too_large, "evidence: too many members");
  if (!r.has(std::size_t{nm} * 32)) return r.fail("evidence: truncated members");
  e.info.members.resize(nm);
  for (auto& k : e.info.members) r.fixed(k);
  ST_TRY(get_list(r, e.commitments, 2, decode_commitment, "commitments"));
  ST_TRY(get_list(r, e.receipts, 2, decode_receipt, "receipts"));
  ST_TRY(get_list(r, e.reveals, kMaxMembers, decode_reveal, "reveals"));
  ST_TRY(get_list(r, e.reports, kMaxMembers, decode_report, "reports"));
  ST_TRY(get_floats(r, e.data));
  ST_TRY(get_floats(r, e.data2));
  ST_TRY(r.finish("evidence"));
  return e;
}

}  // namespace starling::averaging::acct
