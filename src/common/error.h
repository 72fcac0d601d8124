#pragma once
// Errors are values: every fallible operation returns Result<T> = std::expected<T, Error>.
// Error::code is the stable wire code (API.md); the HTTP status for each code is decided in
// exactly one place, server/http_error.cc.

#include <cerrno>
#include <expected>
#include <string>
#include <string_view>

namespace agentbox {

enum class Code {
  kInvalid,       // EINVAL       bad input
  kUnauthorized,  // EUNAUTHORIZED
  kAccess,        // EACCES       path escapes, read-only, denied
  kNotFound,      // ENOENT
  kExists,        // EEXIST
  kNotDir,        // ENOTDIR
  kIsDir,         // EISDIR
  kNotEmpty,      // ENOTEMPTY
  kTooBig,        // ETOOBIG
  kQuota,         // EQUOTA       quota, ENOSPC, EDQUOT
  kTimedOut,      // ETIMEDOUT
  kUnavailable,   // EUNAVAILABLE backend down, runner gone
  kInternal,      // EINTERNAL
  kNotSupported,  // ENOTSUP      a field, value or route this version does not do (501)
  kImage,         // EIMAGE       a bad image: digest mismatch, hostile layer (422)
  kUpstream,      // EUNAVAILABLE a service the daemon called (a registry) failed or refused (502)
};

// The wire spelling of a code ("EINVAL", ...).
std::string_view code_name(Code c);

struct [[nodiscard]] Error {
  Code code = Code::kInternal;
  int sys_errno = 0;  // the errno behind it, 0 if none
  std::string message;

  // Maps an errno to the closest Code; message names the operation, e.g. "open(/workspace/a)".
  static Error from_errno(int err, std::string_view what);
  static Error make(Code c, std::string message) { return Error{c, 0, std::move(message)}; }
};

// Maps an errno value to a Code (ENOENT->kNotFound, EROFS->kAccess, ENOSPC->kQuota, ...).
Code code_for_errno(int err);

template <typename T>
using Result = std::expected<T, Error>;
using Status = std::expected<void, Error>;

inline std::unexpected<Error> fail(Code c, std::string message) {
  return std::unexpected(Error{c, 0, std::move(message)});
}
inline std::unexpected<Error> fail_errno(int err, std::string_view what) {
  return std::unexpected(Error::from_errno(err, what));
}

[[noreturn]] void check_failed(const char* expr, const char* file, int line);

}  // namespace agentbox

// Propagating errors. AB_TRY(expr) evaluates `expr` (a Result<T> or a Status) once; on error the
// enclosing function returns that error, otherwise the expression yields the value (T, moved out
// of a temporary, copied from a named Result; nothing for a Status). The enclosing function
// returns any Result<U> or Status.
//   UniqueFd fd = AB_TRY(linux::sys::openat2(dir, name, flags, resolve));
//   AB_TRY(write_all(fd.get(), data));
// AB_CO_TRY is the same for coroutines returning an awaitable of Result<U>/Status (co_return).
// Both are GNU statement expressions (g++ and clang accept them).
#define AB_TRY(...) AB_TRY_IMPL_(AB_TRY_CAT_(ab_try_r_, __LINE__), return, __VA_ARGS__)
#define AB_CO_TRY(...) AB_TRY_IMPL_(AB_TRY_CAT_(ab_try_r_, __LINE__), co_return, __VA_ARGS__)

#define AB_TRY_CAT2_(a, b) a##b
#define AB_TRY_CAT_(a, b) AB_TRY_CAT2_(a, b)
#define AB_TRY_IMPL_(r, ret, ...)                                             \
  ({                                                                          \
    auto&& r = (__VA_ARGS__);                                                 \
    if (!r) ret ::std::unexpected(::std::forward<decltype(r)>(r).error());    \
    ::agentbox::detail::try_value(::std::forward<decltype(r)>(r));            \
  })

namespace agentbox::detail {
template <typename T>
T try_value(std::expected<T, Error>&& r) {
  return std::move(*r);
}
template <typename T>
T try_value(const std::expected<T, Error>& r) {
  return *r;
}
inline void try_value(Status&&) {}
inline void try_value(const Status&) {}
}  // namespace agentbox::detail

// Broken invariants abort with file:line. Not for input validation.
#define AB_CHECK(expr) \
  ((expr) ? static_cast<void>(0) : ::agentbox::check_failed(#expr, __FILE__, __LINE__))
