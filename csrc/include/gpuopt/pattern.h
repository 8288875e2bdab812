// gpuopt's checkable fill pattern: element i of a buffer filled with `seed` holds pattern(i, seed),
// a cheap integer hash. One definition for the CUDA kernel and the host (the CPU operator), so a
// device result can be checked exactly.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define GPUOPT_HOST_DEVICE __host__ __device__
#else
#define GPUOPT_HOST_DEVICE
#endif

namespace gpuopt {

// lowbias32 (Chris Wellons): a full-avalanche 32-bit integer hash.
GPUOPT_HOST_DEVICE inline std::uint32_t hash32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

GPUOPT_HOST_DEVICE inline std::uint32_t pattern(std::uint64_t i, std::uint32_t seed) {
  return hash32(static_cast<std::uint32_t>(i) ^ hash32(seed ^ static_cast<std::uint32_t>(i >> 32)));
}

}  // namespace gpuopt
