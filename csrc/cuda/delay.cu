#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace {

__device__ __forceinline__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void delay_kernel(std::uint64_t ns) {
  const std::uint64_t start = global_ns();
  while (global_ns() - start < ns) {
    __nanosleep(500);
  }
}

}  // namespace

void delay(std::uint64_t ns, cudaStream_t stream) {
  if (ns == 0) return;
  delay_kernel<<<1, 1, 0, stream>>>(ns);
  GPUOPT_CHECK_LAUNCH();
}

}  // namespace gpuopt::cuda
