// Model + optimizer state serialisation (torch archives) and checkpoint save/load.
#include "starling/optim/training_state.hpp"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include <fmt/format.h>

#include "starling/core/log.hpp"

namespace starling::optim {
namespace {

// A tensor from a peer's archive that replaces `like`: same type (Module::load adopts the read
// tensor's storage, so another dtype would change the model's), dense, finite values.
result<void> check_values(const torch::Tensor& t, const torch::Tensor& like,
                          const std::string& what) {
  if (t.scalar_type() != like.scalar_type() || t.layout() != torch::kStrided)
    return make_error(errc::invalid_argument, fmt::format("training state: '{}' is {} not {}", what,
                                                          c10::toString(t.scalar_type()),
                                                          c10::toString(like.scalar_type())));
  if (t.is_floating_point() && !torch::isfinite(t).all().item<bool>())
    return make_error(errc::invalid_argument,
                      fmt::format("training state: '{}' holds non-finite values", what));
  return success();
}

// The per-parameter state tensors of the optimizers libtorch ships (others are not checked).
std::vector<torch::Tensor> state_tensors(torch::optim::OptimizerParamState& s) {
  namespace o = torch::optim;
  if (auto* a = dynamic_cast<o::AdamParamState*>(&s))
    return {a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()};
  if (auto* a = dynamic_cast<o::AdamWParamState*>(&s))
    return {a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()};
  if (auto* a = dynamic_cast<o::SGDParamState*>(&s)) return {a->momentum_buffer()};
  if (auto* a = dynamic_cast<o::RMSpropParamState*>(&s))
    return {a->square_avg(), a->momentum_buffer(), a->grad_avg()};
  if (auto* a = dynamic_cast<o::AdagradParamState*>(&s)) return {a->sum()};
  return {};
}

// After Optimizer::load: every state tensor has its parameter's shape and type and finite
// values (a mis-shaped moment would throw at the next step, or broadcast silently).
result<void> check_optimizer_state(torch::optim::Optimizer& opt) {
  for (const auto& g : opt.param_groups()) {
    for (const auto& p : g.params()) {
      auto it = opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (it == opt.state().end()) continue;
      for (const auto& t : state_tensors(*it->second)) {
        if (!t.defined()) continue;
        if (t.sizes() != p.sizes())
          return make_error(errc::invalid_argument,
                            fmt::format("training state: optimizer state of shape [{}] for a "
                                        "parameter of shape [{}]",
                                        fmt::join(t.sizes(), ","), fmt::join(p.sizes(), ",")));
        ST_TRY(check_values(t, p, "optimizer state"));
      }
    }
  }
  return success();
}

// Module::save writes a module's own parameters and buffers under their names and each child
// as a nested archive; this walks the same tree and checks names and shapes.
result<void> check_module(const torch::nn::Module& m, torch::serialize::InputArchive& ar,
                          const std::string& prefix) {
  for (const auto& item : m.named_parameters(/*recurse=*/false)) {
    torch::Tensor t;
    if (!ar.try_read(item.key(), t, /*is_buffer=*/false))
      return make_error(
          errc::invalid_argument,
          fmt::format("training state: parameter '{}{}' missing", prefix, item.key()));
    if (t.sizes() != item.value().sizes())
      return make_error(
          errc::invalid_argument,
          fmt::format("training state: parameter '{}{}' has shape [{}] not [{}]", prefix,
                      item.key(), fmt::join(t.sizes(), ","), fmt::join(item.value().sizes(), ",")));
    ST_TRY(check_values(t, item.value(), prefix + item.key()));
  }
  for (const auto& item : m.named_buffers(/*recurse=*/false)) {
    torch::Tensor t;
    if (!ar.try_read(item.key(), t, /*is_buffer=*/true) || t.sizes() != item.value().sizes() ||
        t.scalar_type() != item.value().scalar_type())
      return make_error(errc::invalid_argument,
                        fmt::format("training state: buffer '{}{}' missing, mis-shaped or of "
                                    "another type",
                                    prefix, item.key()));
  }
  for (const auto& child : m.named_children()) {
    torch::serialize::InputArchive sub;
    if (!ar.try_read(child.key(), sub))
      return make_error(errc::invalid_argument,
                        fmt::format("training state: module '{}{}' missing", prefix, child.key()));
    ST_TRY(check_module(*child.value(), sub, prefix + child.key() + "."));
  }
  return success();
}

}  // namespace

std::vector<std::string> parameter_names(const torch::nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) out.push_back(item.key());
  return out;
}

result<Bytes> save_training_state(const torch::nn::Module& model,
                                  const torch::optim::Optimizer* optimizer,
                                  const NamedTensors& extra) {
  try {
    torch::serialize::OutputArchive root;
    torch::serialize::OutputArchive model_ar(root.compilation_unit());
    model.save(model_ar);
    root.write("model", model_ar);
    if (optimizer) {
      torch::serialize::OutputArchive opt_ar(root.compilation_unit());
      optimizer->save(opt_ar);
      root.write("optimizer", opt_ar);
    }
    if (!extra.empty()) {
      torch::serialize::OutputArchive extra_ar(root.compilation_unit());
      for (const auto& [name, t] : extra) extra_ar.write(name, t.detach().cpu());
      root.write("extra", extra_ar);
    }
    Bytes out;
    root.save_to([&](const void* p, std::size_t n) {
      auto b = static_cast<const std::uint8_t*>(p);
      out.insert(out.end(), b, b + n);
      return n;
    });
    return out;
  } catch (const std::exception& e) {
    return make_error(errc::internal, fmt::format("save training state: {}", e.what()));
  }
}

namespace {

// Reads `state` into the objects after checking what can be checked up front; may leave them
// partly changed when it fails afterwards (load_training_state rolls back).
result<void> apply_training_state(BytesView state, torch::nn::Module& model,
                                  torch::optim::Optimizer* optimizer, NamedTensors* extra) {
  torch::serialize::InputArchive root;
  root.load_from(reinterpret_cast<const char*>(state.data()), state.size());
  torch::serialize::InputArchive model_ar;
  if (!root.try_read("model", model_ar))
    return make_error(errc::invalid_argument, "training state: no model");
  ST_TRY(check_module(model, model_ar, ""));
  torch::serialize::InputArchive extra_ar;
  if (extra && !extra->empty()) {
    if (!root.try_read("extra", extra_ar))
      return make_error(errc::invalid_argument, "training state: no extra tensors");
    for (auto& [name, t] : *extra) {
      torch::Tensor src;
      if (!extra_ar.try_read(name, src) || src.sizes() != t.sizes())
        return make_error(
            errc::invalid_argument,
            fmt::format("training state: extra tensor '{}' missing or mis-shaped", name));
      ST_TRY(check_values(src, t, name));
    }
  }
  torch::serialize::InputArchive opt_ar;
  if (optimizer && !root.try_read("optimizer", opt_ar))
    return make_error(errc::invalid_argument, "training state: no optimizer state");

  model.load(model_ar);
  if (optimizer) {
    optimizer->load(opt_ar);
    ST_TRY(check_optimizer_state(*optimizer));
  }
  if (extra && !extra->empty()) {
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : *extra) {
      torch::Tensor src;
      extra_ar.try_read(name, src);
      t.copy_(src);
    }
  }
  return success();
}

result<void> apply_caught(BytesView state, torch::nn::Module& model,
                          torch::optim::Optimizer* optimizer, NamedTensors* extra) {
  try {
    return apply_training_state(state, model, optimizer, extra);
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, fmt::format("training state: {}", e.what()));
  }
}

}  // namespace

result<void> load_training_state(BytesView state, torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer, NamedTensors* extra) {
  // The state comes from a peer: a failure after the first tensor was replaced (a malformed
  // optimizer archive, a mis-shaped moment) must leave everything as it was.
  ST_TRY(auto backup, save_training_state(model, optimizer, extra ? *extra : NamedTensors{}));
  auto r = apply_caught(state, model, optimizer, extra);
  if (!r) {
    if (optimizer) optimizer->state().clear();  // entries of the failed load are not kept
    auto restored = apply_caught(backup, model, optimizer, extra);
    if (!restored)
      return make_error(errc::internal,
                        fmt::format("{}; restoring the previous state failed: {}",
                                    r.error().message(), restored.error().message()));
  }
  return r;
}

result<std::filesystem::path> save_checkpoint(CheckpointDir& dir, CheckpointMeta meta,
                                              const torch::nn::Module& model,
                                              const torch::optim::Optimizer* optimizer,
                                              const NamedTensors& extra,
                                              const AtomicWriteOptions& options) {
  meta.parameter_names = parameter_names(model);
  ST_TRY(auto payload, save_training_state(model, optimizer, extra));
  return dir.save(meta, payload, options);
}

result<std::optional<CheckpointMeta>> load_latest_checkpoint(const CheckpointDir& dir,
                                                             torch::nn::Module& model,
                                                             torch::optim::Optimizer* optimizer,
                                                             NamedTensors* extra) {
  ST_TRY(auto loaded, dir.load_latest());
  if (!loaded) return std::optional<CheckpointMeta>();
  if (loaded->meta.parameter_names != parameter_names(model))
    return make_error(errc::invalid_argument,
                      fmt::format("checkpoint {} is for a different model (parameter names differ)",
                                  loaded->path.string()));
  auto r = load_training_state(loaded->payload, model, optimizer, extra);
  if (!r) return r.error().with_context(loaded->path.string());
  logger("optim")->info("resumed from {} (epoch {})", loaded->path.string(), loaded->meta.epoch);
  return std::optional<CheckpointMeta>(std::move(loaded->meta));
}

}  // namespace starling::optim
