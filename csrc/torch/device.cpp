#include "device.h"

#include <c10/util/Exception.h>

#ifdef GPUOPT_WITH_CUDA
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {

bool cuda_compiled() {
#ifdef GPUOPT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::string no_cuda_reason() { return GPUOPT_NO_CUDA_REASON; }

int cuda_device_count() {
#ifdef GPUOPT_WITH_CUDA
  return static_cast<int>(c10::cuda::device_count());
#else
  return 0;
#endif
}

void require_cuda(const char* what, const char* hint) {
  TORCH_CHECK_VALUE(cuda_compiled(), what, " needs CUDA, but gpuopt was built without it (",
                    no_cuda_reason(), "); rebuild with nvcc available", hint);
  TORCH_CHECK_VALUE(cuda_device_count() > 0, what,
                    " needs a CUDA device, and none is visible (torch.cuda.device_count() == 0)", hint);
}

c10::DeviceIndex checked_cuda_device(std::int64_t device, const char* what, const char* hint) {
  require_cuda(what, hint);
  const int count = cuda_device_count();
  TORCH_CHECK_INDEX(device >= 0 && device < count, what, ": device must be in [0, ", count,
                    "), got ", device);
  return static_cast<c10::DeviceIndex>(device);
}

CopyTiming time_device_copy(std::int64_t nbytes, std::int64_t reps, std::int64_t device) {
  TORCH_CHECK_VALUE(nbytes > 0, "nbytes must be > 0, got ", nbytes);
  TORCH_CHECK_VALUE(reps > 0 && reps <= 1000000, "reps must be in [1, 1e6], got ", reps);
  const c10::DeviceIndex index = checked_cuda_device(device, "time_device_copy");
  CopyTiming t;
#ifdef GPUOPT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(index);
  const auto opts = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, index);
  at::Tensor src = at::empty({nbytes}, opts);
  at::Tensor dst = at::empty({nbytes}, opts);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(index);
  const auto bytes = static_cast<std::size_t>(nbytes);
  cuda::time_copy_ms(dst.data_ptr(), src.data_ptr(), bytes, 1, stream);  // warm-up
  t.ms_per_copy = cuda::time_copy_ms(dst.data_ptr(), src.data_ptr(), bytes, static_cast<int>(reps), stream);
  t.gbps = 2.0 * static_cast<double>(nbytes) / (t.ms_per_copy * 1e-3) / 1e9;
#else
  (void)index;
#endif
  return t;
}

std::int64_t l2_cache_bytes(std::int64_t device) {
  const c10::DeviceIndex index = checked_cuda_device(device, "l2_cache_bytes");
#ifdef GPUOPT_WITH_CUDA
  return static_cast<std::int64_t>(cuda::l2_cache_bytes(index));
#else
  (void)index;
  return 0;
#endif
}

int cuda_runtime_version() {
#ifdef GPUOPT_WITH_CUDA
  return cuda::runtime_version();
#else
  return 0;
#endif
}

int cuda_driver_version() {
#ifdef GPUOPT_WITH_CUDA
  return cuda::driver_version();
#else
  return 0;
#endif
}

bool relu_activation(const char* op, const std::string& activation) {
  TORCH_CHECK_VALUE(activation == "none" || activation == "relu", op, ": activation must be 'none' or 'relu', got '",
                    activation, "'");
  return activation == "relu";
}

const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "float32";
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    case c10::kDouble: return "float64";
    case c10::kChar: return "int8";
    case c10::kByte: return "uint8";
    case c10::kInt: return "int32";
    case c10::kLong: return "int64";
    case c10::kBool: return "bool";
    default: return c10::toString(t);
  }
}

#ifdef GPUOPT_WITH_CUDA
cuda::ActivationType activation_type(c10::ScalarType t) {
  return t == c10::ScalarType::Half       ? cuda::ActivationType::kFloat16
         : t == c10::ScalarType::BFloat16 ? cuda::ActivationType::kBFloat16
                                          : cuda::ActivationType::kFloat32;
}
#endif

}  // namespace gpuopt::torch_ext
