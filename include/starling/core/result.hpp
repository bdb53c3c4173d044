// starling::result<T>: Boost.Outcome result carrying a starling::Error.
#pragma once

#include <boost/outcome/basic_result.hpp>
#include <boost/outcome/policy/result_error_code_throw_as_system_error.hpp>
#include <boost/outcome/std_result.hpp>
#include <boost/outcome/try.hpp>

#include "starling/core/error.hpp"

namespace starling {

namespace outcome = boost::outcome_v2;

// value() on an error result throws std::system_error (a broken invariant, not control flow).
template <class T>
using result =
    outcome::basic_result<T, Error,
                          outcome::policy::error_code_throw_as_system_error<T, Error, void>>;

using outcome::failure;
using outcome::success;

// Makes an error result from a code and context.
template <class E>
inline Error make_error(E code, std::string context = {}) {
  return Error(code, std::move(context));
}

}  // namespace starling

// TRY helpers (one per line; __LINE__ makes the temporaries unique).
//   ST_TRY(expr);                ST_TRY(auto x, expr);       -- in functions
//   ST_CO_TRY(co_await f());     ST_CO_TRY(auto x, co_await f());   -- in coroutines
#define ST_CAT2_(a, b) a##b
#define ST_CAT_(a, b) ST_CAT2_(a, b)
#define ST_TMP_ ST_CAT_(st_try_tmp_, __LINE__)
#define ST_PICK_(_1, _2, NAME, ...) NAME
#define ST_TRYV_(ret, expr)                                \
  do {                                                     \
    auto&& st_try_v_ = (expr);                             \
    if (!st_try_v_) ret std::move(st_try_v_).as_failure(); \
  } while (0)
#define ST_TRYD_(ret, decl, expr)                    \
  auto&& ST_TMP_ = (expr);                           \
  if (!ST_TMP_) ret std::move(ST_TMP_).as_failure(); \
  decl = std::move(ST_TMP_).value()
#define ST_TRY1_(expr) ST_TRYV_(return, expr)
#define ST_TRY2_(decl, expr) ST_TRYD_(return, decl, expr)
#define ST_CO_TRY1_(expr) ST_TRYV_(co_return, expr)
#define ST_CO_TRY2_(decl, expr) ST_TRYD_(co_return, decl, expr)
#define ST_TRY(...) ST_PICK_(__VA_ARGS__, ST_TRY2_, ST_TRY1_)(__VA_ARGS__)
#define ST_CO_TRY(...) ST_PICK_(__VA_ARGS__, ST_CO_TRY2_, ST_CO_TRY1_)(__VA_ARGS__)
