// The training-state format's torch-free codec: the layout (inputs built by hand, byte by
// byte, from the description in state_format.hpp), round trips, and each class of malformed
// input refused with an error that says what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "starling/training/state_format.hpp"

using namespace starling;
namespace sf = starling::training::state_format;

namespace {

// Little-endian byte builder.
struct W {
  Bytes b;
  template <class T>
  W& le(T v) {
    for (std::size_t i = 0; i < sizeof(T); ++i)
      b.push_back(static_cast<std::uint8_t>(static_cast<std::uint64_t>(v) >> (8 * i)));
    return *this;
  }
  W& u8(std::uint8_t v) { return le(v); }
  W& u16(std::uint16_t v) { return le(v); }
  W& u32(std::uint32_t v) { return le(v); }
  W& u64(std::uint64_t v) { return le(v); }
  W& i64(std::int64_t v) { return le(v); }
  W& f64(double v) {
    std::uint64_t bits;
    std::memcpy(&bits, &v, 8);
    return le(bits);
  }
  W& raw(std::string_view s) {
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  W& raw(const Bytes& x) {
    b.insert(b.end(), x.begin(), x.end());
    return *this;
  }
};

Bytes header(std::uint32_t version = 1, std::uint32_t flags = 0) {
  return W().raw("STARSTAT").u32(version).u32(flags).b;
}
Bytes section(std::uint8_t tag, const Bytes& body) {
  return W().u8(tag).u64(body.size()).raw(body).b;
}
Bytes tensor(std::uint8_t dtype, std::vector<std::int64_t> shape, const Bytes& data) {
  W w;
  w.u8(dtype).u8(static_cast<std::uint8_t>(shape.size()));
  for (auto d : shape) w.i64(d);
  return w.raw(data).b;
}
Bytes f32s(std::vector<float> v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
Bytes named(std::string_view name, const Bytes& t) {
  return W().u16(static_cast<std::uint16_t>(name.size())).raw(name).raw(t).b;
}
Bytes list(const std::vector<Bytes>& items) {
  W w;
  w.u32(static_cast<std::uint32_t>(items.size()));
  for (const auto& i : items) w.raw(i);
  return w.b;
}
Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

const Bytes kW = tensor(1, {2, 2}, f32s({1, 2, 3, 4}));
const Bytes kB = tensor(1, {2}, f32s({0.5f, -0.5f}));
Bytes model() {
  return section(1, list({named("0.weight", kW), named("0.bias", kB)}));
}
// An Adam group: options, 2 parameters, parameter 1 with exp_avg and exp_avg_sq at step 3.
Bytes adam_group() {
  return W()
      .u8(2)
      .u8(2)
      .raw("lr")
      .f64(1e-3)
      .u8(7)
      .raw("amsgrad")
      .f64(0)
      .u32(2)
      .u32(1)
      .u32(1)
      .i64(3)
      .u8(2)
      .u8(0)
      .raw(kB)
      .u8(1)
      .raw(kB)
      .b;
}
Bytes optimizer(std::uint8_t kind, const Bytes& groups, std::uint32_t n = 1) {
  return section(2, cat({W().u8(kind).u32(n).b, groups}));
}
Bytes full() {
  return cat({header(), model(), optimizer(2, cat({W().b, adam_group()})),
              section(3, list({named("outer_momentum", kB)})), section(4, to_bytes("epoch=3"))});
}

// decode must fail with `code` and a message containing `needle`.
void refused(const Bytes& in, errc code, const std::string& needle,
             const sf::Limits& lim = sf::Limits()) {
  auto r = sf::decode(in, lim);
  ASSERT_FALSE(r) << "accepted; wanted: " << needle;
  EXPECT_EQ(r.error(), code) << r.error().message();
  EXPECT_NE(r.error().message().find(needle), std::string::npos)
      << "'" << r.error().message() << "' lacks '" << needle << "'";
}
void invalid(const Bytes& in, const std::string& needle) {
  refused(in, errc::invalid_argument, needle);
}

}  // namespace

TEST(StateFormat, HandBuiltLayoutDecodesAndReencodesIdentically) {
  const Bytes in = full();
  auto s = sf::decode(in);
  ASSERT_TRUE(s) << s.error().message();
  const auto& st = s.value();
  ASSERT_EQ(st.model.size(), 2u);
  EXPECT_EQ(st.model[0].name, "0.weight");
  EXPECT_EQ(st.model[0].tensor.shape, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(st.model[0].tensor.dtype, sf::Dtype::f32);
  EXPECT_EQ(st.model[0].tensor.numel(), 4);
  float w[4];
  std::memcpy(w, st.model[0].tensor.data.data(), 16);
  EXPECT_EQ(w[3], 4.0f);
  ASSERT_TRUE(st.optimizer);
  EXPECT_EQ(st.optimizer->kind, sf::OptimizerKind::adam);
  ASSERT_EQ(st.optimizer->groups.size(), 1u);
  const auto& g = st.optimizer->groups[0];
  EXPECT_EQ(g.params, 2u);
  ASSERT_EQ(g.options.size(), 2u);
  EXPECT_EQ(g.options[0].name, "lr");
  EXPECT_EQ(g.options[0].value, 1e-3);
  ASSERT_EQ(g.states.size(), 1u);
  EXPECT_EQ(g.states[0].index, 1u);
  EXPECT_EQ(g.states[0].step, 3);
  ASSERT_EQ(g.states[0].slots.size(), 2u);
  EXPECT_EQ(sf::slot_names(sf::OptimizerKind::adam)[g.states[0].slots[1].id], "exp_avg_sq");
  ASSERT_EQ(st.extra.size(), 1u);
  EXPECT_EQ(st.extra[0].name, "outer_momentum");
  EXPECT_EQ(as_string(st.metadata), "epoch=3");
  auto again = sf::encode(st);
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(again.value(), in);
}

TEST(StateFormat, RoundTripOfEveryDtypeAndEdgeShapes) {
  const std::vector<std::uint8_t> buf(64, 1);  // 1 is a valid value of every dtype, bool too
  sf::TrainingState st;
  for (std::uint8_t d = 1; d <= 8; ++d) {
    sf::TensorView v;
    v.dtype = static_cast<sf::Dtype>(d);
    v.shape = {2, 3};
    v.data = BytesView(buf).first(6 * sf::dtype_size(v.dtype));
    st.model.push_back({std::string(sf::dtype_name(v.dtype)), v});
  }
  sf::TensorView scalar{sf::Dtype::f64, {}, BytesView(buf).first(8)};
  sf::TensorView empty{sf::Dtype::f32, {0, 1000000}, {}};
  st.model.push_back({"scalar", scalar});
  st.model.push_back({"empty", empty});
  st.optimizer.emplace();
  st.optimizer->kind = sf::OptimizerKind::rmsprop;
  st.optimizer->groups.resize(2);  // the second group: no options, no parameters
  st.optimizer->groups[0].params = 3;
  st.optimizer->groups[0].options = {{"centered", 1}, {"lr", -0.0}};
  st.optimizer->groups[0].states = {{0, 1, {{0, scalar}, {2, scalar}}}, {2, 5, {}}};
  auto bytes = sf::encode(st);
  ASSERT_TRUE(bytes) << bytes.error().message();
  auto back = sf::decode(bytes.value());
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_TRUE(back.value() == st);
  EXPECT_EQ(sf::encode(back.value()).value(), bytes.value());
}

// Every strict prefix is refused, except those that end exactly where an optional section
// would begin (they are complete states without it).
TEST(StateFormat, EveryTruncationIsRefusedUnlessItEndsAtASection) {
  const Bytes in = full();
  std::vector<std::size_t> boundaries;
  std::size_t off = 16;
  while (off < in.size()) {
    std::uint64_t len = 0;
    std::memcpy(&len, in.data() + off + 1, 8);
    off += 9 + len;
    boundaries.push_back(off);
  }
  ASSERT_EQ(boundaries.size(), 4u);
  ASSERT_EQ(boundaries.back(), in.size());
  for (std::size_t n = 0; n < in.size(); ++n) {
    auto r = sf::decode(BytesView(in).first(n));
    const bool complete = std::find(boundaries.begin(), boundaries.end(), n) != boundaries.end();
    EXPECT_EQ(r.has_value(), complete) << n << (r ? "" : ": " + r.error().message());
  }
}

// Changed bytes are refused or give a state that re-encodes to exactly the changed input
// (bytes inside tensor data and option values are free; everything else is checked).
TEST(StateFormat, EveryChangedByteIsRefusedOrCanonical) {
  const Bytes in = full();
  std::size_t accepted = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    for (std::uint8_t x : {0x01, 0x80, 0xff}) {
      Bytes b = in;
      b[i] ^= x;
      auto r = sf::decode(b);
      if (!r) continue;
      ++accepted;
      auto again = sf::encode(r.value());
      ASSERT_TRUE(again) << i;
      EXPECT_EQ(again.value(), b) << i;
    }
  }
  EXPECT_GT(accepted, 0u);  // tensor data bytes
}

TEST(StateFormat, HeaderErrors) {
  invalid({}, "truncated header");
  invalid(cat({to_bytes("STARSTAX"), W().u32(1).u32(0).b, model()}), "bad magic");
  refused(cat({header(2), model()}), errc::unsupported, "version 2");
  invalid(cat({header(1, 4), model()}), "unknown flags 0x4");
  refused(cat({to_bytes("PK\x03\x04"), Bytes(100, 0)}), errc::unsupported, "torch archive");
  invalid(header(), "model section is missing");
  sf::Limits small;
  small.max_bytes = 20;
  refused(cat({header(), model()}), errc::too_large, "limit 20", small);
}

TEST(StateFormat, SectionErrors) {
  const Bytes opt = optimizer(1, Bytes{}, 0);
  invalid(cat({header(), opt, model()}), "model section is missing");
  invalid(cat({header(), model(), model()}), "section tag 1");
  invalid(cat({header(), model(), section(3, list({named("x", kB)})), opt}), "section tag 2");
  invalid(cat({header(), model(), section(5, Bytes{})}), "section tag 5");
  invalid(cat({header(), model(), section(0, Bytes{})}), "section tag 0");
  // Declared length beyond the input, and bytes after a section's content.
  invalid(cat({header(), W().u8(1).u64(std::uint64_t{1} << 62).b, list({})}),
          "model section of 4611686018427387904 bytes");
  invalid(cat({header(), section(1, cat({list({}), Bytes{0}}))}), "1 bytes after its end");
  // A section's content may not run past its declared length into the next one.
  Bytes m = model();
  m[1] -= 1;
  invalid(cat({header(), m, Bytes{0}}), "model tensor '0.bias': shape needs more than the 7 bytes");
  invalid(cat({header(), model(), section(3, list({}))}), "empty extra section");
  invalid(cat({header(), model(), section(4, Bytes{})}), "empty metadata section");
  sf::Limits lim;
  lim.max_metadata_bytes = 10;
  refused(cat({header(), model(), section(4, Bytes(11, 'm'))}), errc::too_large,
          "metadata of 11 bytes", lim);
}

TEST(StateFormat, TensorErrors) {
  auto one = [](const Bytes& t, std::string_view name = "t") {
    return cat({header(), section(1, list({named(name, t)}))});
  };
  invalid(one(tensor(0, {1}, Bytes(4))), "unknown dtype 0");
  invalid(one(tensor(9, {1}, Bytes(4))), "unknown dtype 9");
  refused(one(tensor(1, std::vector<std::int64_t>(9, 1), Bytes(4))), errc::too_large, "rank 9");
  invalid(one(tensor(1, {-1}, Bytes{})), "negative dimension -1");
  // Declared sizes far beyond the input (and beyond 64 bits) are refused before allocating.
  invalid(one(tensor(1, {std::int64_t{1} << 40}, Bytes(8))), "shape needs more than");
  invalid(one(tensor(8, {std::int64_t{1} << 62, std::int64_t{1} << 62}, Bytes{})),
          "shape needs more than");
  refused(one(tensor(1, {0, std::int64_t{1} << 60}, Bytes{})), errc::too_large, "a dimension over");
  invalid(one(tensor(1, {3}, Bytes(11))), "model tensor 't': shape needs more than the 11 bytes");
  invalid(one(tensor(4, {}, Bytes(7))), "truncated model tensor 't'");
  invalid(one(tensor(8, {2}, Bytes{1, 2})), "bool value 2");
  // Names: empty, too long, not printable, twice.
  invalid(one(kB, ""), "tensor name of 0 bytes");
  invalid(one(kB, std::string(257, 'n')), "tensor name of 257 bytes");
  invalid(one(kB, "a\nb"), "byte 0x0a");
  invalid(cat({header(), section(1, list({named("x", kB), named("x", kB)}))}),
          "tensor 'x' appears twice");
  // Counts: over the limit, and more than the input can hold.
  refused(cat({header(), section(1, W().u32(0xffffffff).b)}), errc::too_large,
          "4294967295 tensors");
  invalid(cat({header(), section(1, W().u32(1000).raw(named("x", kB)).b)}),
          "1000 tensors at byte 29 cannot fit");
}

TEST(StateFormat, OptimizerErrors) {
  auto group = [](std::initializer_list<std::pair<std::string_view, double>> opts,
                  std::uint32_t params, const Bytes& states, std::uint32_t n_states) {
    W w;
    w.u8(static_cast<std::uint8_t>(opts.size()));
    for (const auto& [n, v] : opts) w.u8(static_cast<std::uint8_t>(n.size())).raw(n).f64(v);
    return w.u32(params).u32(n_states).raw(states).b;
  };
  auto with = [](std::uint8_t kind, const Bytes& g) {
    return cat({header(), model(), optimizer(kind, g)});
  };
  auto state = [](std::uint32_t index, std::int64_t step, const Bytes& slots, std::uint8_t n) {
    return W().u32(index).i64(step).u8(n).raw(slots).b;
  };
  const Bytes slot0 = cat({Bytes{0}, kB});
  invalid(with(0, group({}, 0, {}, 0)), "unknown optimizer kind 0");
  invalid(with(7, group({}, 0, {}, 0)), "unknown optimizer kind 7");
  invalid(with(1, group({{"beta1", 0.9}}, 0, {}, 0)), "'beta1' is not an option of SGD");
  invalid(with(2, group({{"lr", 0.1}, {"lr", 0.2}}, 0, {}, 0)), "option 'lr' twice");
  invalid(with(2, group({{"lr", std::nan("")}}, 0, {}, 0)), "option 'lr' is not finite");
  invalid(with(2, group({{"lr", INFINITY}}, 0, {}, 0)), "option 'lr' is not finite");
  refused(with(2, group({}, 1 << 20, {}, 0)), errc::too_large, "1048576 parameters");
  invalid(with(2, group({}, 1, {}, 2)), "2 states for 1 parameters");
  invalid(with(2, group({}, 2, state(2, 0, {}, 0), 1)), "state for parameter 2 of 2");
  invalid(with(2, group({}, 3, cat({state(1, 0, {}, 0), state(0, 0, {}, 0)}), 2)),
          "parameter 0 out of order");
  invalid(with(2, group({}, 1, state(0, -1, {}, 0), 1)), "has step -1");
  invalid(with(2, group({}, 1, state(0, std::int64_t{1} << 60, {}, 0), 1)), "has step");
  invalid(with(1, group({}, 1, state(0, 0, cat({slot0, slot0}), 2), 1)), "2 state slots");
  invalid(with(2, group({}, 1, state(0, 0, cat({Bytes{3}, kB}), 1), 1)), "slot id 3");
  invalid(with(2, group({}, 1, state(0, 0, cat({Bytes{1}, kB, Bytes{0}, kB}), 2), 1)),
          "slot id 0 out of order");
  invalid(with(2, group({}, 1, state(0, 0, cat({Bytes{1}, tensor(1, {2}, Bytes(3))}), 1), 1)),
          "optimizer group 0 parameter 0 exp_avg_sq: shape needs more than the 3 bytes");
  refused(cat({header(), model(), section(2, W().u8(2).u32(65).b)}), errc::too_large,
          "65 parameter groups");
  invalid(cat({header(), model(), section(2, W().u8(2).u32(50).b)}), "50 parameter groups");
  // The hand-built valid group is accepted (the cases above differ from it in one thing).
  EXPECT_TRUE(sf::decode(with(2, adam_group())));
}

TEST(StateFormat, EncodeRefusesStatesTheDecoderWouldRefuse) {
  const Bytes data(16, 0);
  sf::TrainingState st;
  st.model.push_back({"w", {sf::Dtype::f32, {2}, BytesView(data).first(4)}});  // needs 8 bytes
  EXPECT_EQ(sf::encode(st).error(), errc::invalid_argument);
  st.model[0].tensor.data = BytesView(data).first(8);
  ASSERT_TRUE(sf::encode(st));
  st.model.push_back({std::string(300, 'x'), st.model[0].tensor});
  EXPECT_FALSE(sf::encode(st));
  st.model.pop_back();
  st.optimizer.emplace();
  st.optimizer->groups.push_back({{{"nesterov", 1}}, 0, {}});  // an SGD option, kind Adagrad
  st.optimizer->kind = sf::OptimizerKind::adagrad;
  EXPECT_FALSE(sf::encode(st));
  st.optimizer->kind = sf::OptimizerKind::sgd;
  EXPECT_TRUE(sf::encode(st));
}
