// Starling's training-state format (STARSTAT v1): a model's tensors, its optimizer's state and
// extra tensors as one byte string, for checkpoints and for state transfer to peers that fall
// behind. The codec here is torch-free (plain structs of spans into the input), so it can be
// fuzzed cheaply; training_state.hpp converts to and from torch. The bytes come from untrusted
// peers: decode() bounds every count, rank, name and size (against the input length, before
// anything is allocated) and accepts only the canonical encoding, so encode(decode(x)) == x.
//
// Layout (integers little-endian, doubles IEEE-754 binary64 little-endian):
//   "STARSTAT" | u32 version (1) | u32 flags (0)
//   sections, tags strictly increasing, each: u8 tag | u64 body length | body
//     1 model tensors (required)   2 optimizer (optional)   3 extra tensors (optional)
//     4 metadata (optional, opaque bytes)
//   tensor list: u32 count, then per tensor: u16 name length | name | tensor
//     names: 1..max_name_bytes printable ASCII, unique within the list
//   tensor: u8 dtype | u8 rank | i64 dims[rank] | raw little-endian data (numel * size bytes)
//     bool values are 0 or 1
//   optimizer: u8 kind | u32 group count | per group:
//     u8 option count | per option: u8 name length | name | f64 value (finite, names unique and
//     from the kind's closed set)
//     u32 parameter count | u32 state count | per state (parameter index strictly increasing):
//       u32 parameter index | i64 step | u8 slot count | per slot (ids strictly increasing):
//       u8 slot id (index into the kind's slot names) | tensor
//
// Threading rule: plain functions, no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "starling/core/bytes.hpp"

namespace starling::training::state_format {

inline constexpr std::uint32_t kVersion = 1;

enum class Dtype : std::uint8_t { f32 = 1, f16, bf16, f64, i64, i32, u8, boolean };
// Bytes per element; 0 for a value outside the enum.
std::size_t dtype_size(Dtype d) noexcept;
std::string_view dtype_name(Dtype d) noexcept;

struct TensorView {
  Dtype dtype = Dtype::f32;
  std::vector<std::int64_t> shape;
  BytesView data;  // numel * dtype_size bytes, little-endian
  std::int64_t numel() const noexcept;
  friend bool operator==(const TensorView& a, const TensorView& b);
};

// False if a floating tensor (f32, f16, bf16, f64) holds an infinity or a NaN.
bool all_finite(const TensorView& t) noexcept;

struct NamedTensor {
  std::string name;
  TensorView tensor;
  friend bool operator==(const NamedTensor&, const NamedTensor&) = default;
};

// The optimizers whose state the format carries (those libtorch ships, except LBFGS, and
// Starling's LAMB, whose options and state slots are AdamW's: a distinct kind so that neither
// loads as the other).
enum class OptimizerKind : std::uint8_t { sgd = 1, adam, adamw, rmsprop, adagrad, lamb };
std::string_view kind_name(OptimizerKind k) noexcept;
// The closed sets of option names and of per-parameter state slots of each kind.
std::span<const std::string_view> option_names(OptimizerKind k) noexcept;
std::span<const std::string_view> slot_names(OptimizerKind k) noexcept;

struct Option {
  std::string name;
  double value = 0;  // booleans (amsgrad, nesterov, centered) as 0 / 1
  friend bool operator==(const Option&, const Option&) = default;
};
struct Slot {
  std::uint8_t id = 0;  // index into slot_names(kind)
  TensorView tensor;
  friend bool operator==(const Slot&, const Slot&) = default;
};
struct ParamState {
  std::uint32_t index = 0;  // position of the parameter in its group
  std::int64_t step = 0;    // 0 for SGD (it keeps none)
  std::vector<Slot> slots;
  friend bool operator==(const ParamState&, const ParamState&) = default;
};
struct ParamGroup {
  std::vector<Option> options;
  std::uint32_t params = 0;
  std::vector<ParamState> states;  // parameters without state are absent
  friend bool operator==(const ParamGroup&, const ParamGroup&) = default;
};
struct OptimizerState {
  OptimizerKind kind = OptimizerKind::sgd;
  std::vector<ParamGroup> groups;
  friend bool operator==(const OptimizerState&, const OptimizerState&) = default;
};

// A decoded state points into the input (or, for encode, into the caller's tensors).
struct TrainingState {
  std::vector<NamedTensor> model;  // parameters and buffers, dotted names
  std::optional<OptimizerState> optimizer;
  std::vector<NamedTensor> extra;
  BytesView metadata;
  friend bool operator==(const TrainingState& a, const TrainingState& b);
};

struct Limits {
  std::size_t max_bytes = std::size_t{16} << 30;  // the whole input
  std::uint32_t max_tensors = 1 << 16;            // per tensor list
  std::uint32_t max_rank = 8;
  std::uint32_t max_name_bytes = 256;
  std::uint32_t max_groups = 64;
  std::uint32_t max_group_params = 1 << 16;
  std::size_t max_metadata_bytes = 1 << 20;
  std::int64_t max_step = std::int64_t{1} << 53;
};

// errc::invalid_argument if `state` breaks the format's rules (the same ones decode checks);
// errc::too_large over a limit.
result<Bytes> encode(const TrainingState& state, const Limits& limits = {});
// errc::invalid_argument naming what is wrong and where (section, tensor name, byte offset);
// errc::too_large when the input or a declared size is over a limit; errc::unsupported for an
// unknown version (or a torch archive, the format of older Starling versions).
result<TrainingState> decode(BytesView in, const Limits& limits = {});

}  // namespace starling::training::state_format
