#pragma once

#include <cstdint>

#include "gpuopt/pattern.h"

namespace gpuopt::cuda::kernels {

// Grid-stride loop writing four values per thread per step as one 16-byte store.
__global__ void fill_pattern_vec4(uint4* __restrict__ out, std::int64_t n_vec, std::uint64_t base,
                                  std::uint32_t seed) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < n_vec;
       v += stride) {
    const std::uint64_t i = base + static_cast<std::uint64_t>(v) * 4;
    out[v] = make_uint4(pattern(i, seed), pattern(i + 1, seed), pattern(i + 2, seed),
                        pattern(i + 3, seed));
  }
}

// The unaligned head/tail of a buffer, one value per thread.
// `out` points at element `begin` of the buffer.
__global__ void fill_pattern_scalar(std::uint32_t* __restrict__ out, std::int64_t begin,
                                    std::int64_t end, std::uint32_t seed) {
  const std::int64_t i = begin + static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < end) out[i - begin] = pattern(static_cast<std::uint64_t>(i), seed);
}

}  // namespace gpuopt::cuda::kernels
