// A model's parameters and buffers plus its optimizer's state (plus extra named tensors such
// as DiLoCo's outer momentum) as one byte string, for checkpoints and for state download by
// peers that fall behind. Includes torch headers: only torch translation units include it.
//
// Threading rule: call from the thread that owns the model and optimizer (no step may run
// concurrently). torch exceptions are caught and returned as errors.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "starling/optim/checkpoint.hpp"

namespace starling::optim {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Dotted names of the module's parameters, in registration order.
std::vector<std::string> parameter_names(const torch::nn::Module& model);

// Serialises model (parameters and buffers), optimizer state (if `optimizer` is non-null)
// and `extra` into a torch archive.
result<Bytes> save_training_state(const torch::nn::Module& model,
                                  const torch::optim::Optimizer* optimizer,
                                  const NamedTensors& extra = {});
// Loads what save_training_state wrote into existing objects of the same shapes. `extra`
// entries are looked up by name and copied into the given tensors. errc::invalid_argument
// if the archive is malformed or does not match (missing names, shape mismatch).
result<void> load_training_state(BytesView state, torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer, NamedTensors* extra = nullptr);

// save_training_state + CheckpointDir::save (meta.parameter_names is filled in).
result<std::filesystem::path> save_checkpoint(CheckpointDir& dir, CheckpointMeta meta,
                                              const torch::nn::Module& model,
                                              const torch::optim::Optimizer* optimizer,
                                              const NamedTensors& extra = {},
                                              const AtomicWriteOptions& options = {});
// Loads the newest valid checkpoint whose parameter names match the model's. nullopt if the
// directory holds none.
result<std::optional<CheckpointMeta>> load_latest_checkpoint(const CheckpointDir& dir,
                                                             torch::nn::Module& model,
                                                             torch::optim::Optimizer* optimizer,
                                                             NamedTensors* extra = nullptr);

}  // namespace starling::optim
