// The inner optimizer of starling.Optimizer and its state bridge (py_inner.hpp).
#include "py_inner.hpp"

#include <string>

namespace starling::python {

namespace {

namespace o = torch::optim;

std::string key_of(const at::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl();
}

enum class Kind { local, sgd, adam, adamw };

template <class Base>
class PyInner final : public Base, public InnerBridge {
 public:
  template <class Options>
  PyInner(Kind kind, std::vector<at::Tensor> params, Options opts, py::object py_opt,
          py::list py_params)
      : Base(params, std::move(opts)),
        kind_(kind),
        params_(std::move(params)),
        py_opt_(std::move(py_opt)),
        py_params_(std::move(py_params)) {}
  ~PyInner() override {
    py::gil_scoped_acquire gil;
    auto drop_opt = std::move(py_opt_);  // released here, with the GIL
    auto drop_params = std::move(py_params_);
  }

  torch::Tensor step(o::Optimizer::LossClosure) override {
    py::gil_scoped_acquire gil;
    try {
      py_opt_.attr("step")();
      to_cpp();
    } catch (py::error_already_set&) {
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

  void to_python() override {
    if (kind_ == Kind::local) return;
    py::gil_scoped_acquire gil;
    auto torch_mod = py::module_::import("torch");
    py::object state = py_opt_.attr("state");
    auto& cpp = this->state();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      py::object p = py_params_[i];
      auto it = cpp.find(key_of(params_[i]));
      if (it == cpp.end()) {
        state.attr("pop")(p, py::none());
        continue;
      }
      py::dict d;
      if (kind_ == Kind::sgd) {
        d["momentum_buffer"] = static_cast<o::SGDParamState&>(*it->second).momentum_buffer();
      } else {
        fill_adam(d, *it->second, torch_mod);
      }
      state[p] = d;
    }
  }

 private:
  void fill_adam(py::dict& d, o::OptimizerParamState& s, py::module_& torch_mod) {
    auto put = [&](auto& a) {
      d["step"] = torch_mod.attr("tensor")(static_cast<double>(a.step()));
      d["exp_avg"] = a.exp_avg();
      d["exp_avg_sq"] = a.exp_avg_sq();
      if (a.max_exp_avg_sq().defined() && amsgrad()) d["max_exp_avg_sq"] = a.max_exp_avg_sq();
    };
    if (kind_ == Kind::adam)
      put(static_cast<o::AdamParamState&>(s));
    else
      put(static_cast<o::AdamWParamState&>(s));
  }

  bool amsgrad() const {
    if (kind_ == Kind::adam) return static_cast<const o::AdamOptions&>(this->defaults()).amsgrad();
    if (kind_ == Kind::adamw)
      return static_cast<const o::AdamWOptions&>(this->defaults()).amsgrad();
    return false;
  }

  static std::int64_t step_count(const py::handle& v) {
    if (py::hasattr(v, "item")) return py::cast<std::int64_t>(py::int_(v.attr("item")()));
    return py::cast<std::int64_t>(py::int_(py::reinterpret_borrow<py::object>(v)));
  }

  template <class State>
  void adam_to_cpp(std::size_t i, const py::dict& s) {
    if (!s.contains("exp_avg") || !s.contains("exp_avg_sq")) return;
    auto& cpp = this->state();
    const auto key = key_of(params_[i]);
    auto exp_avg = s["exp_avg"].cast<at::Tensor>();
    auto it = cpp.find(key);
    State* st = it == cpp.end() ? nullptr : static_cast<State*>(it->second.get());
    if (!st || !same(st->exp_avg(), exp_avg)) {
      auto made = std::make_unique<State>();
      made->exp_avg(exp_avg);
      made->exp_avg_sq(s["exp_avg_sq"].cast<at::Tensor>());
      made->max_exp_avg_sq(s.contains("max_exp_avg_sq") ? s["max_exp_avg_sq"].cast<at::Tensor>()
                                                        : at::zeros_like(exp_avg));
      st = made.get();
      cpp[key] = std::move(made);
    }
    st->step(s.contains("step") ? step_count(s["step"]) : 0);
  }

  // Points the C++ state at the Python state's tensors (GIL held).
  void to_cpp() {
    if (kind_ == Kind::local) return;
    py::object state = py_opt_.attr("state");
    for (std::size_t i = 0; i < params_.size(); ++i) {
      py::object s = state.attr("get")(py_params_[i], py::none());
      if (s.is_none() || !py::isinstance<py::dict>(s)) continue;
      auto d = s.cast<py::dict>();
      if (kind_ == Kind::sgd) {
        if (!d.contains("momentum_buffer") || d["momentum_buffer"].is_none()) continue;
        auto buf = d["momentum_buffer"].cast<at::Tensor>();
        auto& cpp = this->state();
        const auto key = key_of(params_[i]);
        auto it = cpp.find(key);
        if (it != cpp.end() &&
            same(static_cast<o::SGDParamState&>(*it->second).momentum_buffer(), buf))
          continue;
        auto made = std::make_unique<o::SGDParamState>();
        made->momentum_buffer(buf);
        cpp[key] = std::move(made);
      } else if (kind_ == Kind::adam) {
        adam_to_cpp<o::AdamParamState>(i, d);
      } else {
        adam_to_cpp<o::AdamWParamState>(i, d);
      }
    }
  }

  Kind kind_;
  std::vector<at::Tensor> params_;
  py::object py_opt_;
  py::list py_params_;
};

template <class Base, class Options>
Inner make(Kind kind, std::vector<at::Tensor> params, Options opts, py::object py_opt,
           py::list py_params) {
  auto inner = std::make_unique<PyInner<Base>>(kind, std::move(params), std::move(opts),
                                               std::move(py_opt), std::move(py_params));
  InnerBridge* bridge = inner.get();
  return Inner{std::move(inner), bridge};
}

}  // namespace

Inner make_inner(py::object py_opt, std::vector<at::Tensor> params, py::list py_params) {
  auto optim = py::module_::import("torch.optim");
  py::handle type = py::type::handle_of(py_opt);
  py::dict g = py_opt.attr("param_groups")[py::int_(0)].cast<py::dict>();
  auto f = [&](const char* k) { return g[k].cast<double>(); };
  auto b = [&](const char* k) { return g.contains(k) && g[k].cast<bool>(); };
  // Exactly these classes: a subclass may keep other state or step differently.
  if (type.is(optim.attr("SGD"))) {
    o::SGDOptions so(f("lr"));
    so.momentum(f("momentum")).dampening(f("dampening")).weight_decay(f("weight_decay"));
    so.nesterov(b("nesterov"));
    return make<o::SGD>(Kind::sgd, std::move(params), so, py_opt, py_params);
  }
  if (type.is(optim.attr("Adam")) || type.is(optim.attr("AdamW"))) {
    auto betas = g["betas"].cast<std::pair<double, double>>();
    if (type.is(optim.attr("Adam"))) {
      o::AdamOptions ao(f("lr"));
      ao.betas({betas.first, betas.second}).eps(f("eps")).weight_decay(f("weight_decay"));
      ao.amsgrad(b("amsgrad"));
      return make<o::Adam>(Kind::adam, std::move(params), ao, py_opt, py_params);
    }
    o::AdamWOptions ao(f("lr"));
    ao.betas({betas.first, betas.second}).eps(f("eps")).weight_decay(f("weight_decay"));
    ao.amsgrad(b("amsgrad"));
    return make<o::AdamW>(Kind::adamw, std::move(params), ao, py_opt, py_params);
  }
  return make<o::SGD>(Kind::local, std::move(params), o::SGDOptions(0.0), py_opt, py_params);
}

}  // namespace starling::python
