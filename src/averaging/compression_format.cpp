// Codec names, the wire layout (header, sizes) and strict validation of untrusted buffers.
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "averaging/compression_kernels.hpp"

namespace starling::averaging {

std::string_view to_string(CodecId c) {
  switch (c) {
    case CodecId::none:
      return "none";
    case CodecId::float16:
      return "float16";
    case CodecId::bfloat16:
      return "bfloat16";
    case CodecId::uniform8:
      return "uniform8";
    case CodecId::quantile8:
      return "quantile8";
    case CodecId::blockwise8:
      return "blockwise8";
    case CodecId::blockwise4:
      return "blockwise4";
  }
  return "unknown";
}

std::optional<CodecId> codec_from_string(std::string_view name) {
  for (int i = 1; i <= 7; ++i) {
    auto c = static_cast<CodecId>(i);
    if (to_string(c) == name) return c;
  }
  if (name == "float32") return CodecId::none;
  return std::nullopt;
}

bool is_chunked(CodecId c) {
  return c == CodecId::uniform8 || c == CodecId::quantile8 || c == CodecId::blockwise8 ||
         c == CodecId::blockwise4;
}

std::uint8_t default_block_log2(CodecId c) {
  switch (c) {
    case CodecId::uniform8:
      return 12;
    case CodecId::quantile8:
      return 16;
    case CodecId::blockwise8:
      return 12;
    case CodecId::blockwise4:
      return 9;
    default:
      return 0;
  }
}

std::size_t CodecSpec::block_size() const {
  if (!is_chunked(codec)) return 0;
  return std::size_t{1} << (block_log2 ? block_log2 : default_block_log2(codec));
}

namespace detail {
namespace {

bool known_codec(std::uint8_t id) {
  return id >= 1 && id <= 7;
}

std::size_t param_bytes_for(CodecId c) {
  switch (c) {
    case CodecId::uniform8:
      return 8;
    case CodecId::quantile8:
      return kQuantileBins * 4;
    case CodecId::blockwise8:
    case CodecId::blockwise4:
      return 4;
    default:
      return 0;
  }
}

std::size_t payload_bytes_for(CodecId c, std::uint64_t n) {
  switch (c) {
    case CodecId::none:
      return 4 * n;
    case CodecId::float16:
    case CodecId::bfloat16:
      return 2 * n;
    case CodecId::blockwise4:
      return (n + 1) / 2;
    default:
      return n;
  }
}

Error invalid(std::string what) {
  return Error(errc::invalid_argument, "compressed tensor: " + std::move(what));
}

bool finite(float f) {
  return std::isfinite(f);
}

}  // namespace

std::size_t Layout::units() const {
  std::size_t u = unit_size();
  return static_cast<std::size_t>((count + u - 1) / u);
}

std::size_t Layout::payload_pos(std::size_t i) const {
  switch (codec) {
    case CodecId::none:
      return payload_offset + 4 * i;
    case CodecId::float16:
    case CodecId::bfloat16:
      return payload_offset + 2 * i;
    case CodecId::blockwise4:
      return payload_offset + i / 2;
    default:
      return payload_offset + i;
  }
}

result<Layout> make_layout(CodecSpec spec, std::uint64_t count) {
  auto id = static_cast<std::uint8_t>(spec.codec);
  if (!known_codec(id)) return invalid(fmt::format("unknown codec id {}", id));
  if (count > kMaxElements) return invalid(fmt::format("{} elements is over the limit", count));
  Layout l;
  l.codec = spec.codec;
  l.count = count;
  if (is_chunked(spec.codec)) {
    l.block_log2 = spec.block_log2 ? spec.block_log2 : default_block_log2(spec.codec);
    if (l.block_log2 < kMinBlockLog2 || l.block_log2 > kMaxBlockLog2)
      return invalid(fmt::format("block_log2 {} outside [{}, {}]", l.block_log2, kMinBlockLog2,
                                 kMaxBlockLog2));
    l.block = std::size_t{1} << l.block_log2;
    l.chunks = static_cast<std::size_t>((count + l.block - 1) / l.block);
    l.param_bytes = param_bytes_for(spec.codec);
  }
  // count <= 2^40 and block >= 64 keep all of this far below 2^64.
  l.params_offset = kHeaderSize;
  l.payload_offset = l.params_offset + l.chunks * l.param_bytes;
  l.total = l.payload_offset + payload_bytes_for(spec.codec, count);
  return l;
}

void write_header(const Layout& l, std::uint8_t* out) {
  out[0] = static_cast<std::uint8_t>(l.codec);
  out[1] = kWireVersion;
  out[2] = l.block_log2;
  out[3] = 0;
  for (int i = 0; i < 8; ++i) out[4 + i] = static_cast<std::uint8_t>(l.count >> (8 * i));
}

result<Layout> parse_layout(BytesView buf) {
  if (buf.size() < kHeaderSize)
    return invalid(fmt::format("{} bytes is shorter than the header", buf.size()));
  std::uint8_t id = buf[0];
  if (!known_codec(id)) return invalid(fmt::format("unknown codec id {}", id));
  auto codec = static_cast<CodecId>(id);
  if (buf[1] != kWireVersion) return invalid(fmt::format("unsupported version {}", buf[1]));
  if (buf[3] != 0) return invalid(fmt::format("reserved flags {:#x} set", buf[3]));
  std::uint8_t block_log2 = buf[2];
  if (!is_chunked(codec) && block_log2 != 0)
    return invalid(fmt::format("{} with block_log2 {}", to_string(codec), block_log2));
  if (is_chunked(codec) && (block_log2 < kMinBlockLog2 || block_log2 > kMaxBlockLog2))
    return invalid(
        fmt::format("block_log2 {} outside [{}, {}]", block_log2, kMinBlockLog2, kMaxBlockLog2));
  std::uint64_t count = 0;
  for (int i = 0; i < 8; ++i) count |= std::uint64_t{buf[4 + i]} << (8 * i);
  ST_TRY(auto l, make_layout(CodecSpec{codec, block_log2}, count));
  if (buf.size() != l.total)
    return invalid(fmt::format("{} with {} elements needs {} bytes, got {}", to_string(codec),
                               count, l.total, buf.size()));
  return l;
}

result<void> validate_params(const Layout& l, BytesView buf) {
  const std::uint8_t* p = buf.data() + l.params_offset;
  switch (l.codec) {
    case CodecId::uniform8:
      for (std::size_t c = 0; c < l.chunks; ++c) {
        float mid = load_f32(p + 8 * c), step = load_f32(p + 8 * c + 4);
        if (!finite(mid) || !finite(step) || !(step >= 0.0f) || !finite(mid + 127.5f * step) ||
            !finite(mid - 127.5f * step))
          return invalid(
              fmt::format("uniform8 chunk {} has bad range mid={} step={}", c, mid, step));
      }
      break;
    case CodecId::blockwise8:
    case CodecId::blockwise4: {
      float limit = l.codec == CodecId::blockwise4 ? 7.0f : 127.0f;
      for (std::size_t c = 0; c < l.chunks; ++c) {
        float a = load_f32(p + 4 * c);
        // The largest decoded magnitude is limit * (a / limit): it must stay finite.
        if (!finite(a) || !(a >= 0.0f) || !finite(limit * (a / limit)))
          return invalid(fmt::format("{} block {} has bad absmax {}", to_string(l.codec), c, a));
      }
      if (l.codec == CodecId::blockwise4 && l.count % 2 && (buf[l.total - 1] >> 4) != 0)
        return invalid("blockwise4 padding nibble is not zero");
      break;
    }
    case CodecId::quantile8:
      for (std::size_t c = 0; c < l.chunks; ++c) {
        const std::uint8_t* cb = p + c * kQuantileBins * 4;
        float prev = -std::numeric_limits<float>::infinity();
        for (std::size_t k = 0; k < kQuantileBins; ++k) {
          float v = load_f32(cb + 4 * k);
          if (!finite(v) || !(v >= prev))
            return invalid(
                fmt::format("quantile8 chunk {} codebook entry {} is {} (not finite "
                            "and sorted)",
                            c, k, v));
          prev = v;
        }
      }
      break;
    default:
      break;
  }
  return success();
}

}  // namespace detail

result<EncodedInfo> inspect(BytesView buf) {
  ST_TRY(auto l, detail::parse_layout(buf));
  EncodedInfo info;
  info.spec = CodecSpec{l.codec, l.block_log2};
  info.count = l.count;
  info.block_size = l.block;
  info.chunks = l.chunks;
  info.params_offset = l.params_offset;
  info.payload_offset = l.payload_offset;
  info.total_size = l.total;
  return info;
}

std::size_t encoded_size(const CodecSpec& spec, std::size_t count) {
  auto l = detail::make_layout(spec, count);
  return l ? l.value().total : 0;
}

}  // namespace starling::averaging
