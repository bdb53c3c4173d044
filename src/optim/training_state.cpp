// Model + optimizer state serialisation (torch archives) and checkpoint save/load.
#include "starling/optim/training_state.hpp"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include <fmt/format.h>

#include "starling/core/log.hpp"

namespace starling::optim {
namespace {

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
  }
  for (const auto& item : m.named_buffers(/*recurse=*/false)) {
    torch::Tensor t;
    if (!ar.try_read(item.key(), t, /*is_buffer=*/true) || t.sizes() != item.value().sizes())
      return make_error(
          errc::invalid_argument,
          fmt::format("training state: buffer '{}{}' missing or mis-shaped", prefix, item.key()));
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

result<void> load_training_state(BytesView state, torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer, NamedTensors* extra) {
  try {
    torch::serialize::InputArchive root;
    root.load_from(reinterpret_cast<const char*>(state.data()), state.size());
    torch::serialize::InputArchive model_ar;
    if (!root.try_read("model", model_ar))
      return make_error(errc::invalid_argument, "training state: no model");
    // Check everything before changing anything, so a mismatch leaves the model untouched.
    ST_TRY(check_module(model, model_ar, ""));
    if (extra) {
      torch::serialize::InputArchive extra_ar;
      if (!extra->empty() && !root.try_read("extra", extra_ar))
        return make_error(errc::invalid_argument, "training state: no extra tensors");
      for (auto& [name, t] : *extra) {
        torch::Tensor src;
        if (!extra_ar.try_read(name, src) || src.sizes() != t.sizes())
          return make_error(
              errc::invalid_argument,
              fmt::format("training state: extra tensor '{}' missing or mis-shaped", name));
      }
    }
    torch::serialize::InputArchive opt_ar;
    const bool has_opt = optimizer && root.try_read("optimizer", opt_ar);
    if (optimizer && !has_opt)
      return make_error(errc::invalid_argument, "training state: no optimizer state");

    model.load(model_ar);
    if (has_opt) optimizer->load(opt_ar);
    if (extra && !extra->empty()) {
      torch::serialize::InputArchive extra_ar;
      root.try_read("extra", extra_ar);
      torch::NoGradGuard no_grad;
      for (auto& [name, t] : *extra) {
        torch::Tensor src;
        extra_ar.try_read(name, src);
        t.copy_(src);
      }
    }
    return success();
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, fmt::format("training state: {}", e.what()));
  }
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
