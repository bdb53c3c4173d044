// A model's parameters and buffers plus its optimizer's state (plus extra named tensors such
// as DiLoCo's outer momentum) as one byte string, for checkpoints and for state download by
// peers that fall behind. The bytes are Starling's own state format (state_format.hpp, parsed
// by a torch-free, fuzzed decoder); torch archives are neither written nor read. Includes torch
// headers: only torch translation units include it.
//
// Optimizers: SGD, Adam, AdamW, RMSprop and Adagrad (libtorch's, except LBFGS). Saving or
// loading with any other optimizer is errc::unsupported (state_format_supports() says so up
// front); pass a null optimizer to move parameters only. The optimizer's options (lr, betas,
// ...) are saved, but loading keeps the receiver's own (as torch's Optimizer::load does) and
// logs a difference.
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

#include "starling/training/checkpoint.hpp"

namespace starling::optim {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Dotted names of the module's parameters, in registration order.
std::vector<std::string> parameter_names(const torch::nn::Module& model);

// errc::unsupported naming the optimizer's type if the state format does not carry it.
result<void> state_format_supports(const torch::optim::Optimizer& optimizer);

// Serialises model (parameters and buffers), optimizer state (if `optimizer` is non-null)
// and `extra`. errc::unsupported for another optimizer or a tensor dtype outside the format's.
result<Bytes> save_training_state(const torch::nn::Module& model,
                                  const torch::optim::Optimizer* optimizer,
                                  const NamedTensors& extra = {});
// Loads what save_training_state wrote into existing objects of the same shapes. `extra`
// entries are looked up by name and copied into the given tensors (others in the state are
// ignored). Every tensor of the model must be in the state and the state must hold no other;
// dtypes must match, floating values be finite, optimizer state match the optimizer's kind,
// groups and parameter shapes. Everything is checked before anything changes: on an error
// the model, optimizer and extras are as they were. errc::invalid_argument if the state is
// malformed or does not match, errc::too_large over a format limit, errc::unsupported for an
// unknown format version or a torch archive (older Starling builds).
result<void> load_training_state(BytesView state, torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer, NamedTensors* extra = nullptr);

// save_training_state + CheckpointDir::save (meta.parameter_names is filled in).
result<std::filesystem::path> save_checkpoint(training::CheckpointDir& dir,
                                              training::CheckpointMeta meta,
                                              const torch::nn::Module& model,
                                              const torch::optim::Optimizer* optimizer,
                                              const NamedTensors& extra = {},
                                              const training::AtomicWriteOptions& options = {});
// Loads the newest valid checkpoint whose parameter names match the model's. nullopt if the
// directory holds none.
result<std::optional<training::CheckpointMeta>> load_latest_checkpoint(
    const training::CheckpointDir& dir, torch::nn::Module& model,
    torch::optim::Optimizer* optimizer, NamedTensors* extra = nullptr);

}  // namespace starling::optim
