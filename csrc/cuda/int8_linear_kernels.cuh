#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "linear_epilogue.cuh"
#include "pdl.cuh"
#include "values.cuh"

namespace gpuopt::cuda::kernels {

constexpr int kInt8LinearWarps = 8;  // output columns per block, one per warp

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

// out[m, n] = (sum_k x[m, k] * weight[n, k]) * scale[n] + bias[n] for m < rows <= kRows, then what ep adds
// (linear_epilogue.cuh; kStats: x's row statistics for its folded norm, from the values of x the warp
// converts for its products anyway -- each warp reads all of x -- reduced with the sums).
// One warp per output column n: its lanes stride over weight row n 16 int8 at a time (one 16-byte
// load per lane per step, 512 bytes per warp), multiply with the matching 16 values of every row of
// x (small, served from L1/L2), accumulate in fp32, then reduce across the warp with shuffles.
// Needs k % 16 == 0 and 16-byte aligned x and weight (int8_linear_supported checks).
template <typename T, int kRows, bool kStats>
__global__ void __launch_bounds__(kInt8LinearWarps * 32)
    int8_linear(const T* __restrict__ x, const std::int8_t* __restrict__ weight,
                const void* __restrict__ scales, bool scales_fp32, const T* __restrict__ bias,
                T* __restrict__ out, int rows, std::int64_t n_cols, std::int64_t k, LinearEpilogue<T> ep) {
  allow_next_grid();
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t n =
      static_cast<std::int64_t>(blockIdx.x) * kInt8LinearWarps + static_cast<int>(threadIdx.x / 32);
  if (n >= n_cols) return;  // n is the same for every lane of a warp: whole warps leave

  const std::int8_t* w_row = weight + n * k;
  float acc[kRows];
  float2 stats[kStats ? kRows : 1];  // kStats: sum and sum of squares of the values of x's row m read here
#pragma unroll
  for (int m = 0; m < kRows; ++m) acc[m] = 0.0f;
#pragma unroll
  for (int m = 0; m < (kStats ? kRows : 1); ++m) stats[m] = make_float2(0.0f, 0.0f);
  wait_for_prior_grid();  // under programmatic launch (pdl.cuh): for the kernel before, before any load
  if (lane == 0) {  // the epilogue's reads, started early (prefetch_constants, linear_epilogue.cuh)
    prefetch_constants<T>(bias, n, ep);
    prefetch_l1(scales_fp32 ? static_cast<const void*>(static_cast<const float*>(scales) + n)
                            : static_cast<const void*>(static_cast<const T*>(scales) + n));
  }
  if (lane < rows) prefetch_residual<T>(lane, n, n_cols, ep);

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
        if (kStats) {
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            stats[kStats ? m : 0].x += xv[j];
            stats[kStats ? m : 0].y = fmaf(xv[j], xv[j], stats[kStats ? m : 0].y);
          }
        }
      }
    }
  }

#pragma unroll
  for (int m = 0; m < kRows; ++m) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], offset);
      if (kStats) {
        stats[kStats ? m : 0].x += __shfl_xor_sync(0xffffffffu, stats[kStats ? m : 0].x, offset);
        stats[kStats ? m : 0].y += __shfl_xor_sync(0xffffffffu, stats[kStats ? m : 0].y, offset);
      }
    }
  }

  if (lane == 0) {
    const float scale = scales_fp32 ? static_cast<const float*>(scales)[n]
                                    : to_float(static_cast<const T*>(scales)[n]);
    const float b = bias != nullptr ? to_float(bias[n]) : 0.0f;
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      if (m < rows) {
        out[m * n_cols + n] =
            finish_linear<T>(acc[m] * scale, kStats ? stats[kStats ? m : 0] : make_float2(0.0f, 0.0f), k, b, ep, m, n,
                             n_cols);
      }
    }
  }
}

// ---- the tensor-core kernel (compute capability 8.0+) -------------------------------------------------
//
// out[m, n] for 16 output columns n0..n0+15 per block: the MMA's M is the output columns (the weight
// rows), its N the rows of x (8 per tile, kTiles tiles), its K the reduction. mma.m16n8k16 gives lane
// (g = lane / 4, t = lane % 4) the A elements of rows g and g + 8 at K positions {2t, 2t+1, 2t+8,
// 2t+9} and the B elements of column g at the same positions. The K order inside one MMA is free as
// long as A and B agree, so those four positions are taken as four consecutive k: lane t of step j
// of a 64-wide chunk uses k = 16 t + 4 j + {0, 1, 2, 3}. Then one 16-byte load of weight row
// n0 + g (and one of row n0 + g + 8) feeds four MMAs, and so do two 16-byte loads of x's row.
constexpr int kInt8MmaChunk = 64;  // K per warp and step: 16 bytes of each of its two weight rows per lane
constexpr int kInt8MmaBatch = 4;   // chunks a lane loads before their MMAs

// Two int8 values (bytes `pair` * 2 and + 1 of `biased`, each XOR 0x80, i.e. value + 128) as a
// 16-bit pair, lower first. fp16: 0x64XX is 1024 + XX exactly, less 1152 gives the value.
__device__ __forceinline__ std::uint32_t int8_pair(std::uint32_t biased, int pair, __half) {
  const std::uint32_t bits = __byte_perm(biased, 0x64646464u, pair == 0 ? 0x4140u : 0x4342u);
  __half2 h;
  memcpy(&h, &bits, sizeof(h));
  h = __hsub2(h, __halves2half2(__ushort_as_half(0x6480u), __ushort_as_half(0x6480u)));  // 1152
  std::uint32_t out;
  memcpy(&out, &h, sizeof(out));
  return out;
}
// bf16 (7 mantissa bits) cannot hold 128 + XX; fp32 can: 0x4B0000XX is 2^23 + XX, less 2^23 + 128
// gives the value, whose bits below the top 16 are zero, so the bf16 is its top half, exactly.
__device__ __forceinline__ std::uint32_t int8_pair(std::uint32_t biased, int pair, __nv_bfloat16) {
  const float lo = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7440u + 2u * pair)) - 8388736.0f;
  const float hi = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7441u + 2u * pair)) - 8388736.0f;
  return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632u);
}

__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1, __half) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched below 8.0 (mma_code_runs in device_code.cu): a wrong sum must not pass silently
#endif
}
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1, __nv_bfloat16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched below 8.0 (mma_code_runs in device_code.cu): a wrong sum must not pass silently
#endif
}

__device__ __forceinline__ std::uint32_t word(const uint4& u, int i) {
  return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

// One 64-wide chunk of K: the lane's 16 bytes of weight rows g and g + 8, and its 16 values of x's row
// g of each tile, into four MMAs per tile.
template <typename T, int kTiles>
__device__ __forceinline__ void int8_mma_chunk(const uint4& wl, const uint4& wh, const uint4 (&xv)[kTiles][2],
                                               float (&acc)[kTiles][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const std::uint32_t lo = word(wl, j) ^ 0x80808080u;
    const std::uint32_t hi = word(wh, j) ^ 0x80808080u;
    const std::uint32_t a[4] = {int8_pair(lo, 0, T{}), int8_pair(hi, 0, T{}), int8_pair(lo, 1, T{}),
                                int8_pair(hi, 1, T{})};
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
      // x's 16 values of this lane: words 0-3 in xv[..][0], 4-7 in xv[..][1]; step j uses 2j, 2j+1.
      const uint4& u = xv[tile][j / 2];
      mma_16816(acc[tile], a, word(u, 2 * (j % 2)), word(u, 2 * (j % 2) + 1), T{});
    }
  }
}

// Needs k % (64 * kVec) == 0, 16-byte aligned x and weight, 1 <= rows <= 8 * kTiles; launched with kWarps * 32
// threads and ceil(n_cols / 16) blocks. kWarps split K and add up in shared memory: a decode step's
// matrices give a few hundred blocks, so the loads in flight come from many warps per block (the
// compiler interleaves a lane's loads with its MMAs, keeping few of them in flight per lane). A chunk
// is kVec * 64 values of K: lane t loads kVec consecutive 16-byte words of each of its two weight rows
// (a row's chunk is kVec * 64 contiguous bytes) at 16 kVec t, each feeding four MMAs as above.
template <typename T, int kTiles, int kWarps, int kVec, bool kStats>  // T: __half or __nv_bfloat16
__global__ void __launch_bounds__(kWarps * 32)
    int8_linear_mma(const T* __restrict__ x, const std::int8_t* __restrict__ weight,
                    const void* __restrict__ scales, bool scales_fp32, const T* __restrict__ bias,
                    T* __restrict__ out, int rows, std::int64_t n_cols, std::int64_t k, LinearEpilogue<T> ep) {
  constexpr int kChunk = kInt8MmaChunk * kVec;
  constexpr int kBatch = kInt8MmaBatch / kVec;
  static_assert(kBatch >= 1, "a batch holds at least one chunk");
  __shared__ float partial[kWarps][kTiles][8][16];  // [warp][tile][x row][output column]
  __shared__ float2 row_stats[kStats ? kWarps : 1][kTiles * 8];  // [warp][x row]: sum, sum of squares
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane / 4;
  const int t = lane % 4;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * 16;
  // Rows past the matrix (of the weight, or of x) read the last one instead: every load is then
  // unconditional, so the compiler puts a whole batch of them in flight; what they feed lands in
  // outputs that are not written.
  const std::int8_t* w_lo = weight + (n0 + g < n_cols ? n0 + g : n_cols - 1) * k + 16 * kVec * t;
  const std::int8_t* w_hi = weight + (n0 + g + 8 < n_cols ? n0 + g + 8 : n_cols - 1) * k + 16 * kVec * t;
  const T* x_row[kTiles];
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    x_row[tile] =
        x + static_cast<std::int64_t>((tile * 8 + g < rows ? tile * 8 + g : rows - 1)) * k + 16 * kVec * t;
  }

  float acc[kTiles][4];
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[tile][i] = 0.0f;
  }

  // Warp w takes chunks w, w + kWarps, ...: whole batches of kBatch first, then what is left one chunk at
  // a time.
  const std::int64_t chunks = k / kChunk;
  constexpr std::int64_t kStride = kWarps;
  std::int64_t c = warp;
  // Under programmatic launch (pdl.cuh): the blocks may start while the kernel before finishes, and wait
  // for it before any load.
  allow_next_grid();
  wait_for_prior_grid();
  if (threadIdx.x == 0) {
    prefetch_constants<T>(bias, n0, ep);
    prefetch_l1(scales_fp32 ? static_cast<const void*>(static_cast<const float*>(scales) + n0)
                            : static_cast<const void*>(static_cast<const T*>(scales) + n0));
  }
  if (static_cast<int>(threadIdx.x) < rows) prefetch_residual<T>(static_cast<int>(threadIdx.x), n0, n_cols, ep);
  for (; c + (kBatch - 1) * kStride < chunks; c += kBatch * kStride) {
    uint4 wl[kBatch][kVec], wh[kBatch][kVec], xv[kBatch][kVec][kTiles][2];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const std::int64_t off = (c + i * kStride) * kChunk;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        wl[i][v] = __ldg(reinterpret_cast<const uint4*>(w_lo + off + 16 * v));
        wh[i][v] = __ldg(reinterpret_cast<const uint4*>(w_hi + off + 16 * v));
#pragma unroll
        for (int tile = 0; tile < kTiles; ++tile) {
          const auto* q = reinterpret_cast<const uint4*>(x_row[tile] + off + 16 * v);
          xv[i][v][tile][0] = __ldg(q);
          xv[i][v][tile][1] = __ldg(q + 1);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) int8_mma_chunk<T, kTiles>(wl[i][v], wh[i][v], xv[i][v], acc);
    }
  }
  for (; c < chunks; c += kStride) {
    const std::int64_t off = c * kChunk;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      uint4 xv[kTiles][2];
#pragma unroll
      for (int tile = 0; tile < kTiles; ++tile) {
        const auto* q = reinterpret_cast<const uint4*>(x_row[tile] + off + 16 * v);
        xv[tile][0] = __ldg(q);
        xv[tile][1] = __ldg(q + 1);
      }
      int8_mma_chunk<T, kTiles>(__ldg(reinterpret_cast<const uint4*>(w_lo + off + 16 * v)),
                                __ldg(reinterpret_cast<const uint4*>(w_hi + off + 16 * v)), xv, acc);
    }
  }
  // D: lane (g, t) holds output columns g and g + 8 for x rows 2t and 2t + 1 of each tile.
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    partial[warp][tile][2 * t][g] = acc[tile][0];
    partial[warp][tile][2 * t + 1][g] = acc[tile][1];
    partial[warp][tile][2 * t][g + 8] = acc[tile][2];
    partial[warp][tile][2 * t + 1][g + 8] = acc[tile][3];
  }
  if (kStats) block_row_stats<T>(x, rows, k, &row_stats[0][0], kTiles * 8);
  __syncthreads();
  // One thread per (x row, output column), consecutive threads on consecutive columns.
  for (int idx = static_cast<int>(threadIdx.x); idx < kTiles * 8 * 16; idx += kWarps * 32) {
    const int col = idx % 16;
    const int m = idx / 16;  // tile * 8 + row in the tile
    const std::int64_t n = n0 + col;
    if (m >= rows || n >= n_cols) continue;
    float sum = 0.0f;
    float2 stats = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      sum += partial[w][m / 8][m % 8][col];
      if (kStats) {
        stats.x += row_stats[kStats ? w : 0][m].x;
        stats.y += row_stats[kStats ? w : 0][m].y;
      }
    }
    const float scale = scales_fp32 ? static_cast<const float*>(scales)[n]
                                    : to_float(static_cast<const T*>(scales)[n]);
    const float b = bias != nullptr ? to_float(bias[n]) : 0.0f;
    out[static_cast<std::int64_t>(m) * n_cols + n] = finish_linear<T>(sum * scale, stats, k, b, ep, m, n, n_cols);
  }
}

}  // namespace gpuopt::cuda::kernels
