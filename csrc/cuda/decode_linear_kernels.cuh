#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "int8_linear_kernels.cuh"  // mma_16816, word, from_float, to_float

namespace gpuopt::cuda::kernels {

constexpr int kLinearChunk = 32;  // K per warp step: 16 bytes (8 values) of each of a lane's two weight rows
constexpr int kLinearBatch = 4;   // chunks a lane loads before their MMAs
constexpr int kPrefetchPiece = 64 * 1024;  // bytes per bulk-prefetch instruction

// Asks the L2 for bytes [begin, end) of p (16-byte aligned, multiples of 16): a hint with no completion
// to wait for. Compute capability 9.0+ only (decode_linear_prefetches tells); a no-op below.
__device__ __forceinline__ void prefetch_l2(const char* p, std::int64_t begin, std::int64_t end) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (std::int64_t off = begin; off < end; off += kPrefetchPiece) {
    const std::int64_t left = end - off;
    const auto size = static_cast<std::uint32_t>(left < kPrefetchPiece ? left : kPrefetchPiece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + off), "r"(size) : "memory");
  }
#else
  (void)p;
  (void)begin;
  (void)end;
#endif
}

// One 32-wide chunk of K: lane (g, t) holds 8 consecutive values of weight rows g and g + 8 and of x's
// row g, at k = 8 t .. 8 t + 7 of the chunk, as two MMAs. The MMA's K positions {2t, 2t+1} and
// {2t+8, 2t+9} of step j are taken as k = 8 t + 4 j + {0, 1} and + {2, 3} (A and B agree, and the
// four lanes of a group cover the chunk's 16 values of that step), so the 16-byte words feed the MMA
// as loaded: no shuffles, no conversions.
template <typename T>
__device__ __forceinline__ void linear_mma_chunk(const uint4& wl, const uint4& wh, const uint4& xv, float (&acc)[4]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const std::uint32_t a[4] = {word(wl, 2 * j), word(wh, 2 * j), word(wl, 2 * j + 1), word(wh, 2 * j + 1)};
    mma_16816(acc, a, word(xv, 2 * j), word(xv, 2 * j + 1), T{});
  }
}

// out[m, n0 .. n0 + 15] for the block's 16 output columns: kWarps warps take K's chunks w, w + kWarps,
// ... (batches of kLinearBatch first, then one at a time) and add up in shared memory. Needs k %
// kLinearChunk == 0, 16-byte aligned x and weight, 1 <= rows <= 8; launched with kWarps * 32 threads
// and ceil(n_cols / 16) blocks. Then thread 0 prefetches the block's share of `prefetch`.
template <typename T, int kWarps, bool kRelu>  // T: __half or __nv_bfloat16
__global__ void __launch_bounds__(kWarps * 32)
    decode_linear_mma(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                      T* __restrict__ out, int rows, std::int64_t n_cols, std::int64_t k,
                      const char* __restrict__ prefetch, std::int64_t prefetch_bytes) {
  __shared__ float partial[kWarps][8][16];  // [warp][x row][output column]
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane / 4;
  const int t = lane % 4;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * 16;
  // Rows past the matrix (of the weight, or of x) read the last one instead: every load is then
  // unconditional, so a whole batch of them is in flight; what they feed is never written.
  const T* w_lo = weight + (n0 + g < n_cols ? n0 + g : n_cols - 1) * k + 8 * t;
  const T* w_hi = weight + (n0 + g + 8 < n_cols ? n0 + g + 8 : n_cols - 1) * k + 8 * t;
  const T* x_row = x + static_cast<std::int64_t>(g < rows ? g : rows - 1) * k + 8 * t;

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const std::int64_t chunks = k / kLinearChunk;
  std::int64_t c = warp;
  for (; c + (kLinearBatch - 1) * kWarps < chunks; c += kLinearBatch * kWarps) {
    uint4 wl[kLinearBatch], wh[kLinearBatch], xv[kLinearBatch];
#pragma unroll
    for (int i = 0; i < kLinearBatch; ++i) {
      const std::int64_t off = (c + i * kWarps) * kLinearChunk;
      wl[i] = __ldg(reinterpret_cast<const uint4*>(w_lo + off));
      wh[i] = __ldg(reinterpret_cast<const uint4*>(w_hi + off));
      xv[i] = __ldg(reinterpret_cast<const uint4*>(x_row + off));
    }
#pragma unroll
    for (int i = 0; i < kLinearBatch; ++i) linear_mma_chunk<T>(wl[i], wh[i], xv[i], acc);
  }
  for (; c < chunks; c += kWarps) {
    const std::int64_t off = c * kLinearChunk;
    linear_mma_chunk<T>(__ldg(reinterpret_cast<const uint4*>(w_lo + off)),
                        __ldg(reinterpret_cast<const uint4*>(w_hi + off)),
                        __ldg(reinterpret_cast<const uint4*>(x_row + off)), acc);
  }

  // D: lane (g, t) holds output columns g and g + 8 for x rows 2t and 2t + 1.
  partial[warp][2 * t][g] = acc[0];
  partial[warp][2 * t + 1][g] = acc[1];
  partial[warp][2 * t][g + 8] = acc[2];
  partial[warp][2 * t + 1][g + 8] = acc[3];
  __syncthreads();
  // One thread per (x row, output column), consecutive threads on consecutive columns.
  for (int idx = static_cast<int>(threadIdx.x); idx < 8 * 16; idx += kWarps * 32) {
    const int col = idx % 16;
    const int m = idx / 16;
    const std::int64_t n = n0 + col;
    if (m >= rows || n >= n_cols) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][m][col];
    if (bias != nullptr) sum += to_float(bias[n]);
    if (kRelu) sum = fmaxf(sum, 0.0f);
    out[static_cast<std::int64_t>(m) * n_cols + n] = from_float<T>(sum);
  }

  if (prefetch != nullptr && threadIdx.x == 0) {
    // The block's share of prefetch_bytes, in 16-byte units.
    const std::int64_t units = prefetch_bytes / 16;
    const std::int64_t share = (units + gridDim.x - 1) / gridDim.x;
    const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x) * share;
    const std::int64_t end = begin + share < units ? begin + share : units;
    if (begin < end) prefetch_l2(prefetch, 16 * begin, 16 * end);
  }
}

}  // namespace gpuopt::cuda::kernels
