// torch <-> state format conversions: tensors and the optimizers the format carries.
#include "state_format_torch.hpp"

#include <bit>
#include <cstring>

#include <c10/util/Type.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <fmt/format.h>

#include "starling/optim/lamb.hpp"

namespace starling::optim::state_torch {
namespace o = torch::optim;
using K = sf::OptimizerKind;

// Tensor data is stored as it lies in memory; the format says little-endian.
static_assert(std::endian::native == std::endian::little,
              "the state format stores tensors little-endian: a big-endian host needs byte swaps");

namespace {

// AdamOptions and AdamWOptions have the same fields; so have their param states.
template <class Options>
std::vector<sf::Option> adam_options(const Options& a) {
  return {
      {"lr", a.lr()},   {"beta1", std::get<0>(a.betas())},  {"beta2", std::get<1>(a.betas())},
      {"eps", a.eps()}, {"weight_decay", a.weight_decay()}, {"amsgrad", a.amsgrad() ? 1.0 : 0.0}};
}

template <class State>
std::unique_ptr<o::OptimizerParamState> adam_state(std::int64_t step,
                                                   const std::vector<torch::Tensor>& s) {
  auto st = std::make_unique<State>();
  st->step(step);
  st->exp_avg(s[0]);
  st->exp_avg_sq(s[1]);
  st->max_exp_avg_sq(s[2]);
  return st;
}

}  // namespace

result<sf::Dtype> wire_dtype(const torch::Tensor& t) {
  if (!t.device().is_cpu() || t.layout() != torch::kStrided)
    return make_error(errc::unsupported, "state format: only dense CPU tensors");
  switch (t.scalar_type()) {
    case torch::kFloat:
      return sf::Dtype::f32;
    case torch::kHalf:
      return sf::Dtype::f16;
    case torch::kBFloat16:
      return sf::Dtype::bf16;
    case torch::kDouble:
      return sf::Dtype::f64;
    case torch::kLong:
      return sf::Dtype::i64;
    case torch::kInt:
      return sf::Dtype::i32;
    case torch::kByte:
      return sf::Dtype::u8;
    case torch::kBool:
      return sf::Dtype::boolean;
    default:
      return make_error(errc::unsupported, fmt::format("state format: no dtype for {}",
                                                       c10::toString(t.scalar_type())));
  }
}

c10::ScalarType torch_dtype(sf::Dtype d) {
  switch (d) {
    case sf::Dtype::f32:
      return torch::kFloat;
    case sf::Dtype::f16:
      return torch::kHalf;
    case sf::Dtype::bf16:
      return torch::kBFloat16;
    case sf::Dtype::f64:
      return torch::kDouble;
    case sf::Dtype::i64:
      return torch::kLong;
    case sf::Dtype::i32:
      return torch::kInt;
    case sf::Dtype::u8:
      return torch::kByte;
    case sf::Dtype::boolean:
      return torch::kBool;
  }
  return torch::kFloat;  // not reached: decode accepts only the values above
}

sf::TensorView view_of(const torch::Tensor& t, sf::Dtype d) {
  sf::TensorView v;
  v.dtype = d;
  v.shape.assign(t.sizes().begin(), t.sizes().end());
  v.data = BytesView(static_cast<const std::uint8_t*>(t.data_ptr()), t.nbytes());
  return v;
}

torch::Tensor to_tensor(const sf::TensorView& v) {
  auto t = torch::empty(v.shape, torch::TensorOptions().dtype(torch_dtype(v.dtype)));
  if (!v.data.empty()) std::memcpy(t.data_ptr(), v.data.data(), v.data.size());
  return t;
}

result<sf::OptimizerKind> kind_of(const o::Optimizer& opt) {
  if (dynamic_cast<const o::SGD*>(&opt)) return K::sgd;
  if (dynamic_cast<const o::Adam*>(&opt)) return K::adam;
  if (dynamic_cast<const Lamb*>(&opt)) return K::lamb;  // before AdamW, its base
  if (dynamic_cast<const o::AdamW*>(&opt)) return K::adamw;
  if (dynamic_cast<const o::RMSprop*>(&opt)) return K::rmsprop;
  if (dynamic_cast<const o::Adagrad*>(&opt)) return K::adagrad;
  return make_error(errc::unsupported,
                    fmt::format("training state: optimizer {} is not one the state format "
                                "carries (SGD, Adam, AdamW, RMSprop, Adagrad, LAMB)",
                                c10::demangle(typeid(opt).name())));
}

std::vector<sf::Option> options_of(K k, const o::OptimizerOptions& opts) {
  switch (k) {
    case K::sgd: {
      const auto& s = static_cast<const o::SGDOptions&>(opts);
      return {{"lr", s.lr()},
              {"momentum", s.momentum()},
              {"dampening", s.dampening()},
              {"weight_decay", s.weight_decay()},
              {"nesterov", s.nesterov() ? 1.0 : 0.0}};
    }
    case K::adam:
      return adam_options(static_cast<const o::AdamOptions&>(opts));
    case K::lamb:
    case K::adamw:
      return adam_options(static_cast<const o::AdamWOptions&>(opts));
    case K::rmsprop: {
      const auto& r = static_cast<const o::RMSpropOptions&>(opts);
      return {{"lr", r.lr()},
              {"alpha", r.alpha()},
              {"eps", r.eps()},
              {"weight_decay", r.weight_decay()},
              {"momentum", r.momentum()},
              {"centered", r.centered() ? 1.0 : 0.0}};
    }
    case K::adagrad: {
      const auto& a = static_cast<const o::AdagradOptions&>(opts);
      return {{"lr", a.lr()},
              {"lr_decay", a.lr_decay()},
              {"weight_decay", a.weight_decay()},
              {"initial_accumulator_value", a.initial_accumulator_value()},
              {"eps", a.eps()}};
    }
  }
  return {};
}

std::vector<torch::Tensor> slots_of(K k, o::OptimizerParamState& s) {
  switch (k) {
    case K::sgd:
      return {static_cast<o::SGDParamState&>(s).momentum_buffer()};
    case K::adam: {
      auto& a = static_cast<o::AdamParamState&>(s);
      return {a.exp_avg(), a.exp_avg_sq(), a.max_exp_avg_sq()};
    }
    case K::lamb:
    case K::adamw: {
      auto& a = static_cast<o::AdamWParamState&>(s);
      return {a.exp_avg(), a.exp_avg_sq(), a.max_exp_avg_sq()};
    }
    case K::rmsprop: {
      auto& r = static_cast<o::RMSpropParamState&>(s);
      return {r.square_avg(), r.momentum_buffer(), r.grad_avg()};
    }
    case K::adagrad:
      return {static_cast<o::AdagradParamState&>(s).sum()};
  }
  return {};
}

std::int64_t step_of(K k, o::OptimizerParamState& s) {
  switch (k) {
    case K::sgd:
      return 0;
    case K::adam:
      return static_cast<o::AdamParamState&>(s).step();
    case K::lamb:
    case K::adamw:
      return static_cast<o::AdamWParamState&>(s).step();
    case K::rmsprop:
      return static_cast<o::RMSpropParamState&>(s).step();
    case K::adagrad:
      return static_cast<o::AdagradParamState&>(s).step();
  }
  return 0;
}

std::vector<bool> required_slots(K k, const o::OptimizerOptions& opts) {
  switch (k) {
    case K::sgd:
      return {true};
    case K::adam:
      return {true, true, static_cast<const o::AdamOptions&>(opts).amsgrad()};
    case K::lamb:
    case K::adamw:
      return {true, true, static_cast<const o::AdamWOptions&>(opts).amsgrad()};
    case K::rmsprop: {
      const auto& r = static_cast<const o::RMSpropOptions&>(opts);
      return {true, r.momentum() > 0, r.centered()};
    }
    case K::adagrad:
      return {true};
  }
  return {};
}

bool state_required_for_every_parameter(K k) {
  return k == K::adagrad;
}

std::unique_ptr<o::OptimizerParamState> make_param_state(K k, std::int64_t step,
                                                         const std::vector<torch::Tensor>& s) {
  switch (k) {
    case K::sgd: {
      auto st = std::make_unique<o::SGDParamState>();
      st->momentum_buffer(s[0]);
      return st;
    }
    case K::adam:
      return adam_state<o::AdamParamState>(step, s);
    case K::lamb:
    case K::adamw:
      return adam_state<o::AdamWParamState>(step, s);
    case K::rmsprop: {
      auto st = std::make_unique<o::RMSpropParamState>();
      st->step(step);
      st->square_avg(s[0]);
      st->momentum_buffer(s[1]);
      st->grad_avg(s[2]);
      return st;
    }
    case K::adagrad: {
      auto st = std::make_unique<o::AdagradParamState>();
      st->step(step);
      st->sum(s[0]);
      return st;
    }
  }
  return nullptr;
}

}  // namespace starling::optim::state_torch
