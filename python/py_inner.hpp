// The inner optimizer starling::Optimizer steps for starling.Optimizer: a libtorch optimizer
// object (so the C++ side can serialise optimizer state in Starling's state format) whose
// step() calls the Python optimizer's step() on the calling thread, with the GIL.
//
// State bridge: for torch.optim.SGD, Adam and AdamW (exactly these classes) the inner object
// is the libtorch optimizer of the same kind with the Python optimizer's hyperparameters, and
// its per-parameter state aliases the Python optimizer's state tensors (no copies): after
// every Python step the C++ state points at the Python tensors (and gets the step count);
// after the C++ side loaded state from peers or a checkpoint, to_python() installs the loaded
// tensors in the Python optimizer's state. State downloads then carry the optimizer state,
// and Python and C++ (`starling train --optimizer adam`) peers exchange it. Any other
// optimizer (a user's own subclass) is wrapped as an SGD without state: its state stays local.
//
// Threading rule: step() and to_python() run on the training thread; they take the GIL.
#pragma once

#include <exception>
#include <memory>
#include <vector>

#include <torch/extension.h>

namespace starling::python {

namespace py = pybind11;

class InnerBridge {
 public:
  virtual ~InnerBridge() = default;
  // The first exception the Python step raised since the last call.
  std::exception_ptr take_error() { return std::exchange(error_, nullptr); }
  // Installs the C++ optimizer state (just loaded) in the Python optimizer (GIL held).
  virtual void to_python() = 0;
  // "sgd", "adam", "adamw" (state shared with peers) or "local" (state stays local).
  virtual const char* kind() const = 0;

 protected:
  std::exception_ptr error_;
};

struct Inner {
  std::unique_ptr<torch::optim::Optimizer> optimizer;  // handed to starling::Optimizer
  InnerBridge* bridge = nullptr;                       // the same object
};

// `params` are the Python optimizer's parameters in param_groups order (`py_params` the same
// as Python objects). GIL held.
Inner make_inner(py::object py_opt, std::vector<at::Tensor> params, py::list py_params);

}  // namespace starling::python
