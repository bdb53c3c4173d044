// Shared pieces of the `starling` Python module: the DHT handle the optimizer uses, and the
// mapping of C++ errors to Python exceptions.
//
// Threading rule: the Python-facing methods run on the caller's (Python) thread, holding the
// GIL only while they touch Python objects; every wait on the node's io thread runs with the
// GIL released (py::gil_scoped_release). The io thread never touches Python objects.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>

#include "starling/core/blocking.hpp"
#include "starling/core/result.hpp"
#include "starling/dht/node.hpp"
#include "starling/net/host.hpp"

namespace starling::python {

namespace py = pybind11;

// Raised for C++ errors (subclass of RuntimeError); errc::invalid_argument becomes ValueError,
// errc::timeout TimeoutError.
struct StarlingError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void raise(const Error& e);
template <class T>
T unwrap(result<T> r) {
  if (!r) raise(r.error());
  return std::move(r).value();
}
inline void unwrap(result<void> r) {
  if (!r) raise(r.error());
}

// Ctrl-C while C++ waits with the GIL released: check() (called on the waiting thread, GIL
// released) runs Python's signal handlers (they run on the main thread only: Ctrl-C raises
// KeyboardInterrupt there) and keeps the exception they raised; raise_pending() re-raises it
// once the C++ call has returned (GIL held).
class SignalCheck {
 public:
  SignalCheck() = default;
  SignalCheck(const SignalCheck&) = delete;
  SignalCheck& operator=(const SignalCheck&) = delete;
  ~SignalCheck() {
    Py_XDECREF(type_);
    Py_XDECREF(value_);
    Py_XDECREF(tb_);
  }
  bool check() {
    if (type_) return true;
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return false;
    PyErr_Fetch(&type_, &value_, &tb_);
    if (!type_) type_ = Py_NewRef(PyExc_KeyboardInterrupt);
    return true;
  }
  void raise_pending() {
    if (!type_) return;
    PyErr_Restore(std::exchange(type_, nullptr), std::exchange(value_, nullptr),
                  std::exchange(tb_, nullptr));
    throw py::error_already_set();
  }
  // For block_on: the wait ends at a signal whose handler raised.
  Interrupt interrupt() {
    return Interrupt{[this] { return check(); }};
  }

 private:
  PyObject* type_ = nullptr;
  PyObject* value_ = nullptr;
  PyObject* tb_ = nullptr;
};

// One DHT node on its own io thread (host + Kademlia node). The optimizer builds its
// collaboration on the same host and node.
class Dht {
 public:
  Dht(const std::vector<std::string>& initial_peers, const std::vector<std::string>& listen,
      const std::string& identity, bool client_mode, double start_timeout);
  ~Dht();
  void shutdown();
  bool closed() const { return closed_; }
  void check_open() const;

  asio::any_io_executor executor() { return io_->executor(); }
  std::shared_ptr<net::Host> host() const { return host_; }
  std::shared_ptr<dht::DhtNode> node() const { return node_; }
  bool client_mode() const { return client_mode_; }

  std::string peer_id() const;
  std::vector<std::string> visible_maddrs() const;
  bool store(const std::string& key, const py::object& value, double expiration_time,
             const py::object& subkey);
  py::object get(const std::string& key, bool latest);

 private:
  std::unique_ptr<IoThread> io_;
  std::shared_ptr<net::Host> host_;
  std::shared_ptr<dht::DhtNode> node_;
  bool client_mode_ = false;
  bool closed_ = false;
  Duration op_timeout_ = 60s;
  SignalCheck signals_;  // Ctrl-C during get/store
};

void bind_dht(py::module_& m);
void bind_optimizer(py::module_& m);

}  // namespace starling::python
