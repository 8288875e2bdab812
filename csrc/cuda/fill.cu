#include <algorithm>

#include "fill_kernels.cuh"
#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(std::int64_t work_items) {
  int device = 0;
  GPUOPT_CHECK_CUDA(cudaGetDevice(&device));
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount, device);
  const std::int64_t wanted = (work_items + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(wanted, sms * 16LL)));
}

void fill_scalar(std::uint32_t* out, std::int64_t begin, std::int64_t end, std::uint32_t seed,
                 cudaStream_t stream) {
  if (end <= begin) return;
  const auto blocks = static_cast<unsigned>((end - begin + kThreads - 1) / kThreads);
  kernels::fill_pattern_scalar<<<blocks, kThreads, 0, stream>>>(out + begin, begin, end, seed);
  GPUOPT_CHECK_LAUNCH();
}

}  // namespace

void fill_pattern(std::uint32_t* out, std::int64_t n, std::uint32_t seed, cudaStream_t stream) {
  GPUOPT_CHECK_VALUE(n >= 0, "n must be >= 0, got ", n);
  GPUOPT_CHECK_VALUE(out != nullptr || n == 0, "out must not be null");
  if (n == 0) return;
  // Scalar head up to 16-byte alignment, vectorised body, scalar tail.
  const auto addr = reinterpret_cast<std::uintptr_t>(out);
  const std::int64_t head = std::min<std::int64_t>(n, ((16 - addr % 16) % 16) / 4);
  const std::int64_t n_vec = (n - head) / 4;
  const std::int64_t tail_begin = head + n_vec * 4;
  fill_scalar(out, 0, head, seed, stream);
  if (n_vec > 0) {
    kernels::fill_pattern_vec4<<<blocks_for(n_vec), kThreads, 0, stream>>>(
        reinterpret_cast<uint4*>(out + head), n_vec, static_cast<std::uint64_t>(head), seed);
    GPUOPT_CHECK_LAUNCH();
  }
  fill_scalar(out, tail_begin, n, seed, stream);
}

}  // namespace gpuopt::cuda
