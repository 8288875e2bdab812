#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#include "int8_linear_kernels.cuh"  // to_float, load16

namespace gpuopt::cuda::kernels {

constexpr int kQuantizeThreads = 256;

// One value in the quantized type's byte, given x * (qmax / amax).
__device__ __forceinline__ std::uint8_t quantize_one(float v, bool fp8) {
  if (fp8) return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
  const int i = max(-127, min(127, __float2int_rn(v)));
  return static_cast<std::uint8_t>(static_cast<std::int8_t>(i));
}

// 16 values times inv in the quantized type's bytes (fp8: two at a time, the packed conversion).
__device__ __forceinline__ void quantize16(const float (&v)[16], float inv, bool fp8, std::uint8_t* out) {
  alignas(16) std::uint8_t b[16];
  if (fp8) {
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const __nv_fp8x2_storage_t two =
          __nv_cvt_float2_to_fp8x2(make_float2(v[i] * inv, v[i + 1] * inv), __NV_SATFINITE, __NV_E4M3);
      std::memcpy(b + i, &two, sizeof(two));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) b[i] = quantize_one(v[i] * inv, false);
  }
  *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(b);
}

// The block's maximum of `v` (every thread gets it; blockDim.x a multiple of 32, at most kQuantizeThreads).
__device__ __forceinline__ float block_max(float v) {
  __shared__ float warp_max[kQuantizeThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? warp_max[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The block's sum of `v` (every thread gets it); may be called again right after.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sum[kQuantizeThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  __syncthreads();  // an earlier call's reads of warp_sum are done
  if (lane == 0) warp_sum[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? warp_sum[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// What is applied to x before the absmax (QuantizeRowsParams): norm 0 none, 1 layer, 2 rms, with an
// optional float32 weight and bias per column; then activation (QuantizeActivation's order).
struct Prologue {
  int norm = 0;
  const float* weight = nullptr;
  const float* bias = nullptr;
  float eps = 1e-5f;
  int activation = 0;
  void* y = nullptr;  // the prologue's output in x's type, or nullptr
  __device__ __forceinline__ bool any() const { return norm != 0 || activation != 0; }
};

// GELU, x * Phi(x), with erfc from Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7): Phi(x) =
// erfc(-x / sqrt(2)) / 2 taken directly on either side, so the negative tail keeps its relative accuracy
// (no 1 + erf cancellation). A third of erff's instructions: a GELU folded into a quantization is bound by
// the arithmetic (ViT-B/16's 3072-wide rows: 368 us with erff, where the quantization alone is 166 us).
__device__ __forceinline__ float gelu_erf(float v) {
  const float a = fabsf(v) * 0.70710678118654752f;
  const float t = __fdividef(1.0f, fmaf(0.3275911f, a, 1.0f));
  const float p = fmaf(fmaf(fmaf(fmaf(1.061405429f, t, -1.453152027f), t, 1.421413741f), t, -0.284496736f), t,
                       0.254829592f) * t;
  const float half_erfc = 0.5f * p * __expf(-a * a);  // erfc(|x| / sqrt(2)) / 2
  return v * (v < 0.0f ? half_erfc : 1.0f - half_erfc);
}

__device__ __forceinline__ float activate(float v, int activation) {
  switch (activation) {
    case 1: return gelu_erf(v);
    // 0.5 x (1 + tanh(u)) == x * sigmoid(2u): no cancellation for negative u
    case 2: return v / (1.0f + __expf(-1.5957691216057308f * (v + 0.044715f * v * v * v)));
    case 3: return v < 0.0f ? 0.0f : v;  // NaN stays NaN, as torch.relu
    case 4: return v / (1.0f + __expf(-v));
    default: return v;
  }
}

// 16 values rounded to T, stored at 16-byte aligned p.
template <typename T>
__device__ __forceinline__ void store16(T* p, const float (&v)[16]) {
  alignas(16) T out[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) out[i] = from_float<T>(v[i]);
#pragma unroll
  for (int j = 0; j < static_cast<int>(sizeof(out) / 16); ++j) {
    reinterpret_cast<uint4*>(p)[j] = reinterpret_cast<const uint4*>(out)[j];
  }
}

// 16 float32 values from 16-byte aligned p.
__device__ __forceinline__ void load16f(const float* p, float (&out)[16]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(p) + j);
    out[4 * j] = f.x;
    out[4 * j + 1] = f.y;
    out[4 * j + 2] = f.z;
    out[4 * j + 3] = f.w;
  }
}

template <int kAct, int kVecs>
__device__ __forceinline__ void activate_all(float (&v)[kVecs][16], const std::int64_t (&at)[kVecs]) {
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    if (at[c] >= 0) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[c][i] = activate(v[c][i], kAct);
    }
  }
}

// The prologue over a thread's chunks of one row: v[c][0..15] hold columns at[c].. (at[c] < 0: no chunk);
// `reduce` sums a value over the row's threads. Each step loops over all values with its kind fixed (no
// per-value branch); the norm's weight and bias (16-byte aligned, checked at launch) in float4 loads.
template <int kVecs, typename Reduce>
__device__ __forceinline__ void apply_prologue(float (&v)[kVecs][16], const std::int64_t (&at)[kVecs], std::int64_t k,
                                               const Prologue& pro, Reduce reduce) {
  if (pro.norm != 0) {
    float mean = 0.0f;
    if (pro.norm == 1) {
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < kVecs; ++c) {
        if (at[c] >= 0) {
#pragma unroll
          for (int i = 0; i < 16; ++i) s += v[c][i];
        }
      }
      mean = reduce(s) / static_cast<float>(k);
    }
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < kVecs; ++c) {
      if (at[c] >= 0) {
#pragma unroll
        for (int i = 0; i < 16; ++i) ss += (v[c][i] - mean) * (v[c][i] - mean);
      }
    }
    const float rstd = rsqrtf(reduce(ss) / static_cast<float>(k) + pro.eps);
#pragma unroll
    for (int c = 0; c < kVecs; ++c) {
      if (at[c] >= 0) {
#pragma unroll
        for (int i = 0; i < 16; ++i) v[c][i] = (v[c][i] - mean) * rstd;
        if (pro.weight != nullptr) {
          float w[16];
          load16f(pro.weight + at[c], w);
#pragma unroll
          for (int i = 0; i < 16; ++i) v[c][i] *= w[i];
        }
        if (pro.bias != nullptr) {
          float b[16];
          load16f(pro.bias + at[c], b);
#pragma unroll
          for (int i = 0; i < 16; ++i) v[c][i] += b[i];
        }
      }
    }
  }
  switch (pro.activation) {
    case 1: activate_all<1>(v, at); break;
    case 2: activate_all<2>(v, at); break;
    case 3: activate_all<3>(v, at); break;
    case 4: activate_all<4>(v, at); break;
    default: break;
  }
}

// x's value at column `col` through the prologue, given the row's mean (0 for rms) and 1 / std (rms).
__device__ __forceinline__ float prologue_value(float v, std::int64_t col, const Prologue& p, float mean,
                                                float rstd) {
  if (p.norm != 0) {
    v = (v - mean) * rstd;
    if (p.weight != nullptr) v *= __ldg(p.weight + col);
    if (p.bias != nullptr) v += __ldg(p.bias + col);
  }
  return activate(v, p.activation);
}

// 1 / scale, and the scale written once. A row of zeros (or so small that qmax / amax overflows) gets
// inverse 0: its values quantize to 0.
__device__ __forceinline__ float row_scale(float amax, float qmax) { return amax > 0.0f ? amax / qmax : 1.0f; }
__device__ __forceinline__ float row_inverse(float amax, float qmax) {
  const float inv = amax > 0.0f ? qmax / amax : 0.0f;
  return isfinite(inv) ? inv : 0.0f;
}
__device__ __forceinline__ float inverse_scale(float amax, float qmax, float* scale_out) {
  if (threadIdx.x == 0) *scale_out = row_scale(amax, qmax);
  return row_inverse(amax, qmax);
}

// A row held in registers: kVecs chunks of 16 values per thread (k % 16 == 0, 16-byte aligned x), blockDim.x
// threads (a multiple of 32, at most kQuantizeThreads: as many as the row needs, so none idles).
template <typename T, int kVecs>
__global__ void __launch_bounds__(kQuantizeThreads) quantize_rows_held(const T* __restrict__ x,
                                                                       std::uint8_t* __restrict__ q,
                                                                       float* __restrict__ scales,
                                                                       std::int64_t k, float qmax, bool fp8,
                                                                       Prologue pro) {
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * k;
  std::uint8_t* qr = q + row * k;
  float v[kVecs][16];
  std::int64_t at[kVecs];
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    const std::int64_t col = (static_cast<std::int64_t>(c) * blockDim.x + threadIdx.x) * 16;
    at[c] = col < k ? col : -1;
    if (at[c] >= 0) load16(xr + col, v[c]);
  }
  if (pro.any()) apply_prologue(v, at, k, pro, [](float s) { return block_sum(s); });
  if (pro.y != nullptr) {
#pragma unroll
    for (int c = 0; c < kVecs; ++c) {
      if (at[c] >= 0) store16(static_cast<T*>(pro.y) + row * k + at[c], v[c]);
    }
  }
  float amax = 0.0f;
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    if (at[c] >= 0) {
#pragma unroll
      for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[c][i]));
    }
  }
  const float inv = inverse_scale(block_max(amax), qmax, scales + row);
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    if (at[c] >= 0) quantize16(v[c], inv, fp8, qr + at[c]);
  }
}

// Short rows: kGroup threads per row (kGroup divides 32, so a row's threads sit in one warp and reduce
// by shuffles), kQuantizeThreads / kGroup rows per block, kVecs chunks of 16 values per thread. One block
// per row would leave most of its threads idle on the 768-wide rows of a BERT-base (48 chunks for 256).
template <int kGroup>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = kGroup / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T, int kGroup, int kVecs>
__global__ void __launch_bounds__(kQuantizeThreads) quantize_rows_grouped(const T* __restrict__ x,
                                                                          std::uint8_t* __restrict__ q,
                                                                          float* __restrict__ scales,
                                                                          std::int64_t rows, std::int64_t k,
                                                                          float qmax, bool fp8, Prologue pro) {
  static_assert(kGroup >= 1 && kGroup <= 32 && (32 % kGroup) == 0, "a row's threads must sit in one warp");
  constexpr int kRowsPerBlock = kQuantizeThreads / kGroup;
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kGroup;
  const bool live = row < rows;  // the threads past the last row still take part in the shuffles
  const T* xr = x + (live ? row : 0) * k;
  std::uint8_t* qr = q + (live ? row : 0) * k;
  float v[kVecs][16];
  std::int64_t at[kVecs];
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    const std::int64_t col = (static_cast<std::int64_t>(c) * kGroup + lane) * 16;
    at[c] = live && col < k ? col : -1;
    if (at[c] >= 0) load16(xr + col, v[c]);
  }
  if (pro.any()) apply_prologue(v, at, k, pro, [](float s) { return group_sum<kGroup>(s); });
  if (pro.y != nullptr) {
#pragma unroll
    for (int c = 0; c < kVecs; ++c) {
      if (at[c] >= 0) store16(static_cast<T*>(pro.y) + row * k + at[c], v[c]);
    }
  }
  float amax = 0.0f;
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    if (at[c] >= 0) {
#pragma unroll
      for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[c][i]));
    }
  }
#pragma unroll
  for (int o = kGroup / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (!live) return;
  const float inv = row_inverse(amax, qmax);
  if (lane == 0) scales[row] = row_scale(amax, qmax);
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    if (at[c] >= 0) quantize16(v[c], inv, fp8, qr + at[c]);
  }
}

// Any row: read again for each pass (mostly from L2), one value at a time.
template <typename T>
__global__ void __launch_bounds__(kQuantizeThreads) quantize_rows_any(const T* __restrict__ x,
                                                                      std::uint8_t* __restrict__ q,
                                                                      float* __restrict__ scales,
                                                                      std::int64_t k, float qmax, bool fp8,
                                                                      Prologue pro) {
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * k;
  std::uint8_t* qr = q + row * k;
  float mean = 0.0f, rstd = 1.0f;
  if (pro.norm != 0) {
    if (pro.norm == 1) {
      float s = 0.0f;
      for (std::int64_t i = threadIdx.x; i < k; i += kQuantizeThreads) s += to_float(xr[i]);
      mean = block_sum(s) / static_cast<float>(k);
    }
    float ss = 0.0f;
    for (std::int64_t i = threadIdx.x; i < k; i += kQuantizeThreads) {
      const float d = to_float(xr[i]) - mean;
      ss += d * d;
    }
    rstd = rsqrtf(block_sum(ss) / static_cast<float>(k) + pro.eps);
  }
  const bool any = pro.any();
  float amax = 0.0f;
  for (std::int64_t i = threadIdx.x; i < k; i += kQuantizeThreads) {
    const float v = to_float(xr[i]);
    amax = fmaxf(amax, fabsf(any ? prologue_value(v, i, pro, mean, rstd) : v));
  }
  const float inv = inverse_scale(block_max(amax), qmax, scales + row);
  T* yr = pro.y != nullptr ? static_cast<T*>(pro.y) + row * k : nullptr;
  for (std::int64_t i = threadIdx.x; i < k; i += kQuantizeThreads) {
    const float v = to_float(xr[i]);
    const float y = any ? prologue_value(v, i, pro, mean, rstd) : v;
    qr[i] = quantize_one(y * inv, fp8);
    if (yr != nullptr) yr[i] = from_float<T>(y);
  }
}

}  // namespace gpuopt::cuda::kernels
