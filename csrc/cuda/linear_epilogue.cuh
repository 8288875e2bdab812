#pragma once

// What gpuopt's decode linear kernels (decode_linear_kernels.cuh, int8_linear_kernels.cuh) do around
// their sums: a layer or RMS norm of x folded in, the bias, a ReLU and a residual added.
//
// A norm is folded, not run: its elementwise scale is in the weight (w'[n, k] = w[n, k] gamma[k]) and its
// shift in the bias (b'[n] = b[n] + sum_k w[n, k] beta[k]), so the kernel's sums are over x as it is, and
// x's row statistics (sum and sum of squares per row, in fp32) are taken by the tensor-core kernels' blocks
// from x in L1 after their matmul (block_row_stats), by the int8 SIMT kernel's warps from the values they
// convert anyway. Then
//   layer: out = rstd * (sum_k w'[n, k] x[k] - mean * norm_sum[n]) + b'[n],  norm_sum[n] = sum_k w'[n, k]
//   rms:   out = rstd * sum_k w'[n, k] x[k] + b'[n]
// with rstd = 1 / sqrt(var + eps), var the row's variance (layer) or mean square (rms): the normalized x
// is never written, and no kernel runs before the linear layer to make it.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "gpuopt/cuda.h"
#include "values.cuh"

namespace gpuopt::cuda::kernels {

enum : int { kNormNone = 0, kNormLayer = 1, kNormRms = 2 };

template <typename T>
struct LinearEpilogue {
  const T* residual = nullptr;       // [rows, n_cols], added last; nullptr: none
  const float* norm_sum = nullptr;   // [n_cols]: kNormLayer's sum_k w'[n, k]
  int norm = kNormNone;              // kNormNone, kNormLayer or kNormRms
  float eps = 0.0f;
  bool relu = false;                 // max(., 0) after the bias, before the residual
};

// Adds the 8 values of a 16-byte word of x to a row's sum and sum of squares.
template <typename T>
__device__ __forceinline__ void add_row_stats(const uint4& u, float& sum, float& squares) {
  const std::uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float2 f = unpack2(words[w], T{});
    sum += f.x + f.y;
    squares = fmaf(f.x, f.x, fmaf(f.y, f.y, squares));
  }
}

// x's row statistics for a folded norm, taken by a whole block after its matmul (x, which the matmul's loads
// brought into L1, read again): warp w's lanes add up a strided share of each row m < rows and leave the
// sum and sum of squares in slots[w * stride + m]; the caller adds up the warps' after a __syncthreads. Done
// in the matmul's loop instead, the statistics held registers there and cost it loads in flight; inlined,
// they still changed its register allocation (two of its twelve loads waited for the first MMA).
template <typename T>
__device__ __noinline__ void block_row_stats(const T* __restrict__ x, int rows, std::int64_t k, float2* slots,
                                                int stride) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const std::int64_t words = k / 8;  // 16-byte words of a row (k % 8 == 0 for every kernel that calls this)
  for (int m = 0; m < rows; ++m) {
    const auto* row = reinterpret_cast<const uint4*>(x + m * k);
    float sum = 0.0f, squares = 0.0f;
    for (std::int64_t i = threadIdx.x; i < words; i += blockDim.x) add_row_stats<T>(__ldg(row + i), sum, squares);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      sum += __shfl_xor_sync(0xffffffffu, sum, off);
      squares += __shfl_xor_sync(0xffffffffu, squares, off);
    }
    if (lane == 0) slots[warp * stride + m] = make_float2(sum, squares);
  }
}

__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// The epilogue's reads, started before the matmul so that they do not add a memory round trip after it:
// the bias, the norm's sums and the residual, after the wait for the kernel before (which may write any of
// them: an L1 line fetched earlier could be stale). One thread per line: output columns n0 .. n0 + 15 of
// `rows` rows.
template <typename T>
__device__ __forceinline__ void prefetch_constants(const void* bias, std::int64_t n0, const LinearEpilogue<T>& ep) {
  if (bias != nullptr) prefetch_l1(static_cast<const T*>(bias) + n0);
  if (ep.norm_sum != nullptr) prefetch_l1(ep.norm_sum + n0);
}
template <typename T>
__device__ __forceinline__ void prefetch_residual(int m, std::int64_t n0, std::int64_t n_cols,
                                                  const LinearEpilogue<T>& ep) {
  if (ep.residual != nullptr) prefetch_l1(ep.residual + m * n_cols + n0);
}

// out[m, n] from the linear sum y (scaled already: int8's channel scale applied), the row's statistics
// (sum, sum of squares over k values) and the bias value b.
template <typename T>
__device__ __forceinline__ T finish_linear(float y, float2 stats, std::int64_t k, float b, const LinearEpilogue<T>& ep,
                                           std::int64_t m, std::int64_t n, std::int64_t n_cols) {
  if (ep.norm != kNormNone) {
    const float inv_k = 1.0f / static_cast<float>(k);
    const float mean = ep.norm == kNormLayer ? stats.x * inv_k : 0.0f;
    const float var = fmaxf(fmaf(-mean, mean, stats.y * inv_k), 0.0f);
    const float rstd = rsqrtf(var + ep.eps);
    y = rstd * (ep.norm == kNormLayer ? fmaf(-mean, ep.norm_sum[n], y) : y);
  }
  y += b;
  if (ep.relu) y = fmaxf(y, 0.0f);
  if (ep.residual != nullptr) y += to_float(ep.residual[m * n_cols + n]);
  return from_float<T>(y);
}

// The epilogue of a launch's parameters (Int8LinearParams or DecodeLinearParams).
template <typename T, typename Params>
LinearEpilogue<T> linear_epilogue(const Params& p, bool relu) {
  static_assert(static_cast<int>(LinearNorm::kLayer) == kNormLayer && static_cast<int>(LinearNorm::kRms) == kNormRms,
                "kernels number the norms as cuda.h does");
  LinearEpilogue<T> ep;
  ep.residual = static_cast<const T*>(p.residual);
  ep.norm_sum = p.norm_sum;
  ep.norm = static_cast<int>(p.norm);
  ep.eps = p.eps;
  ep.relu = relu;
  return ep;
}

}  // namespace gpuopt::cuda::kernels
