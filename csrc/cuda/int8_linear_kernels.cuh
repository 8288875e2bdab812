#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace gpuopt::cuda::kernels {

constexpr int kInt8LinearWarps = 8;  // output columns per block, one per warp

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

// 16 consecutive values from a 16-byte aligned address, as floats.
__device__ __forceinline__ void load16(const float* p, float (&v)[16]) {
  const auto* q = reinterpret_cast<const float4*>(p);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 f = q[i];
    v[4 * i + 0] = f.x;
    v[4 * i + 1] = f.y;
    v[4 * i + 2] = f.z;
    v[4 * i + 3] = f.w;
  }
}

template <typename T>  // __half or __nv_bfloat16
__device__ __forceinline__ void load16(const T* p, float (&v)[16]) {
  const auto* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint4 u = q[i];
    const std::uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = unpack2(words[j], T{});
      v[8 * i + 2 * j] = f.x;
      v[8 * i + 2 * j + 1] = f.y;
    }
  }
}

// The 16 int8 values of a 16-byte word (the lower address first), as floats.
__device__ __forceinline__ void unpack_int8(const uint4 u, float (&w)[16]) {
  const std::uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      w[4 * i + b] = static_cast<float>(static_cast<std::int8_t>((words[i] >> (8 * b)) & 0xffu));
    }
  }
}

// out[m, n] = (sum_k x[m, k] * weight[n, k]) * scale[n] + bias[n] for m < rows <= kRows.
// One warp per output column n: its lanes stride over weight row n 16 int8 at a time (one 16-byte
// load per lane per step, 512 bytes per warp), multiply with the matching 16 values of every row of
// x (small, served from L1/L2), accumulate in fp32, then reduce across the warp with shuffles.
// Needs k % 16 == 0 and 16-byte aligned x and weight (int8_linear_supported checks).
template <typename T, int kRows>
__global__ void __launch_bounds__(kInt8LinearWarps * 32)
    int8_linear(const T* __restrict__ x, const std::int8_t* __restrict__ weight,
                const void* __restrict__ scales, bool scales_fp32, const T* __restrict__ bias,
                T* __restrict__ out, int rows, std::int64_t n_cols, std::int64_t k) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t n =
      static_cast<std::int64_t>(blockIdx.x) * kInt8LinearWarps + static_cast<int>(threadIdx.x / 32);
  if (n >= n_cols) return;  // n is the same for every lane of a warp: whole warps leave

  const std::int8_t* w_row = weight + n * k;
  float acc[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) acc[m] = 0.0f;

  // Unrolled so that several 16-byte weight loads per lane are in flight at once: a decode step's
  // matrices give only a few hundred blocks, so latency, not occupancy, has to be hidden.
#pragma unroll 4
  for (std::int64_t k0 = static_cast<std::int64_t>(lane) * 16; k0 < k; k0 += 32 * 16) {
    float w[16];
    unpack_int8(__ldg(reinterpret_cast<const uint4*>(w_row + k0)), w);
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      if (m < rows) {
        float xv[16];
        load16(x + m * k + k0, xv);
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; ++j) s = fmaf(xv[j], w[j], s);
        acc[m] += s;
      }
    }
  }

#pragma unroll
  for (int m = 0; m < kRows; ++m) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], offset);
    }
  }

  if (lane == 0) {
    const float scale = scales_fp32 ? static_cast<const float*>(scales)[n]
                                    : to_float(static_cast<const T*>(scales)[n]);
    const float b = bias != nullptr ? to_float(bias[n]) : 0.0f;
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      if (m < rows) out[m * n_cols + n] = from_float<T>(acc[m] * scale + b);
    }
  }
}

}  // namespace gpuopt::cuda::kernels
