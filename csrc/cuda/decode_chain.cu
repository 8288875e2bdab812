// A chain of decode linear layers in one persistent kernel (gpuopt::cuda::decode_chain): every block of a
// cooperative launch (all resident at once) takes its share of each layer's 16-column tiles, then waits at a grid
// barrier for the layer's output before the next layer reads it. What a kernel boundary costs in a decode
// step, against what a barrier costs: the same tiles (linear_tile, decode_linear_kernels.cuh) as decode_linear's
// kernels with 16 warps and two 16-byte loads per row, so the outputs are the same bits.
#include <cstdint>

#include "decode_linear_kernels.cuh"
#include "gpuopt/cuda.h"
#include "linear_epilogue.cuh"
#include "pdl.cuh"

namespace gpuopt::cuda {
namespace kernels {

constexpr int kChainWarps = 16;
constexpr int kChainVec = 2;

// Passed by value (the kernel's parameters, under 4 KB): layer s reads layer s - 1's output (x for the first; for
// one row its first k_s values) and writes [rows, n_s].
struct ChainLayers {
  const void* x;
  const void* weight[kDecodeChainMaxLayers];
  const void* bias[kDecodeChainMaxLayers];
  void* out[kDecodeChainMaxLayers];
  int n[kDecodeChainMaxLayers];
  int k[kDecodeChainMaxLayers];   // negative: a ReLU after the bias (k = -k)
};

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every block of the grid waits here until all have arrived; their writes before it are visible to all after it.
// Needs every block resident (a cooperative launch). Two forms, for the benchmark:
//  - generation (state[0..1]): state[0] counts the arrivals at the barrier under way (back to 0 when the last
//    arrives), state[1] the barriers passed; fences around plain atomics (cooperative groups' form);
//  - counter (state[2..3], 64-bit): every arrival adds one with release semantics and waits, with acquire loads,
//    until the count reaches its barrier's multiple of the grid: one atomic a block, no fence, no reset.
// Both self-resetting in effect: the same words serve every launch and replay of one grid size.
__device__ __forceinline__ unsigned long long load_acquire64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long add_release64(unsigned long long* p, unsigned long long v) {
  unsigned long long old;
  asm volatile("atom.release.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

template <bool kCounter, bool kSleep>
__device__ __forceinline__ void grid_barrier(unsigned* state) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if constexpr (kCounter) {
      auto* count = reinterpret_cast<unsigned long long*>(state + 2);
      const unsigned long long old = add_release64(count, 1ull);
      const unsigned long long target = (old / gridDim.x + 1) * gridDim.x;
      while (load_acquire64(count) < target) {
        if (kSleep) __nanosleep(32);
      }
    } else {
      const unsigned passed = load_acquire(state + 1);
      __threadfence();
      if (atomicAdd(state, 1u) == gridDim.x - 1) {
        atomicExch(state, 0u);
        __threadfence();
        atomicAdd(state + 1, 1u);
      } else {
        while (load_acquire(state + 1) == passed) {
          if (kSleep) __nanosleep(32);
        }
      }
      __threadfence();
    }
  }
  __syncthreads();
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// kPreload: one 16-warp block an SM (up to 128 registers a thread), each holding its next tile's first batch of
// weights in registers across the barrier (loaded before it), so that the weights stream while the blocks wait.
template <typename T, bool kCounter, bool kSleep, bool kNoBarrier = false, bool kPreload = false>
__global__ void __launch_bounds__(kChainWarps * 32, kPreload ? 1 : 32 / kChainWarps)
    decode_chain_persistent(ChainLayers layers, int n_layers, int rows, unsigned* barrier, bool prefetch) {
  __shared__ float partial[kChainWarps][8][16];
  __shared__ float2 row_stats[1][8];
  wait_for_prior_grid();
  const LinearEpilogue<T> plain;
  LinearEpilogue<T> relu;
  relu.relu = true;
  const T* x = static_cast<const T*>(layers.x);
  TileBatch<kChainVec> pre;
  const int first_tile = static_cast<int>(blockIdx.x);
  auto k_of = [&](int s) { return layers.k[s] < 0 ? -layers.k[s] : layers.k[s]; };
  if (kPreload && first_tile * 16 < layers.n[0]) {
    linear_preload<T, kChainWarps, kChainVec>(static_cast<const T*>(layers.weight[0]), layers.n[0], k_of(0),
                                              first_tile * 16LL, pre);
  }
  for (int s = 0; s < n_layers; ++s) {
    const int k = k_of(s);
    const int n = layers.n[s];
    const auto* w = static_cast<const T*>(layers.weight[s]);
    auto* out = static_cast<T*>(layers.out[s]);
    for (int tile = first_tile; tile * 16 < n; tile += static_cast<int>(gridDim.x)) {
      linear_tile<T, kChainWarps, kChainVec, false, true, kPreload>(
          x, w, static_cast<const T*>(layers.bias[s]), out, rows, n, k, layers.k[s] < 0 ? relu : plain, tile * 16LL,
          partial, row_stats, kPreload && tile == first_tile ? &pre : nullptr);
      __syncthreads();
    }
    if (s + 1 == n_layers) break;
    if (kPreload && first_tile * 16 < layers.n[s + 1]) {
      linear_preload<T, kChainWarps, kChainVec>(static_cast<const T*>(layers.weight[s + 1]), layers.n[s + 1],
                                                k_of(s + 1), first_tile * 16LL, pre);
    }
    if (prefetch) {  // the lines of the next layer's first tile this block's warps load first, into L2
      const int next_k = k_of(s + 1);
      const int next_row = first_tile * 16 + static_cast<int>(threadIdx.x % 16);
      const int line = static_cast<int>(threadIdx.x / 16);  // of 128 bytes: the first batch of the 16 warps
      if (next_row < layers.n[s + 1] && line * 64 < next_k) {
        prefetch_l2(static_cast<const T*>(layers.weight[s + 1]) + static_cast<std::int64_t>(next_row) * next_k +
                    line * 64);
      }
    }
    if constexpr (kNoBarrier) {
      __syncthreads();  // timing only: the next layer reads whatever its x holds
    } else {
      grid_barrier<kCounter, kSleep>(barrier);
    }
    x = out;
  }
}

}  // namespace kernels

namespace {

template <typename T, bool kCounter, bool kSleep, bool kNoBarrier = false, bool kPreload = false>
void launch_chain(const DecodeChainParams& p, cudaStream_t stream) {
  kernels::ChainLayers layers = {};
  layers.x = p.x;
  for (int s = 0; s < p.n_layers; ++s) {
    layers.weight[s] = p.weight[s];
    layers.bias[s] = p.bias[s];
    layers.out[s] = p.out[s];
    layers.n[s] = static_cast<int>(p.n[s]);
    layers.k[s] = static_cast<int>(p.relu[s] ? -p.k[s] : p.k[s]);
  }
  auto* kernel = kernels::decode_chain_persistent<T, kCounter, kSleep, kNoBarrier, kPreload>;
  int per_sm = 0;
  GPUOPT_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kernels::kChainWarps * 32, 0));
  int sms = 0;
  GPUOPT_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device));
  GPUOPT_CHECK(per_sm >= 1, "decode_chain: the kernel fits no block on an SM");
  const int blocks = p.blocks > 0 ? (p.blocks < per_sm * sms ? p.blocks : per_sm * sms) : per_sm * sms;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kernels::kChainWarps * 32);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeCooperative;
  attribute[0].val.cooperative = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, layers, p.n_layers, static_cast<int>(p.rows),
                                                p.barrier, p.prefetch);
  if (status != cudaSuccess) (void)cudaGetLastError();
  GPUOPT_CHECK(status == cudaSuccess, "decode_chain: cooperative launch failed: ", cudaGetErrorName(status), " (",
               cudaGetErrorString(status), ")");
}

}  // namespace

void decode_chain(const DecodeChainParams& p, cudaStream_t stream) {
  GPUOPT_CHECK_VALUE(p.type == ActivationType::kFloat16 || p.type == ActivationType::kBFloat16,
                     "decode_chain: needs float16 or bfloat16");
  GPUOPT_CHECK_VALUE(p.n_layers >= 1 && p.n_layers <= kDecodeChainMaxLayers, "decode_chain: 1 to ",
                     kDecodeChainMaxLayers, " layers, got ", p.n_layers);
  GPUOPT_CHECK_VALUE(p.rows >= 1 && p.rows <= kDecodeLinearMaxRows, "decode_chain: rows must be 1 to ",
                     kDecodeLinearMaxRows, ", got ", p.rows);
  GPUOPT_CHECK_VALUE(p.barrier != nullptr, "decode_chain: barrier must not be null");
  GPUOPT_CHECK_VALUE(mma_code_runs(p.device), "decode_chain: needs compute capability 8.0+");
  for (int s = 0; s < p.n_layers; ++s) {
    GPUOPT_CHECK_VALUE(p.k[s] % (kernels::kChainVec * kDecodeLinearChunk) == 0 && p.k[s] > 0 &&
                           p.n[s] >= 1 && (s == 0 || p.k[s] == p.n[s - 1] || (p.rows == 1 && p.k[s] < p.n[s - 1])),
                       "decode_chain: layer ", s, " has n=", p.n[s], ", k=", p.k[s],
                       "; k must be a positive multiple of 64 and the layer before's n (or less, for one row)");
  }
  GPUOPT_CHECK_VALUE(p.barrier_kind >= 0 && p.barrier_kind <= 6, "decode_chain: barrier_kind must be 0 to 6, got ",
                     p.barrier_kind);
  if (p.type != ActivationType::kFloat16) {
    launch_chain<__nv_bfloat16, true, false>(p, stream);
    return;
  }
  switch (p.barrier_kind) {
    case 0: launch_chain<__half, false, false>(p, stream); return;
    case 1: launch_chain<__half, true, false>(p, stream); return;
    case 2: launch_chain<__half, false, true>(p, stream); return;
    case 4: launch_chain<__half, true, false, true>(p, stream); return;
    case 5: launch_chain<__half, true, false, false, true>(p, stream); return;
    case 6: launch_chain<__half, true, false, true, true>(p, stream); return;
    default: launch_chain<__half, true, true>(p, stream); return;
  }
}

}  // namespace gpuopt::cuda
