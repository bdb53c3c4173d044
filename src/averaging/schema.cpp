#include "starling/averaging/schema.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include <sodium.h>

namespace starling::averaging {
namespace {

constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 40;

void put_u64(Bytes& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_str(Bytes& out, const std::string& s) {
  put_u64(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// Calls fn(view_index, offset_in_view, flat_offset, count) for every run of [begin, end).
template <class Fn>
void for_each_run(std::span<const TensorView> views, std::uint64_t begin, std::uint64_t end,
                  Fn&& fn) {
  std::uint64_t base = 0;
  for (std::size_t v = 0; v < views.size() && begin < end; ++v) {
    const std::uint64_t n = views[v].data.size();
    if (begin < base + n) {
      const std::uint64_t off = begin - base;
      const std::uint64_t take = std::min<std::uint64_t>(n - off, end - begin);
      fn(v, off, begin, take);
      begin += take;
    }
    base += n;
  }
}

}  // namespace

std::uint64_t TensorSpec::numel() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d < 0 ? 0 : d);
  return n;
}

std::uint64_t Schema::numel() const {
  std::uint64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return n;
}

result<void> validate_schema(const Schema& s) {
  std::set<std::string> names;
  std::uint64_t total = 0;
  for (const auto& t : s.tensors) {
    if (t.name.empty()) return make_error(errc::invalid_argument, "schema: empty tensor name");
    if (!names.insert(t.name).second)
      return make_error(errc::invalid_argument, "schema: duplicate tensor " + t.name);
    if (t.dtype != DType::f32)
      return make_error(errc::unsupported, "schema: tensor " + t.name + ": dtype not f32");
    std::uint64_t n = 1;
    for (auto d : t.shape) {
      if (d < 0) return make_error(errc::invalid_argument, "schema: negative dim in " + t.name);
      if (d > 0 && n > kMaxElements / static_cast<std::uint64_t>(d))
        return make_error(errc::too_large, "schema: tensor " + t.name + " too large");
      n *= static_cast<std::uint64_t>(d);
    }
    total += n;
    if (total > kMaxElements) return make_error(errc::too_large, "schema: more than 2^40 elements");
  }
  if (s.codec.empty()) return make_error(errc::invalid_argument, "schema: empty codec id");
  return success();
}

Bytes blake2b_256(BytesView data) {
  Bytes out(32);
  crypto_generichash(out.data(), out.size(), data.data(), data.size(), nullptr, 0);
  return out;
}

Bytes schema_hash(const Schema& s) {
  Bytes enc = to_bytes("starling-averaging-schema-v1");
  put_u64(enc, s.tensors.size());
  for (const auto& t : s.tensors) {
    put_str(enc, t.name);
    put_u64(enc, static_cast<std::uint64_t>(t.dtype));
    put_u64(enc, t.shape.size());
    for (auto d : t.shape) put_u64(enc, static_cast<std::uint64_t>(d));
  }
  put_str(enc, s.codec);
  return blake2b_256(enc);
}

void gather_flat(std::span<const TensorView> views, std::uint64_t begin, std::span<float> out) {
  for_each_run(views, begin, begin + out.size(),
               [&](std::size_t v, std::uint64_t off, std::uint64_t flat, std::uint64_t n) {
                 std::memcpy(out.data() + (flat - begin), views[v].data.data() + off,
                             n * sizeof(float));
               });
}

void scatter_flat(std::span<const TensorView> views, std::uint64_t begin,
                  std::span<const float> in) {
  for_each_run(views, begin, begin + in.size(),
               [&](std::size_t v, std::uint64_t off, std::uint64_t flat, std::uint64_t n) {
                 std::memcpy(views[v].data.data() + off, in.data() + (flat - begin),
                             n * sizeof(float));
               });
}

result<void> check_views(const Schema& s, std::span<const TensorView> views) {
  if (views.size() != s.tensors.size())
    return make_error(errc::invalid_argument, "averaging: " + std::to_string(views.size()) +
                                                  " tensors given, schema has " +
                                                  std::to_string(s.tensors.size()));
  for (std::size_t i = 0; i < views.size(); ++i) {
    if (views[i].name != s.tensors[i].name)
      return make_error(errc::invalid_argument, "averaging: tensor " + std::to_string(i) + " is '" +
                                                    views[i].name + "', schema says '" +
                                                    s.tensors[i].name + "'");
    if (views[i].data.size() != s.tensors[i].numel())
      return make_error(errc::invalid_argument, "averaging: tensor " + views[i].name + " has " +
                                                    std::to_string(views[i].data.size()) +
                                                    " elements, schema says " +
                                                    std::to_string(s.tensors[i].numel()));
  }
  return success();
}

}  // namespace starling::averaging
