// Training state save/load in Starling's state format and checkpoints: a round trip for every
// optimizer kind the format carries, and every class of bad state (malformed, mismatched,
// hostile) refused with a clear error while the receiver's model and optimizer stay exactly
// as they were.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <sstream>

#include <torch/nn.h>
#include <torch/optim.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include "starling/optim/fashion_task.hpp"
#include "starling/optim/lamb.hpp"
#include "starling/optim/training_state.hpp"
#include "starling/training/state_format.hpp"
#include "support/temp_dir.hpp"
#include "torch_helpers.hpp"

using namespace starling;
using namespace starling::optim;
using namespace starling::training;
using torch_helpers::same_parameters;
using torch_helpers::train_step;
namespace sf = starling::training::state_format;
namespace to = torch::optim;

namespace {

// Options that make each optimizer keep every state slot it has.
std::unique_ptr<to::Optimizer> make_optimizer(sf::OptimizerKind k, std::vector<torch::Tensor> p,
                                              double lr = 1e-3) {
  switch (k) {
    case sf::OptimizerKind::sgd:
      return std::make_unique<to::SGD>(p, to::SGDOptions(lr).momentum(0.9).nesterov(true));
    case sf::OptimizerKind::adam:
      return std::make_unique<to::Adam>(p, to::AdamOptions(lr).amsgrad(true));
    case sf::OptimizerKind::adamw:
      return std::make_unique<to::AdamW>(p, to::AdamWOptions(lr).weight_decay(0.05));
    case sf::OptimizerKind::rmsprop:
      return std::make_unique<to::RMSprop>(p, to::RMSpropOptions(lr).momentum(0.5).centered(true));
    case sf::OptimizerKind::adagrad:
      return std::make_unique<to::Adagrad>(
          p, to::AdagradOptions(lr).lr_decay(0.01).initial_accumulator_value(0.1));
    case sf::OptimizerKind::lamb: {
      optim::LambConfig c;
      c.lr = lr;
      c.weight_decay = 0.01;
      return std::make_unique<optim::Lamb>(p, c);
    }
  }
  return nullptr;
}

Bytes save(torch::nn::Module& m, to::Optimizer* o, const NamedTensors& extra = {}) {
  auto s = save_training_state(m, o, extra);
  EXPECT_TRUE(s) << s.error().message();
  return s ? s.value() : Bytes{};
}

// Re-encodes `bytes` after `edit` changed the decoded state (views stay in `bytes`).
template <class F>
Bytes edited(const Bytes& bytes, F&& edit) {
  auto s = sf::decode(bytes);
  EXPECT_TRUE(s);
  edit(s.value());
  auto out = sf::encode(s.value());
  EXPECT_TRUE(out) << out.error().message();
  return out.value();
}

class RoundTrip : public ::testing::TestWithParam<sf::OptimizerKind> {};

}  // namespace

// The state after loading equals the donor's (same bytes when saved again), and the next step
// gives bit-identical parameters (a fresh optimizer would not: its state starts empty).
TEST_P(RoundTrip, StateAfterLoadEqualsBeforeAndTheNextStepAgrees) {
  auto a = make_fashion_model(FashionModel::mlp, 1);
  auto opt_a = make_optimizer(GetParam(), a->parameters());
  for (int i = 0; i < 3; ++i) train_step(a, *opt_a, i);
  const Bytes state = save(*a, opt_a.get());

  auto b = make_fashion_model(FashionModel::mlp, 2);
  auto opt_b = make_optimizer(GetParam(), b->parameters());
  train_step(b, *opt_b, 7);  // some other state to overwrite
  ASSERT_FALSE(same_parameters(*a, *b));
  auto r = load_training_state(state, *b, opt_b.get());
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_TRUE(same_parameters(*a, *b));
  EXPECT_EQ(save(*b, opt_b.get()), state);
  train_step(a, *opt_a, 10);
  train_step(b, *opt_b, 10);
  EXPECT_TRUE(same_parameters(*a, *b));
  EXPECT_EQ(save(*b, opt_b.get()), save(*a, opt_a.get()));
}

INSTANTIATE_TEST_SUITE_P(EveryKind, RoundTrip,
                         ::testing::Values(sf::OptimizerKind::sgd, sf::OptimizerKind::adam,
                                           sf::OptimizerKind::adamw, sf::OptimizerKind::rmsprop,
                                           sf::OptimizerKind::adagrad, sf::OptimizerKind::lamb),
                         [](const auto& info) { return std::string(sf::kind_name(info.param)); });

// LAMB keeps AdamW's options and state slots, but its update differs: a state saved by one
// never loads into the other.
TEST(TrainingState, LambAndAdamWStatesDoNotLoadAsEachOther) {
  auto a = make_fashion_model(FashionModel::mlp, 1);
  auto lamb = make_optimizer(sf::OptimizerKind::lamb, a->parameters());
  auto adamw = make_optimizer(sf::OptimizerKind::adamw, a->parameters());
  train_step(a, *lamb, 0);
  train_step(a, *adamw, 1);
  const Bytes from_lamb = save(*a, lamb.get());
  const Bytes from_adamw = save(*a, adamw.get());
  auto decoded = sf::decode(from_lamb);
  ASSERT_TRUE(decoded);
  ASSERT_TRUE(decoded.value().optimizer);
  EXPECT_EQ(decoded.value().optimizer->kind, sf::OptimizerKind::lamb);
  auto r1 = load_training_state(from_lamb, *a, adamw.get());
  ASSERT_FALSE(r1);
  EXPECT_NE(r1.error().message().find("LAMB"), std::string::npos) << r1.error().message();
  auto r2 = load_training_state(from_adamw, *a, lamb.get());
  ASSERT_FALSE(r2);
  EXPECT_NE(r2.error().message().find("AdamW"), std::string::npos) << r2.error().message();
}

TEST(TrainingState, BuffersAndExtrasRoundTrip) {
  auto make = [](int seed) {
    torch::manual_seed(seed);
    return torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
  };
  auto a = make(1), b = make(2);
  a->forward(torch::randn({5, 4}));  // moves running_mean / running_var / num_batches_tracked
  NamedTensors extra_a{{"outer_momentum", torch::randn({3, 2})},
                       {"counts", torch::tensor({3, 4}, torch::kLong)}};
  const Bytes state = save(*a, nullptr, extra_a);
  NamedTensors extra_b{{"counts", torch::zeros({2}, torch::kLong)},
                       {"outer_momentum", torch::zeros({3, 2})}};
  auto r = load_training_state(state, *b, nullptr, &extra_b);
  ASSERT_TRUE(r) << r.error().message();
  for (const auto& item : a->named_buffers())
    EXPECT_TRUE(torch::equal(item.value(), b->named_buffers()[item.key()])) << item.key();
  EXPECT_EQ(b->named_buffers()["1.num_batches_tracked"].item<std::int64_t>(), 1);
  EXPECT_TRUE(same_parameters(*a, *b));
  EXPECT_TRUE(torch::equal(extra_b[0].second, extra_a[1].second));
  EXPECT_TRUE(torch::equal(extra_b[1].second, extra_a[0].second));
}

TEST(TrainingState, RejectsMismatchAndGarbageWithoutTouchingTheModel) {
  auto mlp = make_fashion_model(FashionModel::mlp, 1);
  auto cnn = make_fashion_model(FashionModel::cnn, 1);
  auto cnn_before = make_fashion_model(FashionModel::cnn, 1);
  const Bytes state = save(*mlp, nullptr);
  auto r = load_training_state(state, *cnn, nullptr);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument);
  EXPECT_NE(r.error().message().find("missing"), std::string::npos) << r.error().message();
  EXPECT_TRUE(same_parameters(*cnn, *cnn_before));
  // Missing optimizer state, missing extras.
  to::Adam adam(mlp->parameters());
  EXPECT_NE(load_training_state(state, *mlp, &adam).error().message().find("no optimizer state"),
            std::string::npos);
  NamedTensors extra{{"x", torch::zeros({1})}};
  EXPECT_FALSE(load_training_state(state, *mlp, nullptr, &extra));
  EXPECT_FALSE(load_training_state(Bytes(1000, 0x42), *mlp, nullptr));

  // Every truncation of a small model's state is refused and changes nothing.
  torch::manual_seed(3);
  torch::nn::Linear small(3, 2);
  to::Adam small_adam(small->parameters());
  small->weight.mutable_grad() = torch::ones({2, 3});
  small_adam.step();
  const Bytes full = save(*small, &small_adam);
  torch::manual_seed(4);
  torch::nn::Linear other(3, 2);
  to::Adam other_adam(other->parameters());
  const Bytes other_before = save(*other, &other_adam);
  for (std::size_t n = 0; n < full.size(); ++n) {
    auto t = load_training_state(BytesView(full).first(n), *other, &other_adam);
    ASSERT_FALSE(t) << n;
    ASSERT_EQ(save(*other, &other_adam), other_before) << n;
  }
  ASSERT_TRUE(load_training_state(full, *other, &other_adam));
  EXPECT_EQ(save(*other, &other_adam), full);
}

// What a hostile or broken donor can send. Each is refused with an error saying what is
// wrong, and the receiver's model and optimizer state stay exactly as they were.
TEST(TrainingState, HostileStateIsRefusedAndChangesNothing) {
  auto mine = make_fashion_model(FashionModel::mlp, 1);
  to::Adam adam(mine->parameters());
  train_step(mine, adam, 1);
  const Bytes before = save(*mine, &adam);
  auto refused = [&](const Bytes& s, errc code, const std::string& needle) {
    auto r = load_training_state(s, *mine, &adam);
    ASSERT_FALSE(r) << needle;
    EXPECT_EQ(r.error(), code) << r.error().message();
    EXPECT_NE(r.error().message().find(needle), std::string::npos) << r.error().message();
    EXPECT_EQ(save(*mine, &adam), before) << needle;
  };
  auto donor = make_fashion_model(FashionModel::mlp, 4);
  to::Adam adam_donor(donor->parameters());
  train_step(donor, adam_donor, 6);
  const Bytes good = save(*donor, &adam_donor);

  // Parameters as float64; a NaN parameter; a NaN moment.
  auto wide = make_fashion_model(FashionModel::mlp, 2);
  wide->to(torch::kFloat64);
  to::Adam adam_wide(wide->parameters());
  refused(save(*wide, &adam_wide), errc::invalid_argument, "Double");
  auto nan = make_fashion_model(FashionModel::mlp, 3);
  {
    torch::NoGradGuard g;
    nan->parameters()[0].view(-1)[5] = std::numeric_limits<float>::quiet_NaN();
  }
  to::Adam adam_nan(nan->parameters());
  refused(save(*nan, &adam_nan), errc::invalid_argument, "non-finite");
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  Bytes nan_moment = good;
  {
    auto s = sf::decode(nan_moment).value();
    auto data = s.optimizer->groups[0].states[0].slots[0].tensor.data;
    const auto at = static_cast<std::size_t>(data.data() - nan_moment.data());
    std::memcpy(nan_moment.data() + at, &qnan, 4);
  }
  refused(nan_moment, errc::invalid_argument, "non-finite");

  // Right parameters, but Adam moments of flattened shapes (same count of tensors).
  std::vector<torch::Tensor> flat;
  for (auto& p : donor->parameters()) {
    flat.push_back(torch::zeros({p.numel()}, torch::requires_grad()));
    flat.back().mutable_grad() = torch::ones({p.numel()});
  }
  to::Adam adam_flat(flat);
  adam_flat.step();
  refused(save(*donor, &adam_flat), errc::invalid_argument, "optimizer state of shape");

  // Another optimizer kind; a state without a slot the next step needs (amsgrad); state for
  // parameters of another group layout; a tensor the model does not have.
  auto sgd = make_optimizer(sf::OptimizerKind::sgd, donor->parameters());
  train_step(donor, *sgd, 2);
  refused(save(*donor, sgd.get()), errc::invalid_argument,
          "optimizer state is SGD's, this optimizer is Adam");
  to::Adam amsgrad(mine->parameters(), to::AdamOptions().amsgrad(true));
  auto r = load_training_state(good, *mine, &amsgrad);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("lacks 'max_exp_avg_sq'"), std::string::npos)
      << r.error().message();
  refused(edited(good, [](sf::TrainingState& s) { s.optimizer->groups.push_back({}); }),
          errc::invalid_argument, "2 parameter groups");
  refused(edited(good,
                 [](sf::TrainingState& s) {
                   s.model.push_back({"9.weight", s.model[0].tensor});
                 }),
          errc::invalid_argument, "'9.weight' is not in this model");
  refused(edited(good, [](sf::TrainingState& s) { s.model.pop_back(); }), errc::invalid_argument,
          "missing");

  // Malformed bytes: a huge declared tensor count, an unknown version, a torch archive.
  Bytes huge = good;
  huge[25] = huge[26] = huge[27] = huge[28] = 0xff;  // the model section's tensor count
  refused(huge, errc::too_large, "4294967295 tensors");
  Bytes v2 = good;
  v2[8] = 2;
  refused(v2, errc::unsupported, "version 2");
  std::ostringstream zip;
  {
    torch::serialize::OutputArchive ar;
    donor->save(ar);
    ar.save_to(zip);
  }
  const std::string z = zip.str();
  refused(Bytes(z.begin(), z.end()), errc::unsupported, "torch archive");

  // The receiver still trains, and a well-formed state of the same model loads.
  train_step(mine, adam, 5);
  ASSERT_TRUE(load_training_state(good, *mine, &adam));
  EXPECT_EQ(save(*mine, &adam), good);
}

TEST(TrainingState, AdagradNeedsStateForEveryParameter) {
  auto a = make_fashion_model(FashionModel::mlp, 1);
  auto opt = make_optimizer(sf::OptimizerKind::adagrad, a->parameters());
  const Bytes good = save(*a, opt.get());
  const Bytes partial =
      edited(good, [](sf::TrainingState& s) { s.optimizer->groups[0].states.pop_back(); });
  auto r = load_training_state(partial, *a, opt.get());
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("Adagrad state for 3 of 4 parameters"), std::string::npos)
      << r.error().message();
  EXPECT_EQ(save(*a, opt.get()), good);
}

// Other optimizers are refused clearly; the parameters alone still move.
TEST(TrainingState, UnsupportedOptimizerIsRefusedClearly) {
  auto a = make_fashion_model(FashionModel::mlp, 1);
  to::LBFGS lbfgs(a->parameters());
  auto ok = state_format_supports(lbfgs);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error(), errc::unsupported);
  EXPECT_NE(ok.error().message().find("LBFGS"), std::string::npos) << ok.error().message();
  EXPECT_TRUE(state_format_supports(to::Adam(a->parameters())));
  auto s = save_training_state(*a, &lbfgs);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error(), errc::unsupported);
  const Bytes params_only = save(*a, nullptr);
  auto b = make_fashion_model(FashionModel::mlp, 2);
  EXPECT_EQ(load_training_state(params_only, *b, &lbfgs).error(), errc::invalid_argument);
  ASSERT_TRUE(load_training_state(params_only, *b, nullptr));
  EXPECT_TRUE(same_parameters(*a, *b));
}

// The receiver's hyperparameters stay its own (as with torch's Optimizer::load).
TEST(TrainingState, ReceiverKeepsItsOwnOptions) {
  auto a = make_fashion_model(FashionModel::mlp, 1);
  auto b = make_fashion_model(FashionModel::mlp, 2);
  to::Adam adam_a(a->parameters(), to::AdamOptions(0.1));
  to::Adam adam_b(b->parameters(), to::AdamOptions(0.001));
  train_step(a, adam_a, 1);
  ASSERT_TRUE(load_training_state(save(*a, &adam_a), *b, &adam_b));
  EXPECT_TRUE(same_parameters(*a, *b));
  EXPECT_EQ(adam_b.param_groups()[0].options().get_lr(), 0.001);
}

TEST(TrainingState, CheckpointSaveAndResume) {
  test::TempDir dir("torch");
  auto cd = CheckpointDir::open(dir.path);
  ASSERT_TRUE(cd);
  auto a = make_fashion_model(FashionModel::mlp, 1);
  to::Adam adam_a(a->parameters());
  train_step(a, adam_a, 1);
  CheckpointMeta m;
  m.run_id = "r";
  m.epoch = 12;
  m.samples_total = 345;
  m.task = "fashion-mnist/mlp";
  NamedTensors extra{{"anchor", torch::randn({4})}};
  ASSERT_TRUE(save_checkpoint(cd.value(), m, *a, &adam_a, extra));

  auto b = make_fashion_model(FashionModel::mlp, 2);
  to::Adam adam_b(b->parameters());
  NamedTensors extra_b{{"anchor", torch::zeros({4})}};
  auto loaded = load_latest_checkpoint(cd.value(), *b, &adam_b, &extra_b);
  ASSERT_TRUE(loaded) << loaded.error().message();
  ASSERT_TRUE(loaded.value().has_value());
  EXPECT_EQ(loaded.value()->epoch, 12u);
  EXPECT_EQ(loaded.value()->samples_total, 345u);
  EXPECT_EQ(loaded.value()->parameter_names, parameter_names(*a));
  EXPECT_TRUE(same_parameters(*a, *b));
  EXPECT_TRUE(torch::equal(extra_b[0].second, extra[0].second));
  train_step(a, adam_a, 2);
  train_step(b, adam_b, 2);
  EXPECT_TRUE(same_parameters(*a, *b));

  auto wrong = make_fashion_model(FashionModel::cnn, 1);
  EXPECT_FALSE(load_latest_checkpoint(cd.value(), *wrong, nullptr));
}

// A checkpoint written by an older build holds a torch archive: refused, naming the file and
// the format, and nothing changes.
TEST(TrainingState, OldTorchArchiveCheckpointIsRefusedNamingTheFile) {
  test::TempDir dir("torch-old");
  auto cd = CheckpointDir::open(dir.path);
  ASSERT_TRUE(cd);
  auto a = make_fashion_model(FashionModel::mlp, 1);
  std::ostringstream zip;
  {
    torch::serialize::OutputArchive root, model_ar(root.compilation_unit());
    a->save(model_ar);
    root.write("model", model_ar);
    root.save_to(zip);
  }
  const std::string z = zip.str();
  CheckpointMeta m;
  m.epoch = 3;
  m.parameter_names = parameter_names(*a);
  auto path = cd.value().save(m, Bytes(z.begin(), z.end()));
  ASSERT_TRUE(path);
  auto b = make_fashion_model(FashionModel::mlp, 2);
  auto b_before = make_fashion_model(FashionModel::mlp, 2);
  auto r = load_latest_checkpoint(cd.value(), *b, nullptr);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::unsupported);
  EXPECT_NE(r.error().message().find(path.value().string()), std::string::npos)
      << r.error().message();
  EXPECT_NE(r.error().message().find("torch archive"), std::string::npos) << r.error().message();
  EXPECT_TRUE(same_parameters(*b, *b_before));
}
