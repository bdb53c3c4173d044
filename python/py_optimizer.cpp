// starling.Optimizer: a PyTorch optimizer (any torch.optim.Optimizer, Python-written ones too)
// inside a Starling collaboration. See docs/python.md.
//
// The C++ starling::Optimizer does the collaborative part (accumulating gradients, progress,
// rounds, state download and serving, checkpoints) over the tensors the Python model owns:
// the parameters are registered, as the same tensors, in a C++ module (ModelView) under the
// model's own dotted names when the user passes model= (so the gradient layout, the averaging
// schema and the state format match a C++ model of the same architecture, e.g. `starling
// train`'s), else as p0, p1, ... Its inner optimizer (py_inner.hpp) calls the Python
// optimizer's step() on the caller's thread with the GIL taken back for that call only; every
// other wait (rounds, downloads) runs with the GIL released. Optimizer state: torch.optim.SGD,
// Adam and AdamW share it through the state format's optimizer section (the bridge in
// py_inner.hpp); any other optimizer's state tensors are carried as buffers of the module
// (OptimizerOptions::optimizer_state_in_model), which only Python peers understand.
#include <torch/extension.h>

#include <algorithm>

#include "py_common.hpp"
#include "py_inner.hpp"
#include "starling/averaging/robust.hpp"
#include "starling/collab/net_collaboration.hpp"
#include "starling/core/log.hpp"
#include "starling/optim/optimizer.hpp"

namespace starling::python {
namespace {

// A C++ module whose parameters and buffers are the Python model's tensors (the same
// TensorImpls) under dotted names (nested submodules), registered in the Python model's order:
// named_parameters() then yields the same names in the same order as a C++ module of the same
// structure, so the flat gradient layout and the state format agree with it.
class ModelView : public torch::nn::Module {
 public:
  void add(const std::string& dotted, const at::Tensor& t, bool parameter) {
    torch::nn::Module* m = this;
    std::string rest = dotted;
    for (auto dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
      const auto head = rest.substr(0, dot);
      rest = rest.substr(dot + 1);
      if (head.empty()) throw py::value_error("parameter name '" + dotted + "' is malformed");
      auto* child = m->named_children().find(head);
      if (!child) {
        m->register_module(head, std::make_shared<ModelView>());
        child = m->named_children().find(head);
      }
      m = child->get();
    }
    if (rest.empty()) throw py::value_error("parameter name '" + dotted + "' is malformed");
    if (m->named_parameters(false).find(rest) || m->named_buffers(false).find(rest))
      throw py::value_error("the name '" + dotted + "' is given twice");
    if (parameter)
      m->register_parameter(rest, t, t.requires_grad());
    else
      m->register_buffer(rest, t);
  }
};

// A Python optimizer's state is created by its first step. Every peer creates it the same way
// before anything is exchanged: one step with zero gradients and learning rate 0 (parameters
// unchanged), then 'step' counters back to 0.
void initialise_state(py::object& opt, const std::vector<py::object>& params) {
  if (py::len(opt.attr("state")) > 0) return;
  py::object torch = py::module_::import("torch");
  std::vector<py::object> saved_lr;
  for (auto g : opt.attr("param_groups")) {
    auto group = g.cast<py::dict>();
    if (group.contains("lr")) {
      saved_lr.push_back(group["lr"]);
      group["lr"] = 0.0;
    } else {
      saved_lr.push_back(py::none());
    }
  }
  std::vector<bool> made;
  for (const auto& p : params) {
    const bool none = p.attr("grad").is_none();
    made.push_back(none);
    if (none) p.attr("grad") = torch.attr("zeros_like")(p);
  }
  {
    py::object no_grad = torch.attr("no_grad")();
    no_grad.attr("__enter__")();
    try {
      opt.attr("step")();
    } catch (...) {
      no_grad.attr("__exit__")(py::none(), py::none(), py::none());
      throw;
    }
    no_grad.attr("__exit__")(py::none(), py::none(), py::none());
  }
  std::size_t i = 0;
  for (auto g : opt.attr("param_groups")) {
    if (!saved_lr[i].is_none()) g.cast<py::dict>()["lr"] = saved_lr[i];
    ++i;
  }
  for (std::size_t k = 0; k < params.size(); ++k)
    if (made[k]) params[k].attr("grad") = py::none();
  py::dict state = opt.attr("state");
  for (auto item : state) {
    py::dict st = item.second.cast<py::dict>();
    if (st.contains("step") && py::isinstance(st["step"], torch.attr("Tensor")))
      st["step"].attr("zero_")();
  }
}

// Worker momentum moves the first moment before the average: the optimizer must keep none of
// its own (Adam/AdamW betas[0] == 0, SGD momentum == 0).
void refuse_own_momentum(const py::object& opt) {
  for (auto g : opt.attr("param_groups")) {
    auto group = g.cast<py::dict>();
    if (group.contains("betas") && py::cast<double>(group["betas"].attr("__getitem__")(0)) != 0)
      throw py::value_error(
          "worker_momentum replaces the optimizer's first moment: create it with betas=(0, ...)");
    if (group.contains("momentum") && py::cast<double>(group["momentum"]) != 0)
      throw py::value_error(
          "worker_momentum replaces the optimizer's momentum: create it with momentum=0");
  }
}

}  // namespace

class PyOptimizer {
 public:
  PyOptimizer(std::shared_ptr<Dht> dht, const std::string& run_id, py::object optimizer,
              std::uint64_t target_batch_size, std::size_t batch_size_per_step,
              const std::string& compression, std::uint32_t diloco_steps, double matchmaking_time,
              double averaging_timeout, double load_state_timeout,
              const std::string& checkpoint_dir, bool auxiliary, const py::object& model,
              const py::object& names, const std::string& run_key, const std::string& membership,
              const std::string& aggregation, double clip_tau, double clip_cut, bool verify,
              double worker_momentum)
      : dht_(std::move(dht)), py_opt_(std::move(optimizer)) {
    dht_->check_open();
    if (!py::hasattr(py_opt_, "param_groups") || !py::hasattr(py_opt_, "step"))
      throw py::type_error("optimizer must be a torch.optim.Optimizer");
    if (!model.is_none() && !names.is_none())
      throw py::value_error("pass model= or names=, not both");
    // The parameters, in param_groups order (the same on every peer for the same model).
    std::vector<torch::Tensor> params;
    for (auto g : py_opt_.attr("param_groups"))
      for (auto p : g.cast<py::dict>()["params"]) {
        auto t = py::cast<torch::Tensor>(p);
        if (!t.is_leaf() || !t.requires_grad())
          throw py::value_error("every optimised tensor must be a leaf that requires grad");
        for (const auto& q : params)
          if (q.unsafeGetTensorImpl() == t.unsafeGetTensorImpl())
            throw py::value_error("a tensor appears twice in the optimizer's param_groups");
        params.push_back(t);
        py_params_.push_back(py::reinterpret_borrow<py::object>(p));
      }
    if (params.empty()) throw py::value_error("the optimizer has no parameters");
    if (worker_momentum > 0) refuse_own_momentum(py_opt_);
    view_ = std::make_shared<ModelView>();
    name_parameters(params, model, names);

    auto inner = make_inner(py_opt_, params, py_params_);
    bridge_ = inner.bridge;
    const bool state_in_model = std::string(bridge_->kind()) == "local";
    if (state_in_model) {
      initialise_state(py_opt_, py_params_);
      register_state_buffers();
    } else {
      bridge_->to_cpp();  // state the Python optimizer already has (a loaded state_dict)
    }
    optim::OptimizerOptions o;
    o.run_id = run_id;
    o.target_batch_size = target_batch_size;
    o.batch_size = batch_size_per_step;
    o.diloco_steps = diloco_steps;
    o.auxiliary = auxiliary;
    o.client_mode = dht_->client_mode();
    o.optimizer_state_in_model = state_in_model;
    o.worker_momentum = worker_momentum;
    o.checkpoint_dir = checkpoint_dir;
    o.interrupted = [this] { return check_signals(); };
    o.grad_compression = unwrap(training::parse_compression(compression));
    auto secs = [](double s, const char* what) {
      if (!(s > 0)) throw py::value_error(std::string(what) + " must be > 0");
      return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
    };
    o.matchmaking_time = secs(matchmaking_time, "matchmaking_time");
    o.averaging_timeout = secs(averaging_timeout, "averaging_timeout");
    o.load_state_timeout = secs(load_state_timeout, "load_state_timeout");
    collab::NetCollaborationConfig cfg;
    cfg.run_id = run_id;
    cfg.client_mode = dht_->client_mode();
    cfg.aggregation.kind = unwrap(averaging::parse_aggregation(aggregation));
    cfg.aggregation.tau = clip_tau;
    cfg.aggregation.cut = clip_cut;
    unwrap(averaging::validate(cfg.aggregation));
    cfg.verify = verify;
    if (verify && compression != "none")
      throw py::value_error("verify=True sends gradients uncompressed: pass compression='none'");
    if (!run_key.empty() || !membership.empty()) {  // a private run
      if (run_key.empty() || membership.empty())
        throw py::value_error("a private run needs both run_key and membership");
      cfg.membership = unwrap(auth::membership_from_files(run_key, membership, ""));
    }
    {
      py::gil_scoped_release release;
      collab_ = unwrap(collab::NetCollaboration::create(dht_->host(), dht_->node(), cfg));
      auto made = optim::Optimizer::create(*view_, std::move(inner.optimizer), o, collab_);
      if (!made) {
        stop_collaboration();
        py::gil_scoped_acquire gil;
        raise(made.error());
      }
      opt_ = std::move(made).value();
    }
    bridge_->to_python();  // a checkpoint's optimizer state
  }

  ~PyOptimizer() {
    try {
      shutdown();
    } catch (...) {
    }
  }

  bool step(std::optional<std::size_t> batch_size) {
    check_open();
    result<optim::StepReport> r = make_error(errc::internal, "no step");
    {
      py::gil_scoped_release release;
      r = opt_->step(batch_size.value_or(0));
    }
    if (auto e = bridge_->take_error()) std::rethrow_exception(e);
    bridge_->to_python();  // a state download replaced the optimizer state
    raise_pending_interrupt();
    last_ = unwrap(std::move(r));
    return last_.stepped;
  }

  void zero_grad(bool set_to_none) {
    py_opt_.attr("zero_grad")(py::arg("set_to_none") = set_to_none);
  }

  std::uint64_t local_epoch() const {
    check_open();
    return opt_->local_epoch();
  }

  optim::OptimizerStatus status() const {
    check_open();
    py::gil_scoped_release release;
    return opt_->status();
  }

  // [{"peer": id, "reason": why}] of the peers this one banned (verify=True).
  py::list banned_peers() const {
    check_open();
    auto c = collab_;
    auto r = [&] {
      py::gil_scoped_release release;
      return block_on(
          dht_->executor(),
          [c]() -> awaitable<result<std::vector<collab::NetCollaboration::BannedPeer>>> {
            co_return c->banned_peers();
          },
          10s);
    }();
    py::list out;
    for (const auto& b : unwrap(std::move(r))) {
      py::dict d;
      d["peer"] = b.peer.to_string();
      d["reason"] = b.reason;
      out.append(d);
    }
    return out;
  }

  const char* state_sharing() const {
    check_open();
    return bridge_->kind();
  }

  bool is_synchronized_with_peers() const {
    auto s = status();
    return s.local_epoch >= s.collaboration.global_epoch;
  }

  void load_state_from_peers() {
    check_open();
    result<void> r = success();
    {
      py::gil_scoped_release release;
      r = opt_->load_state_from_peers();
    }
    bridge_->to_python();
    raise_pending_interrupt();
    unwrap(std::move(r));
  }

  py::dict state_dict() const {
    check_open();
    py::dict d;
    d["optimizer"] = py_opt_.attr("state_dict")();
    d["local_epoch"] = opt_->local_epoch();
    return d;
  }

  // Loads the Python optimizer's state and puts it back into the tensors the collaboration
  // shares (load_state_dict replaces the state's tensor objects).
  void load_state_dict(const py::dict& d) {
    check_open();
    if (!d.contains("optimizer")) throw py::value_error("state dict without 'optimizer'");
    py_opt_.attr("load_state_dict")(d["optimizer"]);
    bridge_->to_cpp();
    py::dict state = py_opt_.attr("state");
    torch::NoGradGuard no_grad;
    for (auto& b : buffers_) {
      py::dict st = state[py_params_[b.param]].cast<py::dict>();
      auto loaded = py::cast<torch::Tensor>(st[py::str(b.key)]);
      if (loaded.sizes() != b.tensor.sizes())
        throw py::value_error("optimizer state '" + b.key + "' has another shape");
      b.tensor.copy_(loaded);
      st[py::str(b.key)] = py::cast(b.tensor);
    }
  }

  void serve_state_requests() {
    check_open();
    py::gil_scoped_release release;
    opt_->serve_state_requests();
  }

  // Leaves the collaboration (bounded). Shut the optimizer down before its DHT: once the DHT
  // is shut down there is no network left to leave cleanly, and this only releases resources.
  void shutdown() {
    if (!opt_) return;
    {
      py::gil_scoped_release release;
      auto r = opt_->shutdown(dht_->closed() ? Duration(200ms) : Duration(10s));
      if (!r) logger("python")->warn("optimizer shutdown: {}", r.error().message());
      stop_collaboration();
    }
    bridge_ = nullptr;
    opt_.reset();  // the adapter releases the Python optimizer (with the GIL)
  }

 private:
  struct Buffer {
    std::size_t param;
    std::string key;
    torch::Tensor tensor;
  };

  void check_open() const {
    if (!opt_) throw StarlingError("the optimizer is shut down");
  }

  // OptimizerOptions::interrupted: called on the training thread (GIL released) while step()
  // or load_state_from_peers() waits for the network (SignalCheck).
  bool check_signals() { return signals_.check(); }
  void raise_pending_interrupt() { signals_.raise_pending(); }

  // Registers the parameters in view_: under the model's names, the given names, or p0, p1...
  void name_parameters(const std::vector<torch::Tensor>& params, const py::object& model,
                       const py::object& names) {
    if (!names.is_none()) {
      auto list = names.cast<std::vector<std::string>>();
      if (list.size() != params.size())
        throw py::value_error("names: " + std::to_string(list.size()) + " names for " +
                              std::to_string(params.size()) + " optimised tensors");
      for (std::size_t i = 0; i < params.size(); ++i) view_->add(list[i], params[i], true);
      return;
    }
    if (model.is_none()) {
      for (std::size_t i = 0; i < params.size(); ++i)
        view_->add("p" + std::to_string(i), params[i], true);
      return;
    }
    if (!py::hasattr(model, "named_parameters") || !py::hasattr(model, "named_buffers"))
      throw py::type_error("model must be a torch.nn.Module");
    std::vector<bool> seen(params.size(), false);
    for (auto item : model.attr("named_parameters")()) {
      auto pair = item.cast<py::tuple>();
      const auto name = pair[0].cast<std::string>();
      const auto t = pair[1].cast<torch::Tensor>();
      std::size_t i = 0;
      while (i < params.size() && params[i].unsafeGetTensorImpl() != t.unsafeGetTensorImpl()) ++i;
      if (i == params.size())
        throw py::value_error("the model's parameter '" + name +
                              "' is not in the optimizer (the collaboration trains every "
                              "parameter of the model)");
      seen[i] = true;
      view_->add(name, t, true);
    }
    if (std::find(seen.begin(), seen.end(), false) != seen.end())
      throw py::value_error("the optimizer holds a tensor that is not a parameter of the model");
    for (auto item : model.attr("named_buffers")()) {
      auto pair = item.cast<py::tuple>();
      view_->add(pair[0].cast<std::string>(), pair[1].cast<torch::Tensor>(), false);
    }
  }

  // The Python optimizer's state tensors as buffers of view_, by parameter and key (sorted:
  // the same on every peer).
  void register_state_buffers() {
    py::dict state = py_opt_.attr("state");
    py::object tensor_type = py::module_::import("torch").attr("Tensor");
    for (std::size_t i = 0; i < py_params_.size(); ++i) {
      if (!state.contains(py_params_[i])) continue;
      py::dict st = state[py_params_[i]].cast<py::dict>();
      std::vector<std::string> keys;
      for (auto kv : st)
        if (py::isinstance<py::str>(kv.first) && py::isinstance(kv.second, tensor_type))
          keys.push_back(kv.first.cast<std::string>());
      std::sort(keys.begin(), keys.end());
      for (const auto& k : keys) {
        auto t = py::cast<torch::Tensor>(st[py::str(k)]);
        view_->register_buffer("state" + std::to_string(i) + "_" + k, t);
        buffers_.push_back({i, k, t});
      }
    }
  }
  void stop_collaboration() {
    if (!collab_ || dht_->closed()) return;
    auto c = collab_;
    auto r = block_on(
        dht_->executor(),
        [c]() -> awaitable<result<void>> {
          co_await c->stop();
          co_return success();
        },
        15s);
    if (!r) logger("python")->warn("collaboration stop: {}", r.error().message());
    collab_.reset();
  }

  std::shared_ptr<Dht> dht_;
  py::object py_opt_;
  std::vector<py::object> py_params_;
  std::shared_ptr<ModelView> view_;
  SignalCheck signals_;            // a signal handler's exception (check_signals)
  std::vector<Buffer> buffers_;    // the Python state's tensors ("local" optimizers only)
  InnerBridge* bridge_ = nullptr;  // owned by opt_
  std::shared_ptr<collab::NetCollaboration> collab_;
  std::unique_ptr<optim::Optimizer> opt_;
  optim::StepReport last_;
};

void bind_optimizer(py::module_& m) {
  py::class_<PyOptimizer>(m, "Optimizer", R"doc(
A torch.optim optimizer inside a Starling collaboration (hivemind.Optimizer's role).

Peers accumulate gradients; when the collaboration has target_batch_size samples, they
average them and every peer calls your optimizer's step() on the averaged gradients (on the
thread that called step(), so Python-written optimizers work). Parameters, gradients and the
optimizer's state tensors are read and written in place. Pass model= (the module the
optimizer trains) to name the parameters as the model does: peers of one run must agree on
names and shapes, and `starling train` peers use the model's names. A private run (see
docs/security.md): run_key= (the run key's text) and membership= (this peer's certificate
file, `starling run-key sign`). Hostile peers (docs/security.md): aggregation='centered-clip'
(clip_tau: its radius, 0 adaptive; clip_cut: members beyond clip_cut x an adaptive radius
count 0, default 6, 0 off), verify=True (signed, checked rounds; cheaters are banned,
see banned_peers()), worker_momentum=0.9 (peers average the moving average of their gradients;
the optimizer then keeps no momentum of its own: Adam betas=(0, 0.999)). Every peer of a run
uses the same.)doc")
      .def(py::init<std::shared_ptr<Dht>, std::string, py::object, std::uint64_t, std::size_t,
                    std::string, std::uint32_t, double, double, double, std::string, bool,
                    py::object, py::object, std::string, std::string, std::string, double, double,
                    bool, double>(),
           py::arg("dht"), py::arg("run_id"), py::arg("optimizer"), py::arg("target_batch_size"),
           py::arg("batch_size_per_step") = 0, py::arg("compression") = "none",
           py::arg("diloco_steps") = 0, py::arg("matchmaking_time") = 5.0,
           py::arg("averaging_timeout") = 30.0, py::arg("load_state_timeout") = 60.0,
           py::arg("checkpoint_dir") = "", py::arg("auxiliary") = false,
           py::arg("model") = py::none(), py::arg("names") = py::none(), py::arg("run_key") = "",
           py::arg("membership") = "", py::arg("aggregation") = "mean", py::arg("clip_tau") = 0.0,
           py::arg("clip_cut") = averaging::AggregationConfig{}.cut, py::arg("verify") = false,
           py::arg("worker_momentum") = 0.0)
      .def("step", &PyOptimizer::step, py::arg("batch_size") = py::none(),
           "Call after loss.backward() on a batch (batch_size: its samples; default "
           "batch_size_per_step). Returns True when the collaboration's epoch advanced.")
      .def("zero_grad", &PyOptimizer::zero_grad, py::arg("set_to_none") = false)
      .def("banned_peers", &PyOptimizer::banned_peers,
           "The peers this one banned for the run (verify=True): a list of {'peer': id, "
           "'reason': why}.")
      .def_property_readonly("local_epoch", &PyOptimizer::local_epoch)
      .def_property_readonly("state_sharing", &PyOptimizer::state_sharing,
                             "How the optimizer's state travels: 'sgd', 'adam', 'adamw' "
                             "(torch.optim.SGD/Adam/AdamW: the state format's optimizer section, "
                             "shared with C++ peers) or 'local' (any other optimizer: its state "
                             "tensors as model buffers, shared with Python peers only)")
      .def("is_synchronized_with_peers", &PyOptimizer::is_synchronized_with_peers)
      .def("load_state_from_peers", &PyOptimizer::load_state_from_peers)
      .def("serve_state_requests", &PyOptimizer::serve_state_requests,
           "Answers a peer's pending state download without training (a peer that stays after "
           "its last step so that others can catch up).")
      .def("state_dict", &PyOptimizer::state_dict)
      .def("load_state_dict", &PyOptimizer::load_state_dict, py::arg("state_dict"))
      .def("status",
           [](const PyOptimizer& o) {
             auto s = o.status();
             py::dict d;
             d["local_epoch"] = s.local_epoch;
             d["global_epoch"] = s.collaboration.global_epoch;
             d["local_samples"] = s.local_samples;
             d["samples_total"] = s.samples_total;
             d["num_peers"] = s.collaboration.num_peers;
             d["peers_at_global_epoch"] = s.collaboration.peers_at_global_epoch;
             d["samples_per_second"] = s.collaboration.samples_per_second;
             d["rounds_ok"] = s.rounds_ok;
             d["rounds_failed"] = s.rounds_failed;
             d["state_downloads"] = s.state_downloads;
             d["bytes_sent"] = s.bytes_sent;
             d["bytes_received"] = s.bytes_received;
             return d;
           })
      .def("shutdown", &PyOptimizer::shutdown)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyOptimizer& o, py::args) { o.shutdown(); });
}

}  // namespace starling::python
