// Errors of the gpuopt core. Every check names the argument, the value seen and what is allowed; the
// Python layer maps the kind onto ValueError / TypeError / IndexError / RuntimeError.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace gpuopt {

enum class ErrorKind { kValue, kType, kIndex, kRuntime };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
// Out of line so that a check costs one branch in hot loops.
[[noreturn]] void fail(ErrorKind kind, const std::string& message);
}  // namespace detail

}  // namespace gpuopt

#define GPUOPT_CHECK_KIND_(kind, cond, ...)                                                    \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      ::gpuopt::detail::fail(kind, ::gpuopt::detail::cat(__VA_ARGS__));                        \
    }                                                                                          \
  } while (0)

// Internal invariants and environment failures -> RuntimeError.
#define GPUOPT_CHECK(cond, ...) GPUOPT_CHECK_KIND_(::gpuopt::ErrorKind::kRuntime, cond, __VA_ARGS__)
// User-supplied values -> ValueError / TypeError / IndexError.
#define GPUOPT_CHECK_VALUE(cond, ...) GPUOPT_CHECK_KIND_(::gpuopt::ErrorKind::kValue, cond, __VA_ARGS__)
#define GPUOPT_CHECK_TYPE(cond, ...) GPUOPT_CHECK_KIND_(::gpuopt::ErrorKind::kType, cond, __VA_ARGS__)
#define GPUOPT_CHECK_INDEX(cond, ...) GPUOPT_CHECK_KIND_(::gpuopt::ErrorKind::kIndex, cond, __VA_ARGS__)
