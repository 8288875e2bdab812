#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "int8_linear_kernels.cuh"  // mma_16816, word, from_float, to_float
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
// ceil(n_cols / 16) blocks. kVec: 1, 2 or 4. Under programmatic launch (pdl.cuh) its blocks may start while
// the kernel before finishes, and wait for it before any load.
// At most 64 registers a thread (2048 threads an SM at 64 registers: two 16-warp blocks): more would halve the
// blocks an SM holds at 16 warps.
template <typename T, int kWarps, int kVec, bool kRelu>  // T: __half or __nv_bfloat16
__global__ void __launch_bounds__(kWarps * 32, (kWarps >= 32 ? 1 : 32 / kWarps))
    decode_linear_mma(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                      T* __restrict__ out, int rows, std::int64_t n_cols, std::int64_t k) {
  constexpr int kChunk = kVec * kLinearChunk;
  constexpr int kBatch = kLinearLoads / kVec;
  __shared__ float partial[kWarps][8][16];  // [warp][x row][output column]
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
}


// ---- the weight tile through the tensor memory accelerator (compute capability 9.0+) ------------------
//
// The same sums in the same order as decode_linear_mma, but one thread copies the block's 16 weight rows into
// shared memory with bulk copies (cp.async.bulk, completing on an mbarrier): the whole tile is in flight at
// once without registers or L1 lines, and, for a constant weight, before the wait for the kernel before.

constexpr int kLinearTmaPad = 16;  // bytes after each row in shared memory: rows g and g + 1 start 16 banks apart

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void tile_barrier_init(std::uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Thread 0: the 16 rows n0 .. n0 + 15 (rows past the matrix: its last one) into `tile`, row r at r * stride.
template <typename T>
__device__ __forceinline__ void tile_copy(unsigned char* tile, std::uint64_t* bar, const T* weight, std::int64_t n0,
                                          std::int64_t n_cols, std::int64_t k, std::int64_t stride) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const auto row_bytes = static_cast<std::uint32_t>(k * sizeof(T));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)),
               "r"(16u * row_bytes)
               : "memory");
  for (int r = 0; r < 16; ++r) {
    const std::int64_t row = n0 + r < n_cols ? n0 + r : n_cols - 1;
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     shared_address(tile + r * stride)),
                 "l"(weight + row * k), "r"(row_bytes), "r"(shared_address(bar))
                 : "memory");
  }
#endif
}

__device__ __forceinline__ void tile_wait(std::uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "TILE_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
      "@!done bra TILE_WAIT;\n"
      "}\n" ::"r"(shared_address(bar))
      : "memory");
#endif
}

// decode_linear_mma's layout and sums, its weights read from the tile. Dynamic shared memory: 16 * (k *
// sizeof(T) + kLinearTmaPad) bytes. `early`: the copies start before the wait for the kernel before (the
// weight is constant), else after it. Needs 9.0+ (the host checks; compiled out below).
template <typename T, int kWarps, int kVec, bool kRelu>  // T: __half or __nv_bfloat16
__global__ void __launch_bounds__(kWarps * 32, (kWarps >= 32 ? 1 : 32 / kWarps))
    decode_linear_tma(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                      T* __restrict__ out, int rows, std::int64_t n_cols, std::int64_t k, bool early) {
  constexpr int kChunk = kVec * kLinearChunk;
  constexpr int kBatch = kLinearLoads / kVec;
  __shared__ float partial[kWarps][8][16];  // [warp][x row][output column]
  __shared__ alignas(8) std::uint64_t loaded;
  extern __shared__ __align__(16) unsigned char tile[];
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane / 4;
  const int t = lane % 4;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * 16;
  const std::int64_t stride = k * static_cast<std::int64_t>(sizeof(T)) + kLinearTmaPad;
  if (threadIdx.x == 0) tile_barrier_init(&loaded);
  __syncthreads();
  allow_next_grid();
  if (early && threadIdx.x == 0) tile_copy(tile, &loaded, weight, n0, n_cols, k, stride);
  wait_for_prior_grid();
  if (!early && threadIdx.x == 0) tile_copy(tile, &loaded, weight, n0, n_cols, k, stride);
  const T* w_lo = reinterpret_cast<const T*>(tile + g * stride) + 8 * kVec * t;
  const T* w_hi = reinterpret_cast<const T*>(tile + (g + 8) * stride) + 8 * kVec * t;
  const T* x_row = x + static_cast<std::int64_t>(g < rows ? g : rows - 1) * k + 8 * kVec * t;

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const std::int64_t chunks = k / kChunk;
  std::int64_t c = warp;
  bool waited = false;
  for (; c + (kBatch - 1) * kWarps < chunks; c += kBatch * kWarps) {
    uint4 xv[kBatch][kVec];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        xv[i][v] = __ldg(reinterpret_cast<const uint4*>(x_row + (c + i * kWarps) * kChunk) + v);
      }
    }
    if (!waited) {  // x's first loads in flight while the tile lands
      tile_wait(&loaded);
      waited = true;
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const std::int64_t off = (c + i * kWarps) * kChunk;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        linear_mma_words<T>(reinterpret_cast<const uint4*>(w_lo + off)[v], reinterpret_cast<const uint4*>(w_hi + off)[v],
                            xv[i][v], acc);
      }
    }
  }
  if (!waited) tile_wait(&loaded);  // every thread waits: the barrier is not reused, the tile must land
  for (; c < chunks; c += kWarps) {
    const std::int64_t off = c * kChunk;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      linear_mma_words<T>(reinterpret_cast<const uint4*>(w_lo + off)[v], reinterpret_cast<const uint4*>(w_hi + off)[v],
                          __ldg(reinterpret_cast<const uint4*>(x_row + off) + v), acc);
    }
  }

  partial[warp][2 * t][g] = acc[0];
  partial[warp][2 * t + 1][g] = acc[1];
  partial[warp][2 * t][g + 8] = acc[2];
  partial[warp][2 * t + 1][g + 8] = acc[3];
  __syncthreads();
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
}

}  // namespace gpuopt::cuda::kernels
