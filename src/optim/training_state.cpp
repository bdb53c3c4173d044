// Model + optimizer state to the Starling state format and back, and checkpoint save/load.
// The bytes are parsed by the torch-free decoder (state_format.cpp); this file converts the
// decoded views to tensors, checks them against the receiver's model and optimizer, and only
// then changes anything.
#include "starling/optim/training_state.hpp"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include <torch/utils.h>

#include <fmt/format.h>

#include "starling/core/log.hpp"
#include "state_format_torch.hpp"

namespace starling::optim {
namespace sf = training::state_format;
namespace st = state_torch;
namespace {

using OptimizerStateMap =
    std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;

std::string key_of(const torch::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}

Error invalid(std::string what) {
  return Error(errc::invalid_argument, "training state: " + what);
}

// Parameters, then buffers, by dotted name (what Module::save wrote, flattened).
NamedTensors model_tensors(const torch::nn::Module& m) {
  NamedTensors out;
  for (const auto& item : m.named_parameters(/*recurse=*/true))
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  for (const auto& item : m.named_buffers(/*recurse=*/true))
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  return out;
}

// ---- Saving --------------------------------------------------------------------------------

// Views of tensors the encoder reads; `alive` owns the contiguous CPU copies they point into.
class Views {
 public:
  result<sf::TensorView> of(const torch::Tensor& t, const std::string& what) {
    auto c = t.detach().cpu().contiguous();
    auto d = st::wire_dtype(c);
    if (!d) return d.error().with_context(fmt::format("training state: '{}'", what));
    alive_.push_back(c);
    return st::view_of(c, d.value());
  }
  result<std::vector<sf::NamedTensor>> of(const NamedTensors& list) {
    std::vector<sf::NamedTensor> out;
    for (const auto& [name, t] : list) {
      ST_TRY(auto v, of(t, name));
      out.push_back({name, std::move(v)});
    }
    return out;
  }

 private:
  std::vector<torch::Tensor> alive_;
};

result<sf::OptimizerState> optimizer_state(const torch::optim::Optimizer& opt, Views& views) {
  ST_TRY(auto kind, st::kind_of(opt));
  sf::OptimizerState out;
  out.kind = kind;
  for (const auto& g : opt.param_groups()) {
    sf::ParamGroup pg;
    pg.options = st::options_of(kind, g.options());
    pg.params = static_cast<std::uint32_t>(g.params().size());
    for (std::uint32_t i = 0; i < pg.params; ++i) {
      auto it = opt.state().find(key_of(g.params()[i]));
      if (it == opt.state().end()) continue;
      sf::ParamState ps;
      ps.index = i;
      ps.step = st::step_of(kind, *it->second);
      const auto slots = st::slots_of(kind, *it->second);
      for (std::size_t j = 0; j < slots.size(); ++j) {
        if (!slots[j].defined()) continue;
        ST_TRY(auto v, views.of(slots[j], "optimizer state"));
        ps.slots.push_back({static_cast<std::uint8_t>(j), std::move(v)});
      }
      pg.states.push_back(std::move(ps));
    }
    out.groups.push_back(std::move(pg));
  }
  return out;
}

// ---- Loading: stage (convert and check everything), then commit ----------------------------

struct Staged {
  // (receiver's tensor, new value): views into the input, checked, copied in at commit.
  std::vector<std::pair<torch::Tensor, sf::TensorView>> copies;
  std::optional<OptimizerStateMap> optimizer;
};

result<void> check_view(const sf::TensorView& v, const torch::Tensor& like,
                        const std::string& what) {
  if (st::torch_dtype(v.dtype) != like.scalar_type())
    return invalid(fmt::format("'{}' is {} not {}", what, c10::toString(st::torch_dtype(v.dtype)),
                               c10::toString(like.scalar_type())));
  if (!std::equal(v.shape.begin(), v.shape.end(), like.sizes().begin(), like.sizes().end()))
    return invalid(fmt::format("'{}' has shape [{}] not [{}]", what, fmt::join(v.shape, ","),
                               fmt::join(like.sizes(), ",")));
  if (!sf::all_finite(v)) return invalid(fmt::format("'{}' holds non-finite values", what));
  return success();
}

// Copies a checked view into a tensor of its dtype and shape.
void copy_into(torch::Tensor& dst, const sf::TensorView& v) {
  if (dst.is_contiguous() && dst.device().is_cpu()) {
    if (!v.data.empty()) std::memcpy(dst.data_ptr(), v.data.data(), v.data.size());
    dst.unsafeGetTensorImpl()->bump_version();
  } else {
    dst.copy_(st::to_tensor(v));
  }
}

result<void> stage_list(const std::vector<sf::NamedTensor>& in, const NamedTensors& want,
                        const char* kind, Staged& out) {
  std::unordered_map<std::string_view, const sf::TensorView*> by_name;
  for (const auto& t : in) by_name.emplace(t.name, &t.tensor);
  for (const auto& [name, dst] : want) {
    auto it = by_name.find(name);
    if (it == by_name.end()) return invalid(fmt::format("{} '{}' missing", kind, name));
    ST_TRY(check_view(*it->second, dst, name));
    out.copies.emplace_back(dst, *it->second);
  }
  return success();
}

result<void> stage_model(const sf::TrainingState& s, const torch::nn::Module& model, Staged& out) {
  const auto want = model_tensors(model);
  ST_TRY(stage_list(s.model, want, "parameter or buffer", out));
  if (s.model.size() != want.size()) {
    for (const auto& t : s.model)
      if (std::none_of(want.begin(), want.end(), [&](const auto& w) { return w.first == t.name; }))
        return invalid(fmt::format("tensor '{}' is not in this model", t.name));
  }
  return success();
}

void log_option_difference(const std::vector<sf::Option>& theirs,
                           const std::vector<sf::Option>& mine, std::size_t group) {
  for (const auto& t : theirs)
    for (const auto& m : mine)
      if (t.name == m.name && t.value != m.value) {
        logger("optim")->info(
            "training state: group {} option {} is {} in the state, {} here (keeping {})", group,
            t.name, t.value, m.value, m.value);
        return;
      }
}

result<void> stage_group(const sf::ParamGroup& g, torch::optim::OptimizerParamGroup& mine,
                         sf::OptimizerKind kind, std::size_t gi, OptimizerStateMap& out) {
  const auto& params = mine.params();
  if (g.params != params.size())
    return invalid(fmt::format("optimizer group {} has {} parameters, this optimizer's {}", gi,
                               g.params, params.size()));
  log_option_difference(g.options, st::options_of(kind, mine.options()), gi);
  const auto required = st::required_slots(kind, mine.options());
  const auto names = sf::slot_names(kind);
  for (const auto& ps : g.states) {
    const auto& p = params[ps.index];
    std::vector<torch::Tensor> slots(names.size());
    for (const auto& slot : ps.slots) {
      if (!std::equal(slot.tensor.shape.begin(), slot.tensor.shape.end(), p.sizes().begin(),
                      p.sizes().end()))
        return invalid(fmt::format("optimizer state of shape [{}] for a parameter of shape [{}]",
                                   fmt::join(slot.tensor.shape, ","), fmt::join(p.sizes(), ",")));
      ST_TRY(check_view(slot.tensor, p, "optimizer state"));
      slots[slot.id] = st::to_tensor(slot.tensor);
    }
    for (std::size_t j = 0; j < names.size(); ++j)
      if (required[j] && !slots[j].defined())
        return invalid(fmt::format("optimizer group {} parameter {}: the {} state lacks '{}'", gi,
                                   ps.index, sf::kind_name(kind), names[j]));
    out[key_of(p)] = st::make_param_state(kind, ps.step, slots);
  }
  if (st::state_required_for_every_parameter(kind) && g.states.size() != params.size())
    return invalid(fmt::format("optimizer group {}: {} state for {} of {} parameters", gi,
                               sf::kind_name(kind), g.states.size(), params.size()));
  return success();
}

result<void> stage_optimizer(const sf::TrainingState& s, torch::optim::Optimizer& opt,
                             Staged& out) {
  if (!s.optimizer) return invalid("no optimizer state");
  ST_TRY(auto kind, st::kind_of(opt));
  if (s.optimizer->kind != kind)
    return invalid(fmt::format("optimizer state is {}'s, this optimizer is {}",
                               sf::kind_name(s.optimizer->kind), sf::kind_name(kind)));
  auto& groups = opt.param_groups();
  if (s.optimizer->groups.size() != groups.size())
    return invalid(fmt::format("optimizer state has {} parameter groups, this optimizer {}",
                               s.optimizer->groups.size(), groups.size()));
  out.optimizer.emplace();
  for (std::size_t gi = 0; gi < groups.size(); ++gi)
    ST_TRY(stage_group(s.optimizer->groups[gi], groups[gi], kind, gi, *out.optimizer));
  return success();
}

result<Staged> stage(BytesView bytes, const torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer, const NamedTensors* extra) {
  auto decoded = sf::decode(bytes);
  if (!decoded) return decoded.error().with_context("training state");
  const auto& s = decoded.value();
  Staged out;
  ST_TRY(stage_model(s, model, out));
  if (extra && !extra->empty()) {
    if (s.extra.empty()) return invalid("no extra tensors");
    ST_TRY(stage_list(s.extra, *extra, "extra tensor", out));
  }
  if (optimizer) ST_TRY(stage_optimizer(s, *optimizer, out));
  return out;
}

}  // namespace

std::vector<std::string> parameter_names(const torch::nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) out.push_back(item.key());
  return out;
}

result<void> state_format_supports(const torch::optim::Optimizer& optimizer) {
  ST_TRY(st::kind_of(optimizer));
  return success();
}

result<Bytes> save_training_state(const torch::nn::Module& model,
                                  const torch::optim::Optimizer* optimizer,
                                  const NamedTensors& extra) {
  try {
    Views views;
    sf::TrainingState s;
    ST_TRY(s.model, views.of(model_tensors(model)));
    if (optimizer) {
      ST_TRY(s.optimizer, optimizer_state(*optimizer, views));
    }
    ST_TRY(s.extra, views.of(extra));
    auto out = sf::encode(s);
    if (!out) return out.error().with_context("save training state");
    return out;
  } catch (const std::exception& e) {
    return make_error(errc::internal, fmt::format("save training state: {}", e.what()));
  }
}

result<void> load_training_state(BytesView state, torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer, NamedTensors* extra) {
  // The state comes from a peer: everything is decoded, converted and checked before the
  // first tensor changes, so a refused state changes nothing.
  Staged staged;
  try {
    ST_TRY(staged, stage(state, model, optimizer, extra));
  } catch (const std::exception& e) {
    return invalid(e.what());
  }
  // The commit copies into tensors of the same shape and dtype and swaps the optimizer's state
  // map: it depends on nothing in the input.
  try {
    torch::NoGradGuard no_grad;
    for (auto& [dst, src] : staged.copies) copy_into(dst, src);
    if (optimizer && staged.optimizer) std::swap(optimizer->state(), *staged.optimizer);
  } catch (const std::exception& e) {
    return make_error(errc::internal,
                      fmt::format("training state: applying it failed: {}", e.what()));
  }
  return success();
}

result<std::filesystem::path> save_checkpoint(training::CheckpointDir& dir,
                                              training::CheckpointMeta meta,
                                              const torch::nn::Module& model,
                                              const torch::optim::Optimizer* optimizer,
                                              const NamedTensors& extra,
                                              const training::AtomicWriteOptions& options) {
  meta.parameter_names = parameter_names(model);
  ST_TRY(auto payload, save_training_state(model, optimizer, extra));
  return dir.save(meta, payload, options);
}

result<std::optional<training::CheckpointMeta>> load_latest_checkpoint(
    const training::CheckpointDir& dir, torch::nn::Module& model,
    torch::optim::Optimizer* optimizer, NamedTensors* extra) {
  ST_TRY(auto loaded, dir.load_latest());
  if (!loaded) return std::optional<training::CheckpointMeta>();
  if (loaded->meta.parameter_names != parameter_names(model))
    return make_error(errc::invalid_argument,
                      fmt::format("checkpoint {} is for a different model (parameter names differ)",
                                  loaded->path.string()));
  auto r = load_training_state(loaded->payload, model, optimizer, extra);
  if (!r) return r.error().with_context("checkpoint " + loaded->path.string());
  logger("optim")->info("resumed from {} (epoch {})", loaded->path.string(), loaded->meta.epoch);
  return std::optional<training::CheckpointMeta>(std::move(loaded->meta));
}

}  // namespace starling::optim
