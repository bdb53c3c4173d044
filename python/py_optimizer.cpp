// starling.Optimizer: starling::Optimizer (C++) around a PyTorch optimizer written in Python
// (any torch.optim optimizer, or a user's own subclass), hivemind-style API.
//
// - Tensors are shared, not copied: the C++ side holds the very at::Tensors of the Python
//   parameters (a ModelView module registers them under their dotted names), reads their
//   .grad in place into its accumulators and writes the averaged gradient back into .grad.
// - The optimizer step stays a Python call on the caller's thread: the C++ Optimizer's inner
//   optimizer (py_inner.hpp) takes the GIL in step() and calls the Python optimizer's step().
//   starling::Optimizer calls it from step() on the calling (training) thread; delayed updates
//   (which step on a background thread) are therefore refused.
// - The GIL is released around every call into the C++ Optimizer (which waits for the
//   network); the io thread never touches Python objects.
// - Optimizer state: shared with peers for torch.optim.SGD/Adam/AdamW (py_inner.hpp), local
//   for other optimizers (docs/python.md).
#include <torch/extension.h>

#include <pybind11/stl.h>

#include "py_common.hpp"
#include "py_inner.hpp"
#include "starling/collab/net_collaboration.hpp"
#include "starling/core/log.hpp"
#include "starling/optim/optimizer.hpp"

namespace starling::python {

namespace {

Duration seconds(double s, const char* what) {
  if (!(s > 0)) throw py::value_error(std::string(what) + " must be > 0");
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

// A C++ module whose parameters and buffers are the Python model's tensors (same
// TensorImpls), under the same dotted names (nested submodules), so the state format and
// the parameter digest match a C++ model with the same structure.
class ModelView : public torch::nn::Module {
 public:
  void add(const std::string& dotted, const at::Tensor& t, bool parameter) {
    torch::nn::Module* m = this;
    std::string rest = dotted;
    for (auto dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
      const auto head = rest.substr(0, dot);
      rest = rest.substr(dot + 1);
      auto* child = m->named_children().find(head);
      if (!child) {
        auto made = std::make_shared<ModelView>();
        m->register_module(head, made);
        child = m->named_children().find(head);
      }
      m = child->get();
    }
    if (rest.empty()) throw py::value_error("parameter name '" + dotted + "' is malformed");
    if (parameter)
      m->register_parameter(rest, t, t.requires_grad());
    else
      m->register_buffer(rest, t);
  }
};

training::Compression compression_of(const py::object& o, const char* what) {
  if (o.is_none()) return training::Compression::none;
  auto s = py::str(o).cast<std::string>();
  auto r = training::parse_compression(s);
  if (!r)
    throw py::value_error(std::string(what) + ": '" + s +
                          "' is not a compression (none, float16, uint8)");
  return r.value();
}

}  // namespace

class PyOptimizer {
 public:
  PyOptimizer(std::shared_ptr<Dht> dht, std::string run_id, py::object optimizer, py::object params,
              py::object model, std::uint64_t target_batch_size, py::object batch_size_per_step,
              double matchmaking_time, double averaging_timeout, double load_state_timeout,
              py::object compression, py::object grad_compression,
              py::object state_averaging_compression, bool delay_optimizer_step,
              bool use_local_updates, std::uint32_t diloco_steps, double outer_lr,
              double outer_momentum, bool outer_nesterov, py::object checkpoint_dir,
              double shutdown_timeout)
      : dht_(std::move(dht)) {
    if (dht_) dht_->check_open();
    auto torch_opt = py::module_::import("torch.optim").attr("Optimizer");
    // hivemind: optimizer is an instance, or a factory called with params.
    if (!py::isinstance(optimizer, torch_opt)) {
      if (!PyCallable_Check(optimizer.ptr()))
        throw py::type_error("optimizer must be a torch.optim.Optimizer or a factory callable");
      if (params.is_none()) {
        if (model.is_none())
          throw py::type_error("optimizer is a factory: pass params= (or model=)");
        params = model.attr("parameters")();
      }
      optimizer = optimizer(params);
      if (!py::isinstance(optimizer, torch_opt))
        throw py::type_error("the optimizer factory did not return a torch.optim.Optimizer");
    }
    py_opt_ = optimizer;

    auto view = std::make_shared<ModelView>();
    std::vector<at::Tensor> opt_params;
    py::list py_params;
    for (auto group : optimizer.attr("param_groups"))
      for (auto p : group["params"]) {
        opt_params.push_back(p.cast<at::Tensor>());
        py_params.append(p);
      }
    if (!model.is_none()) {
      for (auto item : model.attr("named_parameters")()) {
        auto t = item.cast<py::tuple>();
        view->add(t[0].cast<std::string>(), t[1].cast<at::Tensor>(), true);
      }
      for (auto item : model.attr("named_buffers")()) {
        auto t = item.cast<py::tuple>();
        view->add(t[0].cast<std::string>(), t[1].cast<at::Tensor>(), false);
      }
    } else {
      for (std::size_t i = 0; i < opt_params.size(); ++i)
        view->add("param" + std::to_string(i), opt_params[i], true);
    }
    for (const auto& p : opt_params)
      if (!p.is_leaf() || p.scalar_type() != at::kFloat || !p.device().is_cpu())
        throw py::value_error("parameters must be float32 CPU leaf tensors");
    model_ = view;

    optim::OptimizerOptions o;
    o.run_id = std::move(run_id);
    o.target_batch_size = target_batch_size;
    if (!batch_size_per_step.is_none()) o.batch_size = batch_size_per_step.cast<std::size_t>();
    o.matchmaking_time = seconds(matchmaking_time, "matchmaking_time");
    o.averaging_timeout = seconds(averaging_timeout, "averaging_timeout");
    o.load_state_timeout = seconds(load_state_timeout, "load_state_timeout");
    const auto both = compression_of(compression, "compression");
    o.grad_compression =
        grad_compression.is_none() ? both : compression_of(grad_compression, "grad_compression");
    o.state_compression =
        state_averaging_compression.is_none()
            ? both
            : compression_of(state_averaging_compression, "state_averaging_compression");
    if (delay_optimizer_step)
      throw py::value_error(
          "delay_optimizer_step=True is not supported by starling.Optimizer: the delayed "
          "step runs on a background thread, and the Python optimizer's step() runs on the "
          "caller's thread (use `starling train` for delayed updates)");
    if (use_local_updates && diloco_steps == 0)
      throw py::value_error(
          "use_local_updates=True needs diloco_steps=H (local steps per outer round)");
    o.diloco_steps = diloco_steps;
    o.outer.lr = outer_lr;
    o.outer.momentum = outer_momentum;
    o.outer.nesterov = outer_nesterov;
    if (!checkpoint_dir.is_none()) o.checkpoint_dir = py::str(checkpoint_dir).cast<std::string>();
    o.client_mode = dht_ && dht_->client_mode();
    shutdown_timeout_ = seconds(shutdown_timeout, "shutdown_timeout");

    auto inner = make_inner(optimizer, std::move(opt_params), py_params);
    inner_ = inner.bridge;
    py::gil_scoped_release nogil;
    if (dht_) {
      collab::NetCollaborationConfig cc;
      cc.run_id = o.run_id;
      cc.client_mode = o.client_mode;
      auto made = collab::NetCollaboration::create(dht_->host(), dht_->node(), cc);
      if (!made) {
        py::gil_scoped_acquire gil;
        raise(made.error().with_context("joining the collaboration"));
      }
      collab_ = made.value();
    }
    auto r = optim::Optimizer::create(*model_, std::move(inner.optimizer), std::move(o), collab_);
    if (!r) {
      stop_collaboration();
      py::gil_scoped_acquire gil;
      raise(r.error());
    }
    opt_ = std::move(r).value();
    if (opt_->resumed_from()) inner_->to_python();  // the checkpoint's optimizer state
  }

  ~PyOptimizer() {
    py::gil_scoped_release nogil;
    close();
  }

  void check_open() const {
    if (!opt_) throw StarlingError("the optimizer is shut down");
  }

  optim::StepReport step(py::object batch_size) {
    check_open();
    const std::size_t bs = batch_size.is_none() ? 0 : batch_size.cast<std::size_t>();
    result<optim::StepReport> r = make_error(errc::internal, "unset");
    {
      py::gil_scoped_release nogil;
      r = opt_->step(bs);
      if (r && r.value().action == training::Action::download_state) inner_->to_python();
    }
    if (auto e = inner_->take_error()) std::rethrow_exception(e);
    return unwrap(std::move(r));
  }

  void zero_grad() {
    check_open();
    py::gil_scoped_release nogil;
    opt_->zero_grad();
  }

  std::uint64_t local_epoch() const {
    check_open();
    return opt_->local_epoch();
  }

  optim::OptimizerStatus status() const {
    check_open();
    py::gil_scoped_release nogil;
    return opt_->status();
  }

  void load_state_from_peers() {
    check_open();
    result<void> r = success();
    {
      py::gil_scoped_release nogil;
      r = opt_->load_state_from_peers();
      if (r) inner_->to_python();
    }
    if (auto e = inner_->take_error()) std::rethrow_exception(e);
    unwrap(std::move(r));
  }

  void serve_state_requests() {
    check_open();
    py::gil_scoped_release nogil;
    opt_->serve_state_requests();
  }

  std::uint64_t state_digest() const {
    check_open();
    return opt_->state_digest();
  }

  const py::object& py_optimizer() const { return py_opt_; }
  const char* state_sharing() const {
    check_open();
    return inner_->kind();
  }

  void shutdown() {
    if (!opt_) return;
    py::gil_scoped_release nogil;
    close();
  }

 private:
  // Without the GIL.
  void close() {
    if (opt_) {
      auto r = opt_->shutdown(shutdown_timeout_);
      if (!r) logger("python")->warn("optimizer shutdown: {}", r.error().message());
      opt_.reset();
      inner_ = nullptr;
    }
    stop_collaboration();
    model_.reset();
  }
  void stop_collaboration() {
    if (!collab_) return;
    auto c = std::move(collab_);
    if (dht_ && !dht_->closed()) {
      auto r = block_on(
          dht_->executor(),
          [c]() -> awaitable<result<void>> {
            co_await c->stop();
            co_return success();
          },
          shutdown_timeout_);
      if (!r) logger("python")->warn("leaving the collaboration: {}", r.error().message());
    }
  }

  std::shared_ptr<Dht> dht_;
  py::object py_opt_;
  std::shared_ptr<ModelView> model_;
  std::shared_ptr<collab::NetCollaboration> collab_;
  std::unique_ptr<optim::Optimizer> opt_;
  InnerBridge* inner_ = nullptr;  // owned by opt_
  Duration shutdown_timeout_ = 10s;
};

namespace {

double secs(Duration d) {
  return std::chrono::duration<double>(d).count();
}

py::dict status_dict(const optim::OptimizerStatus& s) {
  py::dict d;
  d["local_epoch"] = s.local_epoch;
  d["local_samples"] = s.local_samples;
  d["samples_total"] = s.samples_total;
  d["local_samples_per_second"] = s.local_samples_per_second;
  d["global_epoch"] = s.collaboration.global_epoch;
  d["samples_accumulated"] = s.collaboration.samples_accumulated;
  d["samples_per_second"] = s.collaboration.samples_per_second;
  d["num_peers"] = s.collaboration.num_peers;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_received"] = s.bytes_received;
  d["rounds_ok"] = s.rounds_ok;
  d["rounds_failed"] = s.rounds_failed;
  d["state_downloads"] = s.state_downloads;
  d["step_time"] = secs(s.step_time);
  return d;
}

py::dict report_dict(const optim::StepReport& r) {
  py::dict d;
  d["action"] = training::to_string(r.action);
  d["stepped"] = r.stepped;
  d["epoch"] = r.epoch;
  d["group_size"] = r.group_size;
  d["group_samples"] = r.group_samples;
  d["bytes_sent"] = r.bytes_sent;
  d["bytes_received"] = r.bytes_received;
  d["averaging_time"] = secs(r.averaging_time);
  d["round_error"] = r.round_error ? py::object(py::str(r.round_error->message())) : py::none();
  return d;
}

}  // namespace

void bind_optimizer(py::module_& m) {
  py::class_<PyOptimizer, std::shared_ptr<PyOptimizer>>(m, "Optimizer", R"doc(
Collaborative training around a PyTorch optimizer (hivemind.Optimizer's API; docs/python.md).

Optimizer(dht, run_id, target_batch_size, optimizer, params=None, model=None,
          batch_size_per_step=None, ...)
dht: a starling.DHT (None: train alone with the same semantics).
optimizer: a torch.optim.Optimizer instance, or a factory called with params.
model: the nn.Module the parameters belong to (optional): its parameter names are used in the
  shared state, so Python and C++ peers with the same model can train together.
Call step() after backward() instead of the inner optimizer's step(); every target_batch_size
samples of the whole collaboration, the peers average gradients and the Python optimizer's
step() runs (on this thread).)doc")
      .def(py::init<std::shared_ptr<Dht>, std::string, py::object, py::object, py::object,
                    std::uint64_t, py::object, double, double, double, py::object, py::object,
                    py::object, bool, bool, std::uint32_t, double, double, bool, py::object,
                    double>(),
           py::arg("dht"), py::arg("run_id"), py::arg("optimizer"), py::arg("params") = py::none(),
           py::arg("model") = py::none(), py::arg("target_batch_size") = 4096,
           py::arg("batch_size_per_step") = py::none(), py::arg("matchmaking_time") = 5.0,
           py::arg("averaging_timeout") = 30.0, py::arg("load_state_timeout") = 120.0,
           py::arg("compression") = py::none(), py::arg("grad_compression") = py::none(),
           py::arg("state_averaging_compression") = py::none(),
           py::arg("delay_optimizer_step") = false, py::arg("use_local_updates") = false,
           py::arg("diloco_steps") = 0, py::arg("outer_lr") = 0.7, py::arg("outer_momentum") = 0.9,
           py::arg("outer_nesterov") = true, py::arg("checkpoint_dir") = py::none(),
           py::arg("shutdown_timeout") = 10.0)
      .def(
          "step",
          [](PyOptimizer& o, py::object closure, py::object batch_size) {
            py::object loss = py::none();
            if (!closure.is_none()) loss = closure();
            o.step(batch_size);
            return loss;
          },
          py::arg("closure") = py::none(), py::arg("batch_size") = py::none(),
          "Accumulates this batch's gradients (and clears .grad); when the collaboration "
          "reaches target_batch_size, averages with the peers and runs the optimizer's step().")
      .def(
          "step_report",
          [](PyOptimizer& o, py::object batch_size) { return report_dict(o.step(batch_size)); },
          py::arg("batch_size") = py::none(), "step(), returning what it did as a dict.")
      .def(
          "zero_grad", [](PyOptimizer& o, py::object) { o.zero_grad(); },
          py::arg("set_to_none") = py::none())
      .def_property_readonly("local_epoch", &PyOptimizer::local_epoch)
      .def_property_readonly("state_digest", &PyOptimizer::state_digest)
      .def_property_readonly("opt", &PyOptimizer::py_optimizer)
      .def_property_readonly("state_sharing", &PyOptimizer::state_sharing,
                             "Optimizer state shared with peers: 'sgd', 'adam', 'adamw' "
                             "(torch.optim.SGD/Adam/AdamW), or 'local' (any other optimizer: "
                             "peers exchange parameters only)")
      .def_property_readonly("param_groups",
                             [](PyOptimizer& o) { return o.py_optimizer().attr("param_groups"); })
      .def("status", [](PyOptimizer& o) { return status_dict(o.status()); })
      .def("is_synchronized_with_peers",
           [](PyOptimizer& o) {
             auto s = o.status();
             return s.local_epoch + 1 >= s.collaboration.global_epoch;
           })
      .def("load_state_from_peers", &PyOptimizer::load_state_from_peers)
      .def("serve_state_requests", &PyOptimizer::serve_state_requests,
           "Serves a pending state download of a peer without training (for a peer that "
           "stays a moment after its last step).")
      .def("state_dict",
           [](PyOptimizer& o) {
             py::dict d;
             d["optimizer"] = o.py_optimizer().attr("state_dict")();
             d["local_epoch"] = o.local_epoch();
             return d;
           })
      .def("load_state_dict",
           [](PyOptimizer& o, py::dict d) {
             if (!d.contains("optimizer"))
               throw py::value_error("state dict has no 'optimizer' entry");
             o.py_optimizer().attr("load_state_dict")(d["optimizer"]);
           })
      .def("shutdown", &PyOptimizer::shutdown)
      .def("__enter__", [](std::shared_ptr<PyOptimizer> o) { return o; })
      .def("__exit__", [](PyOptimizer& o, py::args) { o.shutdown(); });
}

}  // namespace starling::python
