// The inner optimizer starling::Optimizer steps for starling.Optimizer, and the bridge between
// a Python optimizer's state and the state format's optimizer section.
//
// The inner optimizer's step() takes the GIL and calls the Python optimizer's step() on the
// calling (training) thread. For exactly torch.optim.SGD, Adam and AdamW (not subclasses: they
// may keep other state or step differently) it is the libtorch optimizer of the same kind with
// the Python optimizer's groups and options, whose per-parameter state holds the Python
// state's own tensors (no copies): after every Python step to_cpp() points the C++ state at
// the Python tensors and copies the step counter; after the C++ side replaced its state
// (state download, checkpoint resume) to_python() installs the new tensors in the Python
// optimizer. So state downloads and checkpoints carry the optimizer state in the state
// format's optimizer section, as `starling train` writes it, and Python and C++ peers of one
// run exchange it. Any other optimizer is kind "local": the C++ object is a stateless SGD and
// the binding carries the Python state tensors as model buffers instead
// (OptimizerOptions::optimizer_state_in_model), which only Python peers share.
//
// Threading rule: step(), to_cpp() and to_python() run on the training thread; step() takes
// the GIL, the others are called with it held.
#pragma once

#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include <torch/extension.h>

namespace starling::python {

namespace py = pybind11;

class InnerBridge {
 public:
  virtual ~InnerBridge() = default;
  // The first exception the Python step raised since the last call (step() cannot throw
  // through starling::Optimizer).
  std::exception_ptr take_error() { return std::exchange(error_, nullptr); }
  // "sgd", "adam", "adamw": state in the state format; "local": see above.
  virtual const char* kind() const = 0;
  // Points the C++ state at the Python state's tensors (GIL held).
  virtual void to_cpp() = 0;
  // Installs C++ state tensors that differ from the Python state's in the Python optimizer
  // (GIL held). Cheap when nothing changed (tensor identities compared).
  virtual void to_python() = 0;

 protected:
  std::exception_ptr error_;
};

struct Inner {
  std::unique_ptr<torch::optim::Optimizer> optimizer;  // handed to starling::Optimizer
  InnerBridge* bridge = nullptr;                       // the same object
};

// `params` are the Python optimizer's parameters in param_groups order, `py_params` the same
// as Python objects. GIL held.
Inner make_inner(const py::object& py_opt, std::vector<at::Tensor> params,
                 std::vector<py::object> py_params);

}  // namespace starling::python
