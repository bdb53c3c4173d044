// Conversions between torch objects and the torch-free state format (state_format.hpp):
// tensors, and the optimizers the format carries (SGD, Adam, AdamW, RMSprop, Adagrad). Used by
// training_state.cpp; internal to the optim module.
#pragma once

#include <memory>
#include <vector>

#include <torch/optim/optimizer.h>

#include "starling/training/state_format.hpp"

namespace starling::optim::state_torch {

namespace sf = training::state_format;

// errc::unsupported for a dtype outside the format's set, or a non-CPU / sparse tensor.
result<sf::Dtype> wire_dtype(const torch::Tensor& t);
c10::ScalarType torch_dtype(sf::Dtype d);
// A view of `t`, which must be a contiguous CPU tensor of a wire dtype that outlives the view.
sf::TensorView view_of(const torch::Tensor& t, sf::Dtype d);
// A new CPU tensor holding a copy of the view's data.
torch::Tensor to_tensor(const sf::TensorView& v);

// errc::unsupported naming the optimizer's type for kinds the format does not carry.
result<sf::OptimizerKind> kind_of(const torch::optim::Optimizer& opt);
std::vector<sf::Option> options_of(sf::OptimizerKind k, const torch::optim::OptimizerOptions& o);
// The state's tensors in slot_names(k) order (undefined where the state has none) and step.
std::vector<torch::Tensor> slots_of(sf::OptimizerKind k, torch::optim::OptimizerParamState& s);
std::int64_t step_of(sf::OptimizerKind k, torch::optim::OptimizerParamState& s);
// Which slots the next step() reads, given the group's options (a state without one of them
// would make step() throw).
std::vector<bool> required_slots(sf::OptimizerKind k, const torch::optim::OptimizerOptions& o);
// Every parameter must have a state (Adagrad creates them in its constructor and its step()
// refuses a parameter without one).
bool state_required_for_every_parameter(sf::OptimizerKind k);
std::unique_ptr<torch::optim::OptimizerParamState> make_param_state(
    sf::OptimizerKind k, std::int64_t step, const std::vector<torch::Tensor>& slots);

}  // namespace starling::optim::state_torch
