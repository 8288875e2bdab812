#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "int8_linear_kernels.cuh"  // mma_16816, word
#include "linear_epilogue.cuh"
#include "pdl.cuh"

namespace gpuopt::cuda::kernels {

constexpr int kLinearChunk = 32;  // K per warp step and uint4 per row: 8 values of each of a lane's two weight rows
constexpr int kLinearLoads = 4;   // uint4 of each weight row a lane loads before their MMAs (kVec per chunk)
static_assert(kLinearLoads % 4 == 0, "a batch holds whole chunks of 1, 2 or 4 loads");

// 8 consecutive values of weight rows g and g + 8 and of x's row g, at k = k0 + 0..7 for lane (g, t) with k0
// = chunk * 32 kVec + 8 kVec t + 8 v (v over the lane's kVec words of the chunk), as two MMAs. The MMA's K positions {2t, 2t+1} and {2t+8, 2t+9}
// of step j are taken as k = k0 + 4 j + {0, 1} and + {2, 3} (A and B agree, and the four lanes of a group
// cover 16 distinct k per step), so the 16-byte words feed the MMA as loaded: no shuffles, no conversions.
template <typename T>
__device__ __forceinline__ void linear_mma_words(const uint4& wl, const uint4& wh, const uint4& xv, float (&acc)[4]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const std::uint32_t a[4] = {word(wl, 2 * j), word(wh, 2 * j), word(wl, 2 * j + 1), word(wh, 2 * j + 1)};
    mma_16816(acc, a, word(xv, 2 * j), word(xv, 2 * j + 1), T{});
  }
}

// out[m, n0 .. n0 + 15] for the block's 16 output columns. K is cut into chunks of kVec * 32 values: lane
// (g, t) loads kVec consecutive uint4 of weight rows g and g + 8 (and of x's row g) at 8 kVec t of the
// chunk, so a row's chunk is kVec * 64 contiguous bytes. kWarps warps take chunks w, w + kWarps, ...
// (batches of kLinearLoads / kVec chunks first, then one at a time) and add up in shared memory. Needs k
// % (kVec * 32) == 0, 16-byte aligned x and weight, 1 <= rows <= 8; launched with kWarps * 32 threads and
// ceil(n_cols / 16) blocks. kVec: 1, 2 or 4. kStats: x's row sums and sums of squares are taken too, for a
// folded norm (ep.norm, linear_epilogue.cuh). Under programmatic launch (pdl.cuh) its
// blocks may start while the kernel before finishes, and wait for it before any load.
// At most 64 registers a thread (an SM's 65,536 registers hold two 16-warp blocks at 64): more would halve the
// blocks an SM holds at 16 warps.
template <typename T, int kWarps, int kVec, bool kStats>  // T: __half or __nv_bfloat16
__global__ void __launch_bounds__(kWarps * 32, (kWarps >= 32 ? 1 : 32 / kWarps))
    decode_linear_mma(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                      T* __restrict__ out, int rows, std::int64_t n_cols, std::int64_t k, LinearEpilogue<T> ep) {
  constexpr int kChunk = kVec * kLinearChunk;
  constexpr int kBatch = kLinearLoads / kVec;
  __shared__ float partial[kWarps][8][16];  // [warp][x row][output column]
  __shared__ float2 row_stats[kStats ? kWarps : 1][8];  // [warp][x row]: sum, sum of squares
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane / 4;
  const int t = lane % 4;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * 16;
  // Rows past the matrix (of the weight, or of x) read the last one instead: every load is then
  // unconditional, so a whole batch of them is in flight; what they feed is never written.
  const T* w_lo = weight + (n0 + g < n_cols ? n0 + g : n_cols - 1) * k + 8 * kVec * t;
  const T* w_hi = weight + (n0 + g + 8 < n_cols ? n0 + g + 8 : n_cols - 1) * k + 8 * kVec * t;
  const T* x_row = x + static_cast<std::int64_t>(g < rows ? g : rows - 1) * k + 8 * kVec * t;

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const std::int64_t chunks = k / kChunk;
  std::int64_t c = warp;
  allow_next_grid();
  wait_for_prior_grid();
  if (threadIdx.x == 0) prefetch_constants<T>(bias, n0, ep);
  if (static_cast<int>(threadIdx.x) < rows) prefetch_residual<T>(static_cast<int>(threadIdx.x), n0, n_cols, ep);
  for (; c + (kBatch - 1) * kWarps < chunks; c += kBatch * kWarps) {
    uint4 wl[kBatch][kVec], wh[kBatch][kVec], xv[kBatch][kVec];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const std::int64_t off = (c + i * kWarps) * kChunk;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        wl[i][v] = __ldg(reinterpret_cast<const uint4*>(w_lo + off) + v);
        wh[i][v] = __ldg(reinterpret_cast<const uint4*>(w_hi + off) + v);
        xv[i][v] = __ldg(reinterpret_cast<const uint4*>(x_row + off) + v);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) linear_mma_words<T>(wl[i][v], wh[i][v], xv[i][v], acc);
    }
  }
  for (; c < chunks; c += kWarps) {
    const std::int64_t off = c * kChunk;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      linear_mma_words<T>(__ldg(reinterpret_cast<const uint4*>(w_lo + off) + v),
                          __ldg(reinterpret_cast<const uint4*>(w_hi + off) + v),
                          __ldg(reinterpret_cast<const uint4*>(x_row + off) + v), acc);
    }
  }
  // D: lane (g, t) holds output columns g and g + 8 for x rows 2t and 2t + 1.
  partial[warp][2 * t][g] = acc[0];
  partial[warp][2 * t + 1][g] = acc[1];
  partial[warp][2 * t][g + 8] = acc[2];
  partial[warp][2 * t + 1][g + 8] = acc[3];
  if (kStats) block_row_stats<T>(x, rows, k, &row_stats[0][0], 8);
  __syncthreads();
  // One thread per (x row, output column), consecutive threads on consecutive columns.
  for (int idx = static_cast<int>(threadIdx.x); idx < 8 * 16; idx += kWarps * 32) {
    const int col = idx % 16;
    const int m = idx / 16;
    const std::int64_t n = n0 + col;
    if (m >= rows || n >= n_cols) continue;
    float sum = 0.0f;
    float2 stats = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      sum += partial[w][m][col];
      if (kStats) {
        stats.x += row_stats[kStats ? w : 0][m].x;
        stats.y += row_stats[kStats ? w : 0][m].y;
      }
    }
    const float b = bias != nullptr ? to_float(bias[n]) : 0.0f;
    out[static_cast<std::int64_t>(m) * n_cols + n] = finish_linear<T>(sum, stats, k, b, ep, m, n, n_cols);
  }
}

}  // namespace gpuopt::cuda::kernels
