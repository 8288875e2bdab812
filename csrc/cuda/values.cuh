#pragma once

// Values of gpuopt's kernels: 16-bit and float32 elements to and from float, packed pairs unpacked.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace gpuopt::cuda::kernels {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Two packed 16-bit values of a 32-bit word as floats (the lower address first).
__device__ __forceinline__ float2 unpack2(std::uint32_t word, __half) {
  __half2 h;
  memcpy(&h, &word, sizeof(h));
  return __half22float2(h);
}
__device__ __forceinline__ float2 unpack2(std::uint32_t word, __nv_bfloat16) {
  __nv_bfloat162 h;
  memcpy(&h, &word, sizeof(h));
  return __bfloat1622float2(h);
}

}  // namespace gpuopt::cuda::kernels
