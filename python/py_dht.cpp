// starling.DHT: a Kademlia node on its own io thread (host + DhtNode), hivemind-style API.
#include <chrono>

#include <pybind11/stl.h>

#include "py_common.hpp"
#include "starling/collab/training_node.hpp"
#include "starling/crypto/keys.hpp"

namespace starling::python {

namespace {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

Bytes to_value(const py::object& v, const char* what) {
  if (py::isinstance<py::bytes>(v) || py::isinstance<py::bytearray>(v)) {
    std::string s = py::isinstance<py::bytes>(v) ? std::string(v.cast<py::bytes>())
                                                 : std::string(v.cast<py::bytearray>());
    return to_bytes(s);
  }
  if (py::isinstance<py::str>(v)) return to_bytes(v.cast<std::string>());
  throw py::type_error(std::string(what) + " must be bytes or str, not " +
                       std::string(py::str(v.get_type().attr("__name__"))));
}

py::bytes to_py(const Bytes& b) {
  return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

py::object value_with_expiration(py::object value, double expiration) {
  auto cls = py::module_::import("starling").attr("ValueWithExpiration");
  return cls(std::move(value), expiration);
}

}  // namespace

Dht::Dht(const std::vector<std::string>& initial_peers, const std::vector<std::string>& listen,
         const std::string& identity, bool client_mode, double start_timeout)
    : client_mode_(client_mode) {
  std::vector<net::Multiaddr> peers;
  for (const auto& s : initial_peers) {
    auto a = net::Multiaddr::parse(s);
    if (!a) raise(a.error().with_context("initial peer " + s));
    peers.push_back(std::move(a).value());
  }
  crypto::KeyPair key = identity.empty() ? crypto::KeyPair::generate()
                                         : unwrap(crypto::load_or_create_identity(identity));
  const auto timeout = std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>(start_timeout > 0 ? start_timeout : 60.0));
  py::gil_scoped_release nogil;
  io_ = std::make_unique<IoThread>("starling-py-io");
  net::HostConfig hc;
  hc.listen = client_mode ? std::vector<std::string>{} : listen;
  hc.shutdown_timeout = 3s;
  host_ = net::Host::create(io_->executor(), std::move(key), hc);
  auto host = host_;
  auto started = block_on(
      io_->executor(), [host] { return host->start(); }, timeout);
  if (!started) {
    (void)io_->stop(2s);
    py::gil_scoped_acquire gil;
    raise(started.error().with_context("starting the host"));
  }
  auto cfg = collab::TrainingNodeConfig::default_dht();
  cfg.dht.client_mode = client_mode;
  node_ = dht::DhtNode::create(host_, cfg);
  auto node = node_;
  auto joined = block_on(
      io_->executor(), [node, peers] { return node->start(peers); }, timeout);
  if (!joined) {
    shutdown();
    py::gil_scoped_acquire gil;
    raise(joined.error().with_context("joining the DHT"));
  }
}

Dht::~Dht() {
  py::gil_scoped_release nogil;
  shutdown();
}

void Dht::shutdown() {
  if (closed_) return;
  closed_ = true;
  auto node = node_;
  auto host = host_;
  (void)block_on(
      io_->executor(),
      [node, host]() -> awaitable<result<void>> {
        if (node) co_await node->stop();
        if (host) co_await host->stop();
        co_return success();
      },
      10s);
  (void)io_->stop(2s);
}

void Dht::check_open() const {
  if (closed_) throw StarlingError("the DHT is shut down");
}

std::string Dht::peer_id() const {
  return host_->local_peer().to_string();
}

std::vector<std::string> Dht::visible_maddrs() const {
  check_open();
  std::vector<std::string> out;
  for (const auto& a : host_->announce_addresses())
    out.push_back(a.with_peer_id(host_->local_peer()).to_string());
  return out;
}

bool Dht::store(const std::string& key, const py::object& value, double expiration_time,
                const py::object& subkey) {
  check_open();
  Bytes v = to_value(value, "value");
  std::optional<dht::SubKey> sk;
  if (!subkey.is_none()) sk = dht::SubKey(to_value(subkey, "subkey"));
  const double ttl_s = expiration_time - now_seconds();
  if (ttl_s <= 0) return false;
  const auto ttl = dht::Millis(std::max<std::int64_t>(1, static_cast<std::int64_t>(ttl_s * 1e3)));
  auto node = node_;
  auto k = dht::RecordKey::from_string(key);
  result<dht::Stored> r = make_error(errc::internal, "unset");
  {
    py::gil_scoped_release nogil;
    r = block_on(
        io_->executor(),
        [node, k, sk, v, ttl]() -> awaitable<result<dht::Stored>> {
          if (sk) co_return co_await node->store(k, *sk, v, ttl);
          co_return co_await node->store(k, v, ttl);
        },
        op_timeout_, 2s, signals_.interrupt());
  }
  signals_.raise_pending();
  auto stored = unwrap(std::move(r));
  return stored.replicas > 0;
}

py::object Dht::get(const std::string& key, bool latest) {
  check_open();
  auto node = node_;
  auto k = dht::RecordKey::from_string(key);
  result<std::optional<dht::Found>> r = make_error(errc::internal, "unset");
  {
    py::gil_scoped_release nogil;
    r = block_on(
        io_->executor(), [node, k, latest] { return node->get(k, latest); }, op_timeout_, 2s,
        signals_.interrupt());
  }
  signals_.raise_pending();
  auto found = unwrap(std::move(r));
  if (!found) return py::none();
  const double now = now_seconds();
  auto expiry = [now](const dht::Value& v) {
    return now + std::chrono::duration<double>(v.ttl).count();
  };
  if (found->plain) return value_with_expiration(to_py(found->plain->value), expiry(*found->plain));
  py::dict d;
  double latest_expiry = 0;
  for (const auto& [sk, v] : found->dictionary) {
    d[to_py(sk.raw())] = value_with_expiration(to_py(v.value), expiry(v));
    latest_expiry = std::max(latest_expiry, expiry(v));
  }
  return value_with_expiration(d, latest_expiry);
}

void bind_dht(py::module_& m) {
  m.attr("ValueWithExpiration") =
      py::module_::import("collections")
          .attr("namedtuple")("ValueWithExpiration", "value expiration_time");
  m.def("get_dht_time", &now_seconds, "Current DHT time (seconds since the epoch).");
  py::class_<Dht, std::shared_ptr<Dht>>(m, "DHT", R"doc(
A Starling DHT node running on its own io thread.

DHT(initial_peers=[], listen=["/ip4/0.0.0.0/tcp/0"], identity=None, client_mode=False,
    start_timeout=60.0)
initial_peers: multiaddrs of nodes to join through (none: the first node of a network).
identity: path of an identity file (created if missing); None: a fresh key.
client_mode: accept no incoming connections (behind a NAT).)doc")
      .def(py::init([](std::vector<std::string> initial_peers, std::vector<std::string> listen,
                       py::object identity, bool client_mode, double start_timeout, bool start) {
             if (!start) throw py::value_error("DHT(start=False) is not supported: it starts");
             std::string id =
                 identity.is_none() ? std::string() : py::str(identity).cast<std::string>();
             return std::make_shared<Dht>(initial_peers, listen, id, client_mode, start_timeout);
           }),
           py::arg("initial_peers") = std::vector<std::string>{},
           py::arg("listen") = std::vector<std::string>{"/ip4/0.0.0.0/tcp/0"},
           py::arg("identity") = py::none(), py::arg("client_mode") = false,
           py::arg("start_timeout") = 60.0, py::arg("start") = true)
      .def_property_readonly("peer_id", &Dht::peer_id)
      .def("get_visible_maddrs", &Dht::visible_maddrs)
      .def_property_readonly("visible_maddrs", &Dht::visible_maddrs)
      .def_property_readonly("client_mode", &Dht::client_mode)
      .def_property_readonly("is_alive", [](const Dht& d) { return !d.closed(); })
      .def("store", &Dht::store, py::arg("key"), py::arg("value"), py::arg("expiration_time"),
           py::arg("subkey") = py::none(),
           "Stores value (bytes or str) under key (and subkey) until expiration_time (DHT "
           "time). True if at least one node holds it.")
      .def("get", &Dht::get, py::arg("key"), py::arg("latest") = false,
           "ValueWithExpiration(value, expiration_time) or None; with sub-keys, value is a "
           "dict {subkey: ValueWithExpiration}.")
      .def("shutdown",
           [](Dht& d) {
             py::gil_scoped_release nogil;
             d.shutdown();
           })
      .def("__enter__", [](std::shared_ptr<Dht> d) { return d; })
      .def("__exit__", [](Dht& d, py::args) {
        py::gil_scoped_release nogil;
        d.shutdown();
      });
}

}  // namespace starling::python
