// starling.Optimizer: see docs/python.md.
#include "py_common.hpp"

namespace starling::python {
void bind_optimizer(py::module_&) {}
}  // namespace starling::python
