// Errors: a std::error_code (one category per module) plus human context
// (peer, operation, cause). Carried by starling::result<T>.
#pragma once

#include <string>
#include <system_error>
#include <utility>

namespace starling {

// An error with context. `code` is what programs branch on; `context` is what people read
// ("dial 12D3KooW... at /ip4/1.2.3.4/tcp/4001"). message() joins both.
class Error {
 public:
  Error() = default;
  Error(std::error_code code) : code_(code) {}  // NOLINT(implicit): lets errc convert
  Error(std::error_code code, std::string context) : code_(code), context_(std::move(context)) {}
  template <class E, class = std::enable_if_t<std::is_error_code_enum_v<E>>>
  Error(E e) : code_(make_error_code(e)) {}  // NOLINT(implicit)
  template <class E, class = std::enable_if_t<std::is_error_code_enum_v<E>>>
  Error(E e, std::string context) : code_(make_error_code(e)), context_(std::move(context)) {}

  const std::error_code& code() const noexcept { return code_; }
  const std::string& context() const noexcept { return context_; }
  std::string message() const;

  // Returns a copy with `outer` prepended to the context ("outer: inner").
  Error with_context(const std::string& outer) const;

  friend bool operator==(const Error& a, const Error& b) noexcept { return a.code_ == b.code_; }
  template <class E, class = std::enable_if_t<std::is_error_code_enum_v<E>>>
  friend bool operator==(const Error& a, E e) noexcept {
    return a.code_ == make_error_code(e);
  }

 private:
  std::error_code code_;
  std::string context_;
};

// ADL hooks so Boost.Outcome treats Error like an error_code.
inline std::error_code make_error_code(const Error& e) noexcept {
  return e.code();
}
[[noreturn]] void outcome_throw_as_system_error_with_payload(const Error& e);

// Generic errors shared by every module.
enum class errc {
  ok = 0,
  invalid_argument = 1,  // malformed input (a parser rejected it)
  timeout,               // a deadline passed
  cancelled,             // the operation was cancelled (shutdown, caller)
  closed,                // the other side closed / end of stream
  reset,                 // the stream or connection was reset
  too_large,             // a message or value exceeds its limit
  protocol_violation,    // the peer broke the protocol
  not_found,
  unavailable,  // no peer / resource could serve the request
  io,           // an OS-level I/O error (see context)
  permission,   // a file has the wrong permissions
  unsupported,
  already_exists,
  internal,
};
const std::error_category& core_category() noexcept;
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), core_category()};
}

}  // namespace starling

template <>
struct std::is_error_code_enum<starling::errc> : std::true_type {};
