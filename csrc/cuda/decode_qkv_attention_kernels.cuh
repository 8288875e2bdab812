#pragma once

// An attention layer's decode step in one kernel (gpuopt::cuda::decode_qkv_attention): the fused q/k/v
// projection (decode_linear_kernels.cuh's tiles) and, in the same launch, each head's attention
// (decode_attention_kernels.cuh's block) with the new key and value appended to the cache.
//
// The blocks take their work in the order they start (a ticket): first the projection's 16-column tiles,
// head by head (a head's 3 D / 16 tiles, its q, k and v columns, are consecutive tickets, so that heads
// complete in that order), then one block per head for its attention. A tile block counts its tile in the
// head's counter (a release add after the block's barrier) and exits. A head's attention block asks its cache
// rows into L2 (they do not depend on the tiles), waits for the head's count (an acquire load; the tiles have
// lower tickets, so they have started: no deadlock), then attends for every batch row with the new key and
// value appended, reading q, k and v from L2. So the attention overlaps the projection's later tiles, and
// neither a kernel boundary nor a launch separates the two; only the last heads' attention runs after the
// projection, from L2.

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
  int* counters;                // [heads + 1], zero before the launch (and after it): the heads' finished
                                // tiles, then the blocks' tickets
};

// A release add (the block's writes, ordered before it by a barrier, are visible to whoever acquires the
// count: the pattern of CUTLASS's semaphores), issued without waiting for it.
__device__ __forceinline__ void add_release(int* p, int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
  __threadfence();
  atomicAdd(p, v);
#endif
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ void pause() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  __nanosleep(64);
#endif
}

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
  v = *reinterpret_cast<const volatile int*>(p);
  __threadfence();
#endif
  return v;
}

template <typename T, int kWarps, int kVec, bool kStats, int D>
__global__ void __launch_bounds__(kWarps * 32, (kWarps >= 32 ? 1 : 32 / kWarps))
    decode_qkv_attention(QkvAttentionArgs<T> a, LinearEpilogue<T> ep) {
  static_assert(D % 16 == 0 && kWarps <= kAttnMaxWarps, "whole tiles a head; the attention's warps");
  constexpr int kTiles = 3 * D / 16;  // of a head: its q, k and v columns
  __shared__ LinearShared<kWarps, kStats> ls;
  __shared__ AttnShared<D> as;
  __shared__ int ticket;
  const int heads = a.attn.heads;
  const int tiles = heads * kTiles;
  int* const tickets = a.counters + heads;
  // The block's work, by the order blocks start in: the tiles head by head, then the heads' attention. A
  // block waiting for a head's tiles therefore only waits for blocks that have started (no deadlock,
  // whatever order the hardware starts blocks in). The counter is not written by the kernel before (only
  // by the last launch of this one), so it is taken before the wait.
  if (threadIdx.x == 0) {
    ticket = atomicAdd(tickets, 1);
    if (ticket == static_cast<int>(gridDim.x) - 1) atomicExch(tickets, 0);  // every ticket is out: reset
  }
  allow_next_grid();
  wait_for_prior_grid();
  __syncthreads();
  const int work = ticket;
  if (work < tiles) {
    const int head = work / kTiles;
    const int part = work % kTiles;
    const std::int64_t width = static_cast<std::int64_t>(heads) * D;  // of each of q, k and v
    const std::int64_t n0 = (part / (D / 16)) * width + static_cast<std::int64_t>(head) * D + (part % (D / 16)) * 16;
    linear_tile<T, kWarps, kVec, kStats>(a.x, a.weight, a.bias, a.qkv, a.rows, 3 * width, a.k, ep, n0, ls);
    __syncthreads();  // every output of the tile written
    if (threadIdx.x == 0) add_release(a.counters + head, 1);
    return;
  }
  // A head's attention. Its cache rows before the new one do not depend on the tiles: asked into L2 while
  // they finish. The new row (written by this block) and q come from the tiles, read from L2.
  const int head = work - tiles;
  const long long position = *a.attn.position;
  const int rows_before = position <= 0 ? 0 : position < a.attn.keys ? static_cast<int>(position) : a.attn.keys;
  constexpr int kLines = D * static_cast<int>(sizeof(T)) / 128 > 0 ? D * static_cast<int>(sizeof(T)) / 128 : 1;
  const int lines = a.rows * rows_before * kLines;  // 128-byte lines of K (and V) a row of the batch reads
  for (int i = static_cast<int>(threadIdx.x); i < lines; i += static_cast<int>(blockDim.x)) {
    const int b = i / (rows_before * kLines);
    const int r = (i / kLines) % rows_before;
    const int l = i % kLines;
    const std::int64_t off = b * a.attn.kb + head * a.attn.kh + r * a.attn.kl + l * (128 / static_cast<int>(sizeof(T)));
    prefetch_l2(a.attn.k + off);
    prefetch_l2(a.attn.v + off);
  }
  if (threadIdx.x == 0) {
    while (load_acquire(a.counters + head) < kTiles) pause();
    a.counters[head] = 0;  // every tile of the head has counted: ready for the next launch
  }
  __syncthreads();
  for (int b = 0; b < a.rows; ++b) {
    if (b > 0) __syncthreads();  // the shared memory of the row before is read by then
    attend<T, D, kQkvAttentionUnroll, true>(a.attn, head, b, 0, 1, as);
  }
}

}  // namespace gpuopt::cuda::kernels
