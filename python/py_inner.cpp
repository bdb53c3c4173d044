// The inner optimizer of starling.Optimizer and its state bridge (py_inner.hpp).
#include "py_inner.hpp"

#include <string>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace starling::python {
namespace {

namespace o = torch::optim;

enum class Kind { local, sgd, adam, adamw };

// The key libtorch's optimizers file a parameter's state under.
std::string key_of(const at::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl();
}

// The tensor under `key` in a Python state dict (undefined if absent or not a tensor).
at::Tensor tensor_in(const py::dict& d, const char* key) {
  if (!d.contains(key)) return {};
  py::object v = d[key];
  if (v.is_none() || !THPVariable_Check(v.ptr())) return {};
  return v.cast<at::Tensor>();
}

std::int64_t step_count(const py::object& v) {
  if (py::hasattr(v, "item")) return static_cast<std::int64_t>(v.attr("item")().cast<double>());
  return static_cast<std::int64_t>(v.cast<double>());
}

template <class Base>
class PyInner final : public Base, public InnerBridge {
 public:
  template <class Options>
  PyInner(Kind kind, std::vector<o::OptimizerParamGroup> groups, Options defaults,
          py::object py_opt, std::vector<at::Tensor> params, std::vector<py::object> py_params,
          std::vector<bool> amsgrad)
      : Base(std::move(groups), std::move(defaults)),
        kind_(kind),
        py_opt_(std::move(py_opt)),
        params_(std::move(params)),
        py_params_(std::move(py_params)),
        amsgrad_(std::move(amsgrad)) {}

  ~PyInner() override {
    py::gil_scoped_acquire gil;
    auto drop_opt = std::move(py_opt_);
    auto drop_params = std::move(py_params_);
    error_ = nullptr;
  }

  torch::Tensor step(o::Optimizer::LossClosure) override {
    py::gil_scoped_acquire gil;
    try {
      py_opt_.attr("step")();
      to_cpp();
    } catch (py::error_already_set&) {
      if (!error_) error_ = std::current_exception();
    } catch (const std::exception&) {
      if (!error_) error_ = std::current_exception();
    }
    return {};
  }

  const char* kind() const override {
    switch (kind_) {
      case Kind::sgd:
        return "sgd";
      case Kind::adam:
        return "adam";
      case Kind::adamw:
        return "adamw";
      case Kind::local:
        break;
    }
    return "local";
  }

  void to_cpp() override {
    if (kind_ == Kind::local) return;
    py::object state = py_opt_.attr("state");
    auto& cpp = this->state();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto key = key_of(params_[i]);
      py::object s = state.attr("get")(py_params_[i], py::none());
      if (s.is_none() || !py::isinstance<py::dict>(s)) {
        cpp.erase(key);
        continue;
      }
      auto d = s.cast<py::dict>();
      auto it = cpp.find(key);
      if (kind_ == Kind::sgd) {
        auto buf = tensor_in(d, "momentum_buffer");
        if (!buf.defined()) {
          cpp.erase(key);
        } else if (it == cpp.end() ||
                   !same(static_cast<o::SGDParamState&>(*it->second).momentum_buffer(), buf)) {
          auto made = std::make_unique<o::SGDParamState>();
          made->momentum_buffer(buf);
          cpp[key] = std::move(made);
        }
      } else if (kind_ == Kind::adam) {
        adam_to_cpp<o::AdamParamState>(i, key, d);
      } else {
        adam_to_cpp<o::AdamWParamState>(i, key, d);
      }
    }
  }

  void to_python() override {
    if (kind_ == Kind::local) return;
    py::object state = py_opt_.attr("state");
    auto& cpp = this->state();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const py::object& p = py_params_[i];
      py::object s = state.attr("get")(p, py::none());
      const bool py_dict = !s.is_none() && py::isinstance<py::dict>(s);
      auto it = cpp.find(key_of(params_[i]));
      if (it == cpp.end()) {
        if (py_dict && !tensor_in(s.cast<py::dict>(), primary()).defined()) continue;
        if (!s.is_none()) state.attr("pop")(p, py::none());
        continue;
      }
      py::dict d;
      if (kind_ == Kind::sgd) {
        auto& st = static_cast<o::SGDParamState&>(*it->second);
        if (py_dict && same(tensor_in(s.cast<py::dict>(), "momentum_buffer"), st.momentum_buffer()))
          continue;
        d["momentum_buffer"] = st.momentum_buffer();
      } else if (kind_ == Kind::adam) {
        if (!adam_to_python(static_cast<o::AdamParamState&>(*it->second), i, s, d)) continue;
      } else {
        if (!adam_to_python(static_cast<o::AdamWParamState&>(*it->second), i, s, d)) continue;
      }
      state[p] = d;
    }
  }

 private:
  const char* primary() const { return kind_ == Kind::sgd ? "momentum_buffer" : "exp_avg"; }

  template <class State>
  void adam_to_cpp(std::size_t i, const std::string& key, const py::dict& d) {
    auto& cpp = this->state();
    auto exp_avg = tensor_in(d, "exp_avg");
    auto exp_avg_sq = tensor_in(d, "exp_avg_sq");
    if (!exp_avg.defined() || !exp_avg_sq.defined()) {
      cpp.erase(key);
      return;
    }
    auto it = cpp.find(key);
    auto* st = it == cpp.end() ? nullptr : static_cast<State*>(it->second.get());
    if (!st || !same(st->exp_avg(), exp_avg) || !same(st->exp_avg_sq(), exp_avg_sq)) {
      auto made = std::make_unique<State>();
      made->exp_avg(exp_avg);
      made->exp_avg_sq(exp_avg_sq);
      st = made.get();
      cpp[key] = std::move(made);
    }
    // libtorch defines max_exp_avg_sq only with amsgrad (the state format then requires it).
    if (amsgrad_[i]) {
      auto m = tensor_in(d, "max_exp_avg_sq");
      st->max_exp_avg_sq(m.defined() ? m : at::zeros_like(exp_avg));
    }
    st->step(d.contains("step") ? step_count(d["step"]) : 0);
  }

  // Fills `d` with the C++ state unless the Python state already holds its tensors.
  template <class State>
  bool adam_to_python(State& st, std::size_t i, const py::object& s, py::dict& d) {
    if (!s.is_none() && py::isinstance<py::dict>(s)) {
      auto cur = s.cast<py::dict>();
      if (same(tensor_in(cur, "exp_avg"), st.exp_avg()) &&
          same(tensor_in(cur, "exp_avg_sq"), st.exp_avg_sq()))
        return false;
    }
    // torch 1.13's Adam keeps the step count as a float tensor.
    d["step"] = py::module_::import("torch").attr("tensor")(static_cast<double>(st.step()));
    d["exp_avg"] = st.exp_avg();
    d["exp_avg_sq"] = st.exp_avg_sq();
    if (amsgrad_[i])
      d["max_exp_avg_sq"] =
          st.max_exp_avg_sq().defined() ? st.max_exp_avg_sq() : at::zeros_like(st.exp_avg());
    return true;
  }

  Kind kind_;
  py::object py_opt_;
  std::vector<at::Tensor> params_;
  std::vector<py::object> py_params_;
  std::vector<bool> amsgrad_;  // per parameter (its group's option)
};

template <class Base, class Options>
Inner make(Kind kind, std::vector<o::OptimizerParamGroup> groups, Options defaults,
           const py::object& py_opt, std::vector<at::Tensor> params,
           std::vector<py::object> py_params, std::vector<bool> amsgrad) {
  auto inner =
      std::make_unique<PyInner<Base>>(kind, std::move(groups), std::move(defaults), py_opt,
                                      std::move(params), std::move(py_params), std::move(amsgrad));
  InnerBridge* bridge = inner.get();
  return Inner{std::move(inner), bridge};
}

double number(const py::dict& g, const char* k, double fallback) {
  if (!g.contains(k)) return fallback;
  return py::float_(g[k]).cast<double>();
}
bool flag(const py::dict& g, const char* k) {
  return g.contains(k) && !g[k].is_none() && g[k].cast<bool>();
}

template <class Options>
Options adam_options(const py::dict& g) {
  Options a(number(g, "lr", 1e-3));
  auto betas = g.contains("betas") ? g["betas"].cast<std::pair<double, double>>()
                                   : std::pair<double, double>(0.9, 0.999);
  a.betas({betas.first, betas.second}).eps(number(g, "eps", 1e-8));
  a.weight_decay(number(g, "weight_decay", 0.0)).amsgrad(flag(g, "amsgrad"));
  return a;
}

}  // namespace

Inner make_inner(const py::object& py_opt, std::vector<at::Tensor> params,
                 std::vector<py::object> py_params) {
  auto optim = py::module_::import("torch.optim");
  py::handle type = py::type::handle_of(py_opt);
  Kind kind = Kind::local;
  // Exactly these classes; maximize (gradient ascent) has no libtorch counterpart.
  if (type.is(optim.attr("SGD")))
    kind = Kind::sgd;
  else if (type.is(optim.attr("Adam")))
    kind = Kind::adam;
  else if (type.is(optim.attr("AdamW")))
    kind = Kind::adamw;
  std::vector<py::dict> py_groups;
  for (auto g : py_opt.attr("param_groups")) {
    py_groups.push_back(g.cast<py::dict>());
    if (flag(py_groups.back(), "maximize")) kind = Kind::local;
  }
  if (kind == Kind::local) {
    std::vector<o::OptimizerParamGroup> one{o::OptimizerParamGroup(params)};
    std::vector<bool> none(params.size(), false);
    return make<o::SGD>(Kind::local, std::move(one), o::SGDOptions(0.0), py_opt, std::move(params),
                        std::move(py_params), std::move(none));
  }
  // The libtorch optimizer's groups mirror the Python ones (the state format keeps groups).
  std::vector<o::OptimizerParamGroup> groups;
  std::vector<bool> amsgrad;
  std::size_t next = 0;
  for (const auto& g : py_groups) {
    const auto n = py::len(g["params"]);
    std::vector<at::Tensor> ps(params.begin() + static_cast<std::ptrdiff_t>(next),
                               params.begin() + static_cast<std::ptrdiff_t>(next + n));
    next += n;
    std::unique_ptr<o::OptimizerOptions> opts;
    if (kind == Kind::sgd) {
      o::SGDOptions s(number(g, "lr", 0.0));
      s.momentum(number(g, "momentum", 0.0)).dampening(number(g, "dampening", 0.0));
      s.weight_decay(number(g, "weight_decay", 0.0)).nesterov(flag(g, "nesterov"));
      opts = std::make_unique<o::SGDOptions>(s);
      amsgrad.insert(amsgrad.end(), n, false);
    } else if (kind == Kind::adam) {
      auto a = adam_options<o::AdamOptions>(g);
      amsgrad.insert(amsgrad.end(), n, a.amsgrad());
      opts = std::make_unique<o::AdamOptions>(a);
    } else {
      auto a = adam_options<o::AdamWOptions>(g);
      amsgrad.insert(amsgrad.end(), n, a.amsgrad());
      opts = std::make_unique<o::AdamWOptions>(a);
    }
    groups.emplace_back(std::move(ps), std::move(opts));
  }
  const py::dict& g0 = py_groups.front();
  if (kind == Kind::sgd) {
    // The defaults are only used for groups without options (none here); SGD's constructor
    // checks them (nesterov needs momentum), so they are plain.
    return make<o::SGD>(kind, std::move(groups), o::SGDOptions(number(g0, "lr", 0.0)), py_opt,
                        std::move(params), std::move(py_params), std::move(amsgrad));
  }
  if (kind == Kind::adam)
    return make<o::Adam>(kind, std::move(groups), adam_options<o::AdamOptions>(g0), py_opt,
                         std::move(params), std::move(py_params), std::move(amsgrad));
  return make<o::AdamW>(kind, std::move(groups), adam_options<o::AdamWOptions>(g0), py_opt,
                        std::move(params), std::move(py_params), std::move(amsgrad));
}

}  // namespace starling::python
