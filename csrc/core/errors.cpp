#include "gpuopt/errors.h"

namespace gpuopt::detail {

void fail(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

}  // namespace gpuopt::detail
