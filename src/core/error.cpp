#include "starling/core/error.hpp"

#include <stdexcept>

namespace starling {

std::string Error::message() const {
  if (context_.empty()) return code_.message();
  return context_ + ": " + code_.message();
}

Error Error::with_context(const std::string& outer) const {
  return Error(code_, context_.empty() ? outer : outer + ": " + context_);
}

void outcome_throw_as_system_error_with_payload(const Error& e) {
  throw std::system_error(e.code(), e.context());
}

namespace {
class CoreCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "starling"; }
  std::string message(int v) const override {
    switch (static_cast<errc>(v)) {
      case errc::ok:
        return "ok";
      case errc::invalid_argument:
        return "invalid argument";
      case errc::timeout:
        return "timed out";
      case errc::cancelled:
        return "cancelled";
      case errc::closed:
        return "closed by peer";
      case errc::reset:
        return "reset";
      case errc::too_large:
        return "too large";
      case errc::protocol_violation:
        return "protocol violation";
      case errc::not_found:
        return "not found";
      case errc::unavailable:
        return "unavailable";
      case errc::io:
        return "I/O error";
      case errc::permission:
        return "bad permissions";
      case errc::unsupported:
        return "unsupported";
      case errc::already_exists:
        return "already exists";
      case errc::internal:
        return "internal error";
    }
    return "unknown starling error";
  }
};
}  // namespace

const std::error_category& core_category() noexcept {
  static const CoreCategory c;
  return c;
}

}  // namespace starling
