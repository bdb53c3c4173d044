#include "part_codec.hpp"

#include <algorithm>

namespace starling::averaging::detail {
namespace {

constexpr std::size_t kSegHeader = 4;

void put_u32(Bytes& b, std::size_t off, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[off + i] = static_cast<std::uint8_t>(v >> (8 * i));
}

std::uint32_t get_u32(BytesView b, std::size_t off) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{b[off + i]} << (8 * i);
  return v;
}

}  // namespace

result<TensorCodecs> TensorCodecs::from_schema(const Schema& s) {
  TensorCodecs tc;
  const bool is_auto = s.codec == "auto";
  std::optional<CodecId> fixed;
  if (!is_auto) {
    fixed = codec_from_string(s.codec);
    if (!fixed) return make_error(errc::invalid_argument, "unknown codec '" + s.codec + "'");
  }
  const CompressionPolicy policy;
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < s.tensors.size(); ++i) {
    const std::uint64_t n = s.tensors[i].numel();
    end += n;
    tc.ends_.push_back(end);
    CodecSpec spec = is_auto ? policy.choose(i, n) : CodecSpec{*fixed};
    tc.specs_.push_back(spec);
    if (spec.codec != CodecId::none && n > 0) tc.compressed_ = true;
  }
  return tc;
}

std::size_t TensorCodecs::max_payload(std::size_t elems) const {
  // A peer may pick any valid codec; none costs 4 bytes a value, the chunked codecs at most
  // 16 bytes a value (quantile8 with 64-value chunks: 1 KiB of codebook per 64 values) plus
  // their header. Parts never cross more tensors than the schema has.
  return elems * 17 + tensors() * (kSegHeader + kHeaderSize + 1024);
}

result<Bytes> TensorCodecs::encode(std::uint64_t begin, std::span<const float> in,
                                   std::span<float> decoded, std::span<const float> residual,
                                   std::span<float> residual_out) const {
  if (residual.size() != residual_out.size() || (!residual.empty() && residual.size() != in.size()))
    return make_error(errc::invalid_argument, "residual spans do not match the part");
  const std::uint64_t end = begin + in.size();
  if (end > (ends_.empty() ? 0 : ends_.back()))
    return make_error(errc::invalid_argument, "part beyond the vector");
  Bytes out;
  std::vector<float> corrected, dec;
  auto t =
      static_cast<std::size_t>(std::upper_bound(ends_.begin(), ends_.end(), begin) - ends_.begin());
  for (std::uint64_t pos = begin; pos < end; ++t) {
    const std::uint64_t seg_end = std::min(end, ends_[t]);
    if (seg_end <= pos) continue;
    const std::size_t off = pos - begin, n = seg_end - pos;
    std::span<const float> x = in.subspan(off, n);
    if (!residual.empty()) {
      corrected.resize(n);
      for (std::size_t i = 0; i < n; ++i) corrected[i] = x[i] + residual[off + i];
      x = corrected;
    }
    CodecSpec spec = specs_[t];
    if (spec.codec == CodecId::float16) {
      // Values beyond float16's range go as bfloat16 (the policy's overflow rule).
      CompressionPolicy f16;
      f16.small_max = 0;
      f16.medium_max = SIZE_MAX;
      spec = f16.choose(0, x);
    }
    ST_TRY(auto enc, averaging::encode(spec, x));
    if (enc.size() > 0xffffffffu) return make_error(errc::too_large, "segment above 4 GiB");
    const std::size_t at = out.size();
    out.resize(at + kSegHeader + enc.size());
    put_u32(out, at, static_cast<std::uint32_t>(enc.size()));
    std::copy(enc.begin(), enc.end(), out.begin() + static_cast<std::ptrdiff_t>(at + kSegHeader));
    if (!decoded.empty() || !residual_out.empty()) {
      std::span<float> d = decoded.empty() ? std::span<float>() : decoded.subspan(off, n);
      if (d.empty()) {
        dec.resize(n);
        d = dec;
      }
      ST_TRY(averaging::decode(enc, d));
      if (!residual_out.empty())
        for (std::size_t i = 0; i < n; ++i) residual_out[off + i] = x[i] - d[i];
    }
    pos = seg_end;
  }
  return out;
}

result<void> TensorCodecs::decode(BytesView payload, std::size_t max_count, FloatBuffer& out) {
  out.clear();
  std::size_t off = 0;
  while (off < payload.size()) {
    if (payload.size() - off < kSegHeader)
      return make_error(errc::invalid_argument, "truncated segment header");
    const std::size_t len = get_u32(payload, off);
    off += kSegHeader;
    if (len > payload.size() - off)
      return make_error(errc::invalid_argument, "segment longer than the payload");
    BytesView seg = payload.subspan(off, len);
    ST_TRY(auto info, inspect(seg));
    if (info.count > max_count - out.size())
      return make_error(errc::invalid_argument, "payload holds more values than a part");
    const std::size_t at = out.size();
    out.resize(at + info.count);
    ST_TRY(averaging::decode(seg, std::span<float>(out).subspan(at)));
    off += len;
  }
  return success();
}

}  // namespace starling::averaging::detail
