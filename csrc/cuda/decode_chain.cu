// A chain of decode linear layers in one persistent kernel (gpuopt::cuda::decode_chain), a probe for the chain
// benchmark: what the decode step's matrix products cost when HBM never waits for a layer's output.
//
// One block an SM (a cooperative launch, so all are resident), block b taking tiles b, b + grid, ... of every
// layer (16 output columns a tile). Its last warp is a producer: it streams the block's weight tiles, layer after
// layer, into a ring of shared-memory stages (16 rows x 1024 values each) with bulk copies completing on an
// mbarrier per stage. The weights depend on nothing the chain computes, so the producer runs ahead across layers,
// held back only by the ring's free stages. The other 16 warps consume: before a layer's first tile they wait for
// every block to have finished the layer before (a 64-bit counter each block adds one to, with release semantics,
// after its last tile of a layer; acquire loads poll it), copy the layer's input into shared memory, and compute
// each tile as decode_linear_mma with 16 warps and two loads a row does (warp w takes chunks w, w + 16, ...; the
// same MMAs in the same order, the same sums across warps): the same bits. No block waits at the end of a layer,
// only before reading the next one's input, and the weights keep streaming meanwhile.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "decode_linear_kernels.cuh"
#include "stream_kernels.cuh"
#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace kernels {

constexpr int kStreamWarps = 16;  // consumer warps; one producer warp more
constexpr int kStreamVec = 2;     // 16-byte words of a row per lane and chunk (a chunk: 64 values)
constexpr int kStreamSegment = kStreamWarps * kStreamVec * kLinearChunk;  // a stage's values of a row: 1024
constexpr int kStreamPad = 16;  // bytes after each row in a stage: row g's words start 16 bytes (4 banks) later
constexpr int kStreamRowBytes = kStreamSegment * 2 + kStreamPad;
constexpr int kStreamStageBytes = 16 * kStreamRowBytes;
constexpr int kStreamMaxK = 8192;  // the input copy in shared memory

struct ChainLayers {
  const void* x;
  const void* weight[kDecodeChainMaxLayers];
  const void* bias[kDecodeChainMaxLayers];
  void* out[kDecodeChainMaxLayers];
  int n[kDecodeChainMaxLayers];
  int k[kDecodeChainMaxLayers];  // negative: a ReLU after the bias (k = -k)
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned long long counter_load(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long counter_add(unsigned long long* p) {
  unsigned long long old;
  asm volatile("atom.release.gpu.global.add.u64 %0, [%1], 1;" : "=l"(old) : "l"(p) : "memory");
  return old;
}
#endif

// Dynamic shared memory: `stages` full and `stages` empty mbarriers, then the ring (stages x kStreamStageBytes),
// then the input (kStreamMaxK values). kWait false: no waits and no counter (timing only). trace: null, or
// [grid][n_layers][kTraceFields] nanoseconds (a profile of the probe; see kTraceFields). options: bit 0, the counter
// polls sleep between loads. kTagged: the layers' outputs are also written as tagged words into `tags` (layer
// after layer, sum of n_s words, zero before the first launch) and read from there, polled until every word
// carries this launch's epoch (counter[1] counts the blocks' launches): no counter between layers.
constexpr int kTraceFields = 7;  // wait done, input loaded, last tile done; producer's empty-stage wait, its last
                                 // copy issued; the consumers' full-stage wait (thread 0's); the counter's add
template <typename T, bool kWait, bool kTagged>
__global__ void __launch_bounds__((kStreamWarps + 1) * 32, 1)
    decode_chain_streamed(ChainLayers layers, int n_layers, unsigned long long* counter, int stages, long long* trace,
                          int options, unsigned* tags) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char dynamic[];
  __shared__ float partial[kStreamWarps][8][16];  // [warp][x row][output column], as decode_linear_mma's
  __shared__ unsigned epoch_shared;
  auto* full = reinterpret_cast<std::uint64_t*>(dynamic);
  std::uint64_t* empty = full + stages;
  unsigned char* ring = dynamic + ((2 * stages * 8 + 127) / 128) * 128;
  T* xs = reinterpret_cast<T*>(ring + static_cast<std::size_t>(stages) * kStreamStageBytes);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int blocks = static_cast<int>(gridDim.x);
  const int b = static_cast<int>(blockIdx.x);
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) {
      stage_init(&full[i], 1);
      stage_init(&empty[i], kStreamWarps);
    }
    stage_init_fence();
  }
  __syncthreads();

  if (warp == kStreamWarps) {  // the producer: every stage of the block's tiles, in the consumers' order
    unsigned i = 0;
    for (int s = 0; s < n_layers; ++s) {
      const int k = layers.k[s] < 0 ? -layers.k[s] : layers.k[s];
      const auto* w = static_cast<const T*>(layers.weight[s]);
      long long stalled = 0;
      for (int tile = b; tile * 16 < layers.n[s]; tile += blocks) {
        for (int seg = 0; seg < k / kStreamSegment; ++seg, ++i) {
          const unsigned stage = i % static_cast<unsigned>(stages);
          if (lane == 0) {
            const long long t0 = trace != nullptr ? now_ns() : 0;
            stage_wait(&empty[stage], ((i / static_cast<unsigned>(stages)) & 1u) ^ 1u);
            if (trace != nullptr) stalled += now_ns() - t0;
            stage_expect(&full[stage], 16u * kStreamSegment * sizeof(T));
          }
          __syncwarp();
          if (lane < 16) {
            stage_copy(ring + static_cast<std::size_t>(stage) * kStreamStageBytes + lane * kStreamRowBytes,
                       w + (static_cast<std::int64_t>(tile) * 16 + lane) * k + seg * kStreamSegment,
                       kStreamSegment * sizeof(T), &full[stage]);
          }
        }
      }
      if (trace != nullptr && lane == 0) {
        long long* row = trace + (static_cast<std::int64_t>(b) * n_layers + s) * kTraceFields;
        row[3] = stalled;
        row[4] = now_ns();
      }
    }
    return;
  }

  const int g = lane / 4;
  const int t = lane % 4;
  const T* x = static_cast<const T*>(layers.x);
  unsigned i = 0;
  unsigned long long target = 0;  // the count at which every block has finished the layer before
  unsigned epoch = 0;
  if (kTagged) {
    if (threadIdx.x == 0) {
      const unsigned long long old = atomicAdd(counter + 1, 1ull);
      epoch_shared = static_cast<unsigned>((old / static_cast<unsigned long long>(blocks)) % 65535ull) + 1u;
    }
    consumers_sync<kStreamWarps * 32>();
    epoch = epoch_shared;
  }
  std::int64_t offset = 0;       // of layer s's words in tags
  std::int64_t prev_offset = 0;  // of layer s - 1's
  for (int s = 0; s < n_layers; ++s) {
    const int k = layers.k[s] < 0 ? -layers.k[s] : layers.k[s];
    const int n = layers.n[s];
    long long* row = trace != nullptr ? trace + (static_cast<std::int64_t>(b) * n_layers + s) * kTraceFields : nullptr;
    long long starved = 0;
    if (kWait && !kTagged && s > 0) {  // every block, with tiles or not: none may count a layer before the one before is done
      if (threadIdx.x == 0) {
        const long long start = clock64();
        while (counter_load(counter) < target) {
          if (clock64() - start > kStreamSpinLimit) __trap();
          if (options & 1) __nanosleep(64);
        }
      }
      consumers_sync<kStreamWarps * 32>();
    }
    if (row != nullptr && threadIdx.x == 0) row[0] = now_ns();
    if (b * 16 < n) {
      if (kTagged && s > 0) {
        for (int j = static_cast<int>(threadIdx.x); j < k / 4; j += kStreamWarps * 32) {
          const long long start = clock64();
          uint4 w = tagged_load4(tags + prev_offset + 4 * j);
          while ((w.x >> 16) != epoch || (w.y >> 16) != epoch || (w.z >> 16) != epoch || (w.w >> 16) != epoch) {
            if (clock64() - start > kStreamSpinLimit) __trap();
            w = tagged_load4(tags + prev_offset + 4 * j);
          }
          reinterpret_cast<uint2*>(xs)[j] = make_uint2((w.x & 0xffffu) | (w.y << 16), (w.z & 0xffffu) | (w.w << 16));
        }
      } else {
        for (int j = static_cast<int>(threadIdx.x); j < k / 8; j += kStreamWarps * 32) {
          reinterpret_cast<uint4*>(xs)[j] = __ldcg(reinterpret_cast<const uint4*>(x) + j);
        }
      }
      consumers_sync<kStreamWarps * 32>();
      if (row != nullptr && threadIdx.x == 0) row[1] = now_ns();
      for (int tile = b; tile * 16 < n; tile += blocks) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int seg = 0; seg < k / kStreamSegment; ++seg, ++i) {
          const unsigned stage = i % static_cast<unsigned>(stages);
          const long long t0 = row != nullptr ? now_ns() : 0;
          stage_wait(&full[stage], (i / static_cast<unsigned>(stages)) & 1u);
          if (row != nullptr) starved += now_ns() - t0;
          const unsigned char* st = ring + static_cast<std::size_t>(stage) * kStreamStageBytes;
          const int col = (warp * kStreamVec * kLinearChunk + 8 * kStreamVec * t) * static_cast<int>(sizeof(T));
          const auto* wl = reinterpret_cast<const uint4*>(st + g * kStreamRowBytes + col);
          const auto* wh = reinterpret_cast<const uint4*>(st + (g + 8) * kStreamRowBytes + col);
          const auto* xv = reinterpret_cast<const uint4*>(xs + seg * kStreamSegment + warp * kStreamVec * kLinearChunk +
                                                          8 * kStreamVec * t);
#pragma unroll
          for (int v = 0; v < kStreamVec; ++v) linear_mma_words<T>(wl[v], wh[v], xv[v], acc);
          __syncwarp();
          if (lane == 0) stage_arrive(&empty[stage]);
        }
        partial[warp][2 * t][g] = acc[0];
        partial[warp][2 * t + 1][g] = acc[1];
        partial[warp][2 * t][g + 8] = acc[2];
        partial[warp][2 * t + 1][g + 8] = acc[3];
        consumers_sync<kStreamWarps * 32>();
        if (threadIdx.x < 16) {
          const int c = static_cast<int>(threadIdx.x);
          float sum = 0.0f;
#pragma unroll
          for (int w = 0; w < kStreamWarps; ++w) sum += partial[w][0][c];
          const auto* bias = static_cast<const T*>(layers.bias[s]);
          sum += bias != nullptr ? to_float(bias[tile * 16 + c]) : 0.0f;
          if (layers.k[s] < 0) sum = fmaxf(sum, 0.0f);
          const T value = from_float<T>(sum);
          static_cast<T*>(layers.out[s])[tile * 16 + c] = value;
          if (kTagged) {
            unsigned short bits;
            memcpy(&bits, &value, sizeof(bits));
            tagged_store(tags + offset + tile * 16 + c, bits | (epoch << 16));
          }
        }
        consumers_sync<kStreamWarps * 32>();  // partial and xs free again; the outputs written
      }
    }
    if (row != nullptr && threadIdx.x == 0) {
      row[2] = now_ns();
      row[5] = starved;
      if (b * 16 >= n) row[1] = row[2];
    }
    if (kWait && !kTagged && s + 1 < n_layers && threadIdx.x == 0) {
      const long long t0 = row != nullptr ? now_ns() : 0;
      const unsigned long long old = counter_add(counter);
      target = (old / static_cast<unsigned long long>(blocks) + 1) * static_cast<unsigned long long>(blocks);
      if (row != nullptr) row[6] = now_ns() - t0;
    }
    x = static_cast<const T*>(layers.out[s]);
    prev_offset = offset;
    offset += n;
  }
#endif
}

}  // namespace kernels

namespace {

template <typename T, bool kWait, bool kTagged>
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
  auto* kernel = kernels::decode_chain_streamed<T, kWait, kTagged>;
  int optin = 0;
  GPUOPT_CHECK_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, p.device));
  cudaFuncAttributes attributes = {};
  GPUOPT_CHECK_CUDA(cudaFuncGetAttributes(&attributes, kernel));
  const auto fixed = static_cast<std::int64_t>(kernels::kStreamMaxK) * 2 + 128;  // the input, the barriers' line
  const std::int64_t room = static_cast<std::int64_t>(optin) - static_cast<std::int64_t>(attributes.sharedSizeBytes);
  const auto most = static_cast<int>((room - fixed) / (kernels::kStreamStageBytes + 16));
  GPUOPT_CHECK_VALUE(most >= 2, "decode_chain: shared memory holds fewer than two stages (", optin, " bytes a block)");
  const int stages = p.stages > 0 ? (p.stages < most ? p.stages : most) : most;
  const std::size_t bytes = static_cast<std::size_t>((2 * stages * 8 + 127) / 128 * 128) +
                            static_cast<std::size_t>(stages) * kernels::kStreamStageBytes + kernels::kStreamMaxK * 2;
  GPUOPT_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  int per_sm = 0;
  GPUOPT_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (kernels::kStreamWarps + 1) * 32,
                                                                  bytes));
  GPUOPT_CHECK(per_sm >= 1, "decode_chain: the kernel fits no block on an SM with ", bytes, " bytes of shared memory");
  int sms = 0;
  GPUOPT_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(sms));
  config.blockDim = dim3((kernels::kStreamWarps + 1) * 32);
  config.dynamicSmemBytes = bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeCooperative;
  attribute[0].val.cooperative = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  const cudaError_t status =
      cudaLaunchKernelEx(&config, kernel, layers, p.n_layers, p.counter, stages, p.trace, p.options, p.tags);
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
  GPUOPT_CHECK_VALUE(p.counter != nullptr || !p.wait, "decode_chain: counter must not be null");
  GPUOPT_CHECK_VALUE(hopper_code_runs(p.device), "decode_chain: needs compute capability 9.0+ and this build's code for it");
  for (int s = 0; s < p.n_layers; ++s) {
    GPUOPT_CHECK_VALUE(p.k[s] % kernels::kStreamSegment == 0 && p.k[s] > 0 && p.k[s] <= kernels::kStreamMaxK &&
                           p.n[s] >= 16 && p.n[s] % 16 == 0 && (s == 0 || p.k[s] <= p.n[s - 1]),
                       "decode_chain: layer ", s, " has n=", p.n[s], ", k=", p.k[s], "; n must be a multiple of 16, ",
                       "k a multiple of ", kernels::kStreamSegment, " up to ", kernels::kStreamMaxK,
                       " and at most the layer before's n");
  }
  GPUOPT_CHECK_VALUE(p.tags != nullptr || (p.options & 2) == 0, "decode_chain: the tagged form needs tags");
  const bool tagged = p.wait && (p.options & 2) != 0;
  if (p.type == ActivationType::kFloat16) {
    tagged ? launch_chain<__half, true, true>(p, stream)
    : p.wait ? launch_chain<__half, true, false>(p, stream) : launch_chain<__half, false, false>(p, stream);
  } else {
    tagged ? launch_chain<__nv_bfloat16, true, true>(p, stream)
    : p.wait ? launch_chain<__nv_bfloat16, true, false>(p, stream) : launch_chain<__nv_bfloat16, false, false>(p, stream);
  }
}

}  // namespace gpuopt::cuda
