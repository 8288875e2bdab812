#pragma once

// An attention layer's decode step in one kernel (gpuopt::cuda::decode_qkv_attention): the fused q/k/v
// projection (decode_linear_kernels.cuh's tiles) and, in the same launch, each head's attention
// (decode_attention_kernels.cuh's block) with the new key and value appended to the cache.
//
// The blocks take the projection's 16-column tiles head by head: head h's 3 D / 16 tiles (its q, k and v
// columns) are consecutive blocks, so that heads complete in launch order. A block that has written its
// tile counts it in the head's counter (after a fence); the block that completes the head (the counter's
// last arrival, which also sets it back to zero for the next launch) runs the head's attention for every
// batch row, reading the head's q, k and v rows from L2. So the attention of early heads overlaps the
// projection's later tiles, and no kernel boundary (nor a launch) separates the two; only the last heads'
// attention runs after the projection.

#include <cstdint>

#include "decode_attention_kernels.cuh"
#include "decode_linear_kernels.cuh"
#include "pdl.cuh"

namespace gpuopt::cuda::kernels {

// Keys a group holds per pass in the attention of the fused kernel: its registers are capped by the
// projection's occupancy (two 16-warp blocks an SM, 64 registers a thread), so fewer than the attention
// kernel's 8.
constexpr int kQkvAttentionUnroll = 4;

template <typename T>
struct QkvAttentionArgs {
  DecodeAttentionArgs<T> attn;  // q, k_new and v_new point into qkv; causal, one split, no mask
  const T* x;                   // [rows, k]
  const T* weight;              // [3 heads D, k]: q's rows, then k's, then v's
  const T* bias;                // [3 heads D] or nullptr
  T* qkv;                       // [rows, 3 heads D]: the projection's output
  int rows;
  std::int64_t k;
  int* counters;                // [heads], zero before the launch (and after it)
};

template <typename T, int kWarps, int kVec, bool kStats, int D>
__global__ void __launch_bounds__(kWarps * 32, (kWarps >= 32 ? 1 : 32 / kWarps))
    decode_qkv_attention(QkvAttentionArgs<T> a, LinearEpilogue<T> ep) {
  static_assert(D % 16 == 0 && kWarps <= kAttnMaxWarps, "whole tiles a head; the attention's warps");
  constexpr int kTiles = 3 * D / 16;  // a head's tiles: its q, k and v columns
  __shared__ LinearShared<kWarps, kStats> ls;
  __shared__ AttnShared<D> as;
  __shared__ int last;
  const int head = static_cast<int>(blockIdx.x) / kTiles;
  const int part = static_cast<int>(blockIdx.x) % kTiles;
  const std::int64_t width = static_cast<std::int64_t>(a.attn.heads) * D;  // of each of q, k and v
  const std::int64_t n0 = (part / (D / 16)) * width + static_cast<std::int64_t>(head) * D + (part % (D / 16)) * 16;
  allow_next_grid();
  wait_for_prior_grid();
  linear_tile<T, kWarps, kVec, kStats>(a.x, a.weight, a.bias, a.qkv, a.rows, 3 * width, a.k, ep, n0, ls);
  // Each thread's outputs are ordered before the count (a fence of every writer, then the block's
  // barrier), and the count before the last block's reads (its fence after it has seen the count).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int arrived = atomicAdd(a.counters + head, 1) + 1;
    last = arrived == kTiles;
    if (arrived == kTiles) atomicExch(a.counters + head, 0);  // no other block of this launch counts it again
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int b = 0; b < a.rows; ++b) {
    if (b > 0) __syncthreads();  // the shared memory of the row before is read by then
    attend<T, D, kQkvAttentionUnroll, true>(a.attn, head, b, 0, 1, as);
  }
}

}  // namespace gpuopt::cuda::kernels
