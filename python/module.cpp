// The `starling` Python extension module: collaborative training over the C++ core.
// See docs/python.md.
#include <torch/extension.h>

#include "py_common.hpp"

namespace starling::python {

[[noreturn]] void raise(const Error& e) {
  const auto msg = e.message();
  if (e.code() == errc::invalid_argument) throw py::value_error(msg);
  if (e.code() == errc::timeout) {
    PyErr_SetString(PyExc_TimeoutError, msg.c_str());
    throw py::error_already_set();
  }
  throw StarlingError(msg);
}

}  // namespace starling::python

PYBIND11_MODULE(starling, m) {
  namespace sp = starling::python;
  m.doc() = "Starling: collaborative training of PyTorch models over the internet (C++ core)";
  m.attr("__version__") = "0.1.0";
  py::register_exception<sp::StarlingError>(m, "StarlingError", PyExc_RuntimeError);
  sp::bind_dht(m);
  sp::bind_optimizer(m);
}
