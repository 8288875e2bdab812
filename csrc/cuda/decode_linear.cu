#include <atomic>
#include <cstdint>

#include "decode_linear_kernels.cuh"
#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// What `device` runs, asked once per device (made current for the query): kMma, the tensor-core
// kernel (compute capability 8.0+ and this binary's code for the device built from PTX 8.0+: a build
// for 7.5 alone would JIT its compute_75 PTX there, whose MMA is compiled out), and kPrefetch, the L2
// bulk prefetch (9.0+, code from PTX 9.0+).
constexpr int kKnown = 1, kMma = 2, kPrefetch = 4;
int capabilities(int device) {
  constexpr int kDevices = 64;
  static std::atomic<int> cache[kDevices] = {};
  if (device >= 0 && device < kDevices) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known != 0) return known;
  }
  const int major = device_attribute(cudaDevAttrComputeCapabilityMajor, device);
  int caps = kKnown;
  if (major >= 8) {
    int current = 0;
    GPUOPT_CHECK_CUDA(cudaGetDevice(&current));
    if (current != device) GPUOPT_CHECK_CUDA(cudaSetDevice(device));
    cudaFuncAttributes attributes = {};
    const cudaError_t status = cudaFuncGetAttributes(&attributes, kernels::decode_linear_mma<__half, 4, false>);
    if (current != device) GPUOPT_CHECK_CUDA(cudaSetDevice(current));
    GPUOPT_CHECK_CUDA(status);
    if (attributes.ptxVersion >= 80) caps |= kMma;
    if (major >= 9 && attributes.ptxVersion >= 90) caps |= kPrefetch;
  }
  if (device >= 0 && device < kDevices) cache[device].store(caps, std::memory_order_relaxed);
  return caps;
}

// One batch of chunks per warp, 4 to 32 warps: k = 2048 gives 16 warps, 8192 gives 32.
int warps_for(const DecodeLinearParams& p) {
  if (p.warps != 0) return p.warps;
  const std::int64_t want = p.k / kDecodeLinearChunk / kernels::kLinearBatch;
  return want >= 32 ? 32 : want >= 16 ? 16 : want >= 8 ? 8 : 4;
}

template <typename T, int kWarps, bool kRelu>
void launch(const DecodeLinearParams& p, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((p.n + 15) / 16);
  const bool prefetch = p.prefetch != nullptr && p.prefetch_bytes >= 16 && decode_linear_prefetches(p.device);
  kernels::decode_linear_mma<T, kWarps, kRelu><<<blocks, kWarps * 32, 0, stream>>>(
      static_cast<const T*>(p.x), static_cast<const T*>(p.weight), static_cast<const T*>(p.bias),
      static_cast<T*>(p.out), static_cast<int>(p.rows), p.n, p.k,
      prefetch ? static_cast<const char*>(p.prefetch) : nullptr, prefetch ? p.prefetch_bytes : 0);
  GPUOPT_CHECK_LAUNCH();
}

template <typename T, bool kRelu>
void launch_warps(const DecodeLinearParams& p, cudaStream_t stream) {
  switch (warps_for(p)) {
    case 4: launch<T, 4, kRelu>(p, stream); return;
    case 8: launch<T, 8, kRelu>(p, stream); return;
    case 16: launch<T, 16, kRelu>(p, stream); return;
    default: launch<T, 32, kRelu>(p, stream); return;
  }
}

template <typename T>
void launch_activation(const DecodeLinearParams& p, cudaStream_t stream) {
  if (p.activation == LinearActivation::kRelu) {
    launch_warps<T, true>(p, stream);
  } else {
    launch_warps<T, false>(p, stream);
  }
}

}  // namespace

bool decode_linear_supported(const DecodeLinearParams& p) {
  return (p.type == ActivationType::kFloat16 || p.type == ActivationType::kBFloat16) && p.rows >= 1 &&
         p.rows <= kDecodeLinearMaxRows && p.n >= 1 && p.k > 0 && p.k % kDecodeLinearChunk == 0 &&
         aligned16(p.x) && aligned16(p.weight) && (capabilities(p.device) & kMma) != 0;
}

bool decode_linear_prefetches(int device) {
  return (capabilities(device) & kPrefetch) != 0;
}

void decode_linear(const DecodeLinearParams& p, cudaStream_t stream) {
  GPUOPT_CHECK_VALUE(decode_linear_supported(p),
                     "decode_linear: needs float16 or bfloat16, 1 <= rows <= ", kDecodeLinearMaxRows,
                     ", n >= 1, k a positive multiple of ", kDecodeLinearChunk,
                     ", 16-byte aligned x and weight and compute capability 8.0+; got rows=", p.rows, ", n=", p.n,
                     ", k=", p.k, ", x at ", p.x, ", weight at ", p.weight);
  GPUOPT_CHECK_VALUE(p.warps == 0 || p.warps == 4 || p.warps == 8 || p.warps == 16 || p.warps == 32,
                     "decode_linear: warps must be 0 (chosen from k), 4, 8, 16 or 32; got ", p.warps);
  GPUOPT_CHECK_VALUE(p.out != nullptr, "decode_linear: out must not be null");
  GPUOPT_CHECK_VALUE(p.prefetch == nullptr || (aligned16(p.prefetch) && p.prefetch_bytes >= 0),
                     "decode_linear: prefetch must be 16-byte aligned with prefetch_bytes >= 0; got ",
                     p.prefetch, " and ", p.prefetch_bytes);
  if (p.type == ActivationType::kFloat16) {
    launch_activation<__half>(p, stream);
  } else {
    launch_activation<__nv_bfloat16>(p, stream);
  }
}

}  // namespace gpuopt::cuda
