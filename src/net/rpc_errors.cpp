// The rpc error category and the mapping between handler errors, wire status codes and
// generic starling errc values.
#include "starling/net/rpc.hpp"

namespace starling::net {

namespace {
class RpcCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "starling.rpc"; }
  std::string message(int v) const override {
    switch (static_cast<rpc_errc>(v)) {
      case rpc_errc::ok:
        return "ok";
      case rpc_errc::cancelled:
        return "remote: cancelled";
      case rpc_errc::unknown:
        return "remote: unknown error";
      case rpc_errc::invalid_argument:
        return "remote: invalid argument";
      case rpc_errc::deadline_exceeded:
        return "remote: deadline exceeded";
      case rpc_errc::not_found:
        return "remote: not found";
      case rpc_errc::already_exists:
        return "remote: already exists";
      case rpc_errc::permission_denied:
        return "remote: permission denied";
      case rpc_errc::resource_exhausted:
        return "remote: resource exhausted";
      case rpc_errc::failed_precondition:
        return "remote: failed precondition";
      case rpc_errc::aborted:
        return "remote: aborted";
      case rpc_errc::out_of_range:
        return "remote: out of range";
      case rpc_errc::unimplemented:
        return "remote: unimplemented";
      case rpc_errc::internal:
        return "remote: internal error";
      case rpc_errc::unavailable:
        return "remote: unavailable";
    }
    return "remote: unknown status code " + std::to_string(v);
  }
};
}  // namespace

const std::error_category& rpc_category() noexcept {
  static const RpcCategory c;
  return c;
}

bool is_remote_error(const Error& e) {
  return e.code().category() == rpc_category();
}

rpc_errc to_rpc_code(const Error& e) {
  const auto& code = e.code();
  if (code.category() == rpc_category()) {
    int v = code.value();
    if (v <= 0 || v > static_cast<int>(rpc_errc::unavailable)) return rpc_errc::unknown;
    return static_cast<rpc_errc>(v);
  }
  if (code.category() != core_category()) return rpc_errc::unknown;
  switch (static_cast<errc>(code.value())) {
    case errc::ok:
      return rpc_errc::unknown;  // an "error" without a code
    case errc::invalid_argument:
      return rpc_errc::invalid_argument;
    case errc::protocol_violation:
      return rpc_errc::invalid_argument;
    case errc::timeout:
      return rpc_errc::deadline_exceeded;
    case errc::cancelled:
      return rpc_errc::cancelled;
    case errc::too_large:
      return rpc_errc::resource_exhausted;
    case errc::not_found:
      return rpc_errc::not_found;
    case errc::already_exists:
      return rpc_errc::already_exists;
    case errc::permission:
      return rpc_errc::permission_denied;
    case errc::unsupported:
      return rpc_errc::unimplemented;
    case errc::closed:
    case errc::reset:
    case errc::io:
    case errc::unavailable:
      return rpc_errc::unavailable;
    case errc::internal:
      return rpc_errc::internal;
  }
  return rpc_errc::unknown;
}

errc to_errc(rpc_errc code) {
  switch (code) {
    case rpc_errc::ok:
      return errc::ok;
    case rpc_errc::cancelled:
      return errc::cancelled;
    case rpc_errc::invalid_argument:
    case rpc_errc::failed_precondition:
    case rpc_errc::out_of_range:
      return errc::invalid_argument;
    case rpc_errc::deadline_exceeded:
      return errc::timeout;
    case rpc_errc::not_found:
      return errc::not_found;
    case rpc_errc::already_exists:
      return errc::already_exists;
    case rpc_errc::permission_denied:
      return errc::permission;
    case rpc_errc::resource_exhausted:
      return errc::too_large;
    case rpc_errc::unimplemented:
      return errc::unsupported;
    case rpc_errc::aborted:
    case rpc_errc::unavailable:
      return errc::unavailable;
    case rpc_errc::unknown:
    case rpc_errc::internal:
      return errc::internal;
  }
  return errc::internal;
}

errc generic_errc(const Error& e) {
  if (is_remote_error(e)) {
    int v = e.code().value();
    if (v < 0 || v > static_cast<int>(rpc_errc::unavailable)) return errc::internal;
    return to_errc(static_cast<rpc_errc>(v));
  }
  if (e.code().category() == core_category()) return static_cast<errc>(e.code().value());
  return errc::io;
}

}  // namespace starling::net
