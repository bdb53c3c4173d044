// The training-state format's torch-free codec (see state_format.hpp for the layout).
#include "starling/training/state_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "state_format_layout.hpp"

namespace starling::training::state_format {
namespace {

using namespace layout;

constexpr std::string_view kSgdOptions[] = {"lr", "momentum", "dampening", "weight_decay",
                                            "nesterov"};
constexpr std::string_view kAdamOptions[] = {"lr",  "beta1",        "beta2",
                                             "eps", "weight_decay", "amsgrad"};
constexpr std::string_view kRmspropOptions[] = {"lr",           "alpha",    "eps",
                                                "weight_decay", "momentum", "centered"};
constexpr std::string_view kAdagradOptions[] = {"lr", "lr_decay", "weight_decay",
                                                "initial_accumulator_value", "eps"};
constexpr std::string_view kSgdSlots[] = {"momentum_buffer"};
constexpr std::string_view kAdamSlots[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
constexpr std::string_view kRmspropSlots[] = {"square_avg", "momentum_buffer", "grad_avg"};
constexpr std::string_view kAdagradSlots[] = {"sum"};

bool valid_kind(std::uint8_t k) {
  return k >= static_cast<std::uint8_t>(OptimizerKind::sgd) &&
         k <= static_cast<std::uint8_t>(OptimizerKind::lamb);
}

// All exponent bits set: an infinity or a NaN. Element-wise over unaligned data, read in host
// order (the format's tensors are little-endian, and so must the host be: see
// state_format_torch.cpp).
template <class U>
bool none_all_ones(BytesView data, U exponent) {
  bool ok = true;
  for (std::size_t i = 0; i + sizeof(U) <= data.size(); i += sizeof(U)) {
    U v;
    std::memcpy(&v, data.data() + i, sizeof(U));
    ok &= (v & exponent) != exponent;
  }
  return ok;
}

// ---- Decoding ------------------------------------------------------------------------------

Error bad(std::string what) {
  return Error(errc::invalid_argument, "state format: " + what);
}
Error over(std::string what) {
  return Error(errc::too_large, "state format: " + what);
}

// Reads from a window of the input; offsets in messages are from the start of the input.
class Reader {
 public:
  Reader(BytesView in, std::size_t base) : in_(in), base_(base) {}
  std::size_t left() const { return in_.size() - off_; }
  std::size_t pos() const { return base_ + off_; }

  result<BytesView> take(std::size_t n, std::string_view what) {
    if (n > left())
      return bad(
          fmt::format("truncated {} at byte {}: needs {} bytes, {} left", what, pos(), n, left()));
    BytesView v = in_.subspan(off_, n);
    off_ += n;
    return v;
  }
  template <class T>
  result<T> le(std::string_view what) {
    ST_TRY(auto b, take(sizeof(T), what));
    std::make_unsigned_t<T> u = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i)
      u |= static_cast<std::make_unsigned_t<T>>(std::make_unsigned_t<T>{b[i]} << (8 * i));
    return static_cast<T>(u);
  }
  // A declared count of entries each at least `min_bytes` long must fit in what is left.
  result<void> fits(std::uint64_t count, std::size_t min_bytes, std::string_view what) {
    if (count > left() / min_bytes)
      return bad(fmt::format("{} {} at byte {} cannot fit in the {} bytes left", count, what, pos(),
                             left()));
    return success();
  }

 private:
  BytesView in_;
  std::size_t base_;
  std::size_t off_ = 0;
};

result<std::string> read_name(Reader& r, std::size_t len, std::size_t max, std::string_view what) {
  if (len == 0 || len > max)
    return bad(fmt::format("{} name of {} bytes at byte {} (1..{})", what, len, r.pos(), max));
  ST_TRY(auto b, r.take(len, what));
  for (auto c : b)
    if (c < 0x20 || c > 0x7e)
      return bad(fmt::format("{} name holds byte 0x{:02x} (printable ASCII only)", what, c));
  return std::string(as_string(b));
}

result<TensorView> read_tensor(Reader& r, const Limits& lim, std::string_view what) {
  TensorView t;
  ST_TRY(auto dtype, r.le<std::uint8_t>("dtype"));
  t.dtype = static_cast<Dtype>(dtype);
  const std::size_t size = dtype_size(t.dtype);
  if (size == 0) return bad(fmt::format("{}: unknown dtype {}", what, dtype));
  ST_TRY(auto rank, r.le<std::uint8_t>("rank"));
  if (rank > lim.max_rank)
    return over(fmt::format("{}: rank {} (limit {})", what, rank, lim.max_rank));
  // The bytes the data needs, checked against what is left before anything is allocated.
  std::uint64_t bytes = size;
  t.shape.reserve(rank);
  for (std::uint8_t i = 0; i < rank; ++i) {
    ST_TRY(auto d, r.le<std::int64_t>("dimension"));
    if (d < 0) return bad(fmt::format("{}: negative dimension {}", what, d));
    if (d != 0 && bytes > r.left() / static_cast<std::uint64_t>(d))
      return bad(fmt::format("{}: shape needs more than the {} bytes left", what, r.left()));
    bytes *= static_cast<std::uint64_t>(d);
    t.shape.push_back(d);
  }
  // A zero dimension after a huge one: the product is 0, but the shape itself must be sane.
  if (std::any_of(t.shape.begin(), t.shape.end(),
                  [&](std::int64_t d) { return static_cast<std::uint64_t>(d) > lim.max_bytes; }))
    return over(fmt::format("{}: a dimension over {}", what, lim.max_bytes));
  ST_TRY(t.data, r.take(static_cast<std::size_t>(bytes), what));
  if (t.dtype == Dtype::boolean)
    for (auto b : t.data)
      if (b > 1) return bad(fmt::format("{}: bool value {}", what, b));
  return t;
}

result<std::vector<NamedTensor>> read_list(Reader& r, const Limits& lim, std::string_view sec) {
  ST_TRY(auto count, r.le<std::uint32_t>("tensor count"));
  if (count > lim.max_tensors)
    return over(fmt::format("{}: {} tensors (limit {})", sec, count, lim.max_tensors));
  ST_TRY(r.fits(count, 2 + 1 + 1 + 1, "tensors"));  // name length, 1-byte name, dtype, rank
  std::vector<NamedTensor> out;
  out.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    NamedTensor t;
    ST_TRY(auto len, r.le<std::uint16_t>("name length"));
    ST_TRY(t.name, read_name(r, len, lim.max_name_bytes, "tensor"));
    ST_TRY(t.tensor, read_tensor(r, lim, fmt::format("{} tensor '{}'", sec, t.name)));
    out.push_back(std::move(t));
  }
  std::vector<std::string_view> names;
  names.reserve(out.size());
  for (const auto& t : out) names.emplace_back(t.name);
  std::sort(names.begin(), names.end());
  if (auto d = std::adjacent_find(names.begin(), names.end()); d != names.end())
    return bad(fmt::format("{}: tensor '{}' appears twice", sec, *d));
  return out;
}

result<ParamState> read_param_state(Reader& r, const Limits& lim, OptimizerKind kind,
                                    std::uint32_t params, std::string_view where) {
  ParamState st;
  ST_TRY(st.index, r.le<std::uint32_t>("parameter index"));
  if (st.index >= params)
    return bad(fmt::format("{}: state for parameter {} of {}", where, st.index, params));
  ST_TRY(st.step, r.le<std::int64_t>("step"));
  if (st.step < 0 || st.step > lim.max_step)
    return bad(fmt::format("{}: parameter {} has step {}", where, st.index, st.step));
  ST_TRY(auto n, r.le<std::uint8_t>("slot count"));
  const auto names = slot_names(kind);
  if (n > names.size())
    return bad(
        fmt::format("{}: {} state slots ({} has {})", where, n, kind_name(kind), names.size()));
  for (std::uint8_t i = 0; i < n; ++i) {
    Slot s;
    ST_TRY(s.id, r.le<std::uint8_t>("slot id"));
    if (s.id >= names.size() || (!st.slots.empty() && s.id <= st.slots.back().id))
      return bad(fmt::format("{}: parameter {}: slot id {} out of order or not one of {}'s", where,
                             st.index, s.id, kind_name(kind)));
    ST_TRY(s.tensor,
           read_tensor(r, lim, fmt::format("{} parameter {} {}", where, st.index, names[s.id])));
    st.slots.push_back(std::move(s));
  }
  return st;
}

result<ParamGroup> read_group(Reader& r, const Limits& lim, OptimizerKind kind,
                              std::string_view where) {
  ParamGroup g;
  ST_TRY(auto n_opts, r.le<std::uint8_t>("option count"));
  const auto known = option_names(kind);
  if (n_opts > known.size())
    return bad(
        fmt::format("{}: {} options ({} has {})", where, n_opts, kind_name(kind), known.size()));
  for (std::uint8_t i = 0; i < n_opts; ++i) {
    Option o;
    ST_TRY(auto len, r.le<std::uint8_t>("option name length"));
    ST_TRY(o.name, read_name(r, len, 64, "option"));
    if (std::find(known.begin(), known.end(), o.name) == known.end())
      return bad(fmt::format("{}: '{}' is not an option of {}", where, o.name, kind_name(kind)));
    for (const auto& prev : g.options)
      if (prev.name == o.name) return bad(fmt::format("{}: option '{}' twice", where, o.name));
    ST_TRY(auto bits, r.le<std::uint64_t>("option value"));
    std::memcpy(&o.value, &bits, 8);
    if (!std::isfinite(o.value))
      return bad(fmt::format("{}: option '{}' is not finite", where, o.name));
    g.options.push_back(std::move(o));
  }
  ST_TRY(g.params, r.le<std::uint32_t>("parameter count"));
  if (g.params > lim.max_group_params)
    return over(fmt::format("{}: {} parameters (limit {})", where, g.params, lim.max_group_params));
  ST_TRY(auto n_states, r.le<std::uint32_t>("state count"));
  if (n_states > g.params)
    return bad(fmt::format("{}: {} states for {} parameters", where, n_states, g.params));
  ST_TRY(r.fits(n_states, 4 + 8 + 1, "parameter states"));
  g.states.reserve(n_states);
  for (std::uint32_t i = 0; i < n_states; ++i) {
    ST_TRY(auto st, read_param_state(r, lim, kind, g.params, where));
    if (!g.states.empty() && st.index <= g.states.back().index)
      return bad(fmt::format("{}: parameter {} out of order", where, st.index));
    g.states.push_back(std::move(st));
  }
  return g;
}

result<OptimizerState> read_optimizer(Reader& r, const Limits& lim) {
  OptimizerState o;
  ST_TRY(auto kind, r.le<std::uint8_t>("optimizer kind"));
  if (!valid_kind(kind)) return bad(fmt::format("unknown optimizer kind {}", kind));
  o.kind = static_cast<OptimizerKind>(kind);
  ST_TRY(auto n, r.le<std::uint32_t>("group count"));
  if (n > lim.max_groups)
    return over(fmt::format("{} parameter groups (limit {})", n, lim.max_groups));
  ST_TRY(r.fits(n, 1 + 4 + 4, "parameter groups"));
  for (std::uint32_t i = 0; i < n; ++i) {
    ST_TRY(auto g, read_group(r, lim, o.kind, fmt::format("optimizer group {}", i)));
    o.groups.push_back(std::move(g));
  }
  return o;
}

result<void> read_section(std::uint8_t tag, Reader& r, const Limits& lim, TrainingState& st) {
  switch (tag) {
    case kModel: {
      ST_TRY(st.model, read_list(r, lim, "model"));
      return success();
    }
    case kOptimizer: {
      ST_TRY(auto o, read_optimizer(r, lim));
      st.optimizer = std::move(o);
      return success();
    }
    case kExtra: {
      ST_TRY(st.extra, read_list(r, lim, "extra"));
      if (st.extra.empty()) return bad("empty extra section (the encoder omits it)");
      return success();
    }
    default: {
      if (r.left() == 0) return bad("empty metadata section (the encoder omits it)");
      if (r.left() > lim.max_metadata_bytes)
        return over(
            fmt::format("metadata of {} bytes (limit {})", r.left(), lim.max_metadata_bytes));
      ST_TRY(st.metadata, r.take(r.left(), "metadata"));
      return success();
    }
  }
}

}  // namespace

std::size_t dtype_size(Dtype d) noexcept {
  switch (d) {
    case Dtype::f32:
      return 4;
    case Dtype::f16:
      return 2;
    case Dtype::bf16:
      return 2;
    case Dtype::f64:
      return 8;
    case Dtype::i64:
      return 8;
    case Dtype::i32:
      return 4;
    case Dtype::u8:
      return 1;
    case Dtype::boolean:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(Dtype d) noexcept {
  constexpr std::string_view names[] = {"?",   "f32", "f16", "bf16", "f64",
                                        "i64", "i32", "u8",  "bool"};
  const auto i = static_cast<std::size_t>(d);
  return i < std::size(names) ? names[i] : names[0];
}

std::int64_t TensorView::numel() const noexcept {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

bool all_finite(const TensorView& t) noexcept {
  switch (t.dtype) {
    case Dtype::f32:
      return none_all_ones<std::uint32_t>(t.data, 0x7f800000u);
    case Dtype::f64:
      return none_all_ones<std::uint64_t>(t.data, 0x7ff0000000000000u);
    case Dtype::f16:
      return none_all_ones<std::uint16_t>(t.data, 0x7c00u);
    case Dtype::bf16:
      return none_all_ones<std::uint16_t>(t.data, 0x7f80u);
    default:
      return true;
  }
}

bool operator==(const TensorView& a, const TensorView& b) {
  return a.dtype == b.dtype && a.shape == b.shape &&
         std::equal(a.data.begin(), a.data.end(), b.data.begin(), b.data.end());
}

bool operator==(const TrainingState& a, const TrainingState& b) {
  return a.model == b.model && a.optimizer == b.optimizer && a.extra == b.extra &&
         std::equal(a.metadata.begin(), a.metadata.end(), b.metadata.begin(), b.metadata.end());
}

std::string_view kind_name(OptimizerKind k) noexcept {
  constexpr std::string_view names[] = {"?", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "LAMB"};
  const auto i = static_cast<std::size_t>(k);
  return i < std::size(names) ? names[i] : names[0];
}

std::span<const std::string_view> option_names(OptimizerKind k) noexcept {
  switch (k) {
    case OptimizerKind::sgd:
      return kSgdOptions;
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
    case OptimizerKind::lamb:
      return kAdamOptions;
    case OptimizerKind::rmsprop:
      return kRmspropOptions;
    case OptimizerKind::adagrad:
      return kAdagradOptions;
  }
  return {};
}

std::span<const std::string_view> slot_names(OptimizerKind k) noexcept {
  switch (k) {
    case OptimizerKind::sgd:
      return kSgdSlots;
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
    case OptimizerKind::lamb:
      return kAdamSlots;
    case OptimizerKind::rmsprop:
      return kRmspropSlots;
    case OptimizerKind::adagrad:
      return kAdagradSlots;
  }
  return {};
}

result<TrainingState> decode(BytesView in, const Limits& limits) {
  if (in.size() > limits.max_bytes)
    return over(fmt::format("{} bytes (limit {})", in.size(), limits.max_bytes));
  if (in.size() >= 4 && in[0] == 'P' && in[1] == 'K' && in[2] == 3 && in[3] == 4)
    return Error(errc::unsupported,
                 "state format: a zip file (a torch archive, which older Starling builds wrote): "
                 "this build reads only the Starling state format");
  Reader r(in, 0);
  ST_TRY(auto magic, r.take(sizeof(kMagic), "header"));
  if (!std::equal(magic.begin(), magic.end(), std::begin(kMagic))) return bad("bad magic");
  ST_TRY(auto version, r.le<std::uint32_t>("version"));
  if (version != kVersion)
    return Error(errc::unsupported,
                 fmt::format("state format: version {} (this build reads {})", version, kVersion));
  ST_TRY(auto flags, r.le<std::uint32_t>("flags"));
  if (flags != 0) return bad(fmt::format("unknown flags 0x{:x}", flags));

  TrainingState st;
  std::uint8_t last = 0;
  while (r.left() > 0) {
    ST_TRY(auto tag, r.le<std::uint8_t>("section tag"));
    if (tag <= last || tag > kMetadata)
      return bad(fmt::format("section tag {} at byte {} (unknown, repeated or out of order)", tag,
                             r.pos() - 1));
    if (last == 0 && tag != kModel) return bad("the model section is missing");
    last = tag;
    ST_TRY(auto len, r.le<std::uint64_t>("section length"));
    if (len > r.left())
      return bad(fmt::format("{} section of {} bytes, {} left", kTagNames[tag], len, r.left()));
    const std::size_t base = r.pos();
    ST_TRY(auto body, r.take(static_cast<std::size_t>(len), "section"));
    Reader sec(body, base);
    ST_TRY(read_section(tag, sec, limits, st));
    if (sec.left() != 0)
      return bad(fmt::format("{} section has {} bytes after its end", kTagNames[tag], sec.left()));
  }
  if (last == 0) return bad("the model section is missing");
  return st;
}

}  // namespace starling::training::state_format
