// LibTorch adapter for device facts and the small CUDA utilities: validates user input with
// TORCH_CHECK_* and hands raw pointers and torch's current stream to the CUDA layer.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#ifdef GPUOPT_WITH_CUDA
#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {

bool cuda_compiled();
// Why CUDA was not compiled ("" when it was).
std::string no_cuda_reason();
// Visible CUDA devices; 0 when CUDA was not compiled or no device is present.
int cuda_device_count();
// Throws a ValueError naming `what` when no CUDA device can be used; `hint` says what to do instead.
void require_cuda(const char* what, const char* hint = "");
// The index of CUDA device `device`, an argument of `what`: require_cuda(what, hint), then an
// IndexError naming `what`, the value and the allowed range unless 0 <= device < device count.
c10::DeviceIndex checked_cuda_device(std::int64_t device, const char* what, const char* hint = "");

struct CopyTiming {
  double ms_per_copy = 0;
  double gbps = 0;  // bytes read + bytes written per second, 1e9
};
// Times `reps` device-to-device copies of `nbytes` with CUDA events on the current stream.
CopyTiming time_device_copy(std::int64_t nbytes, std::int64_t reps, std::int64_t device);

std::int64_t l2_cache_bytes(std::int64_t device);

// A dtype as torch names it in Python (float16, bfloat16, int8, ...), for error messages.
const char* dtype_name(c10::ScalarType t);
int cuda_runtime_version();
int cuda_driver_version();

// Whether `activation`, an argument of operator `op`, is "relu" (else "none"); a ValueError naming the
// operator and the value for anything else.
bool relu_activation(const char* op, const std::string& activation);

#ifdef GPUOPT_WITH_CUDA
// The CUDA layer's type for a float16, bfloat16 or float32 tensor (anything else: float32; the
// operators check their dtypes first).
cuda::ActivationType activation_type(c10::ScalarType t);
#endif

}  // namespace gpuopt::torch_ext
