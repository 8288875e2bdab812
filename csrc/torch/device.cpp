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

namespace {
// Validated device index; raises unless CUDA is usable.
c10::DeviceIndex checked_device(std::int64_t device, const char* what) {
  require_cuda(what);
  TORCH_CHECK_INDEX(device >= 0 && device < cuda_device_count(), "device must be in [0, ",
                    cuda_device_count(), "), got ", device);
  return static_cast<c10::DeviceIndex>(device);
}
}  // namespace

void fill_pattern(const at::Tensor& out, std::int64_t seed) {
  TORCH_CHECK_VALUE(seed >= 0 && seed <= 0xffffffffLL, "seed must be in [0, 2^32), got ", seed);
  TORCH_CHECK_TYPE(out.scalar_type() == at::kInt, "out must be int32, got ", out.scalar_type());
  TORCH_CHECK_VALUE(out.is_contiguous(), "out must be contiguous");
  TORCH_CHECK_VALUE(out.is_cuda(), "out must be a CUDA tensor, got device ", out.device());
#ifdef GPUOPT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(out.device());
  cuda::fill_pattern(reinterpret_cast<std::uint32_t*>(out.data_ptr<int>()), out.numel(),
                     static_cast<std::uint32_t>(seed), c10::cuda::getCurrentCUDAStream());
#endif
}

CopyTiming time_device_copy(std::int64_t nbytes, std::int64_t reps, std::int64_t device) {
  TORCH_CHECK_VALUE(nbytes > 0, "nbytes must be > 0, got ", nbytes);
  TORCH_CHECK_VALUE(reps > 0 && reps <= 1000000, "reps must be in [1, 1e6], got ", reps);
  const c10::DeviceIndex index = checked_device(device, "time_device_copy");
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
  const c10::DeviceIndex index = checked_device(device, "l2_cache_bytes");
#ifdef GPUOPT_WITH_CUDA
  return cuda::device_attribute(cudaDevAttrL2CacheSize, index);
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

}  // namespace gpuopt::torch_ext
