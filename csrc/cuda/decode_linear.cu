#include <cstdint>

#include "decode_linear_kernels.cuh"
#include "linear_epilogue.cuh"
#include "pdl.cuh"
#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

static_assert(kernels::kLinearChunk == kDecodeLinearChunk, "the kernel's chunk is the one cuda.h documents");

// 16-byte loads per weight row, lane and chunk: forced by p.vector (where k allows), else 2 where k %
// 64 == 0 (a row's chunk is then 128 contiguous bytes, a whole L2 line), else 1.
int vector_for(const DecodeLinearParams& p) {
  const int v = p.vector != 0 ? p.vector : 2;
  return v == 4 && p.k % (4 * kDecodeLinearChunk) == 0 ? 4 : v >= 2 && p.k % (2 * kDecodeLinearChunk) == 0 ? 2 : 1;
}

// Warps per block: forced by p.warps, else one batch of loads per warp, 4 to 16 warps (k = 2048 and more
// give 16). Measured on the H100 in OPT-1.3B's decode step (static-graph-compile, every layer in one
// layout; benchmarks/llm_decode_layouts.py, results/llm_decode-layouts-*): 16 warps with 2 loads per row
// and chunk 1.459 ms per token, 8 warps 1.497, 8 warps with one load 1.649, cuBLAS 1.640; alone in a
// graph of 24 calls, 32 warps matched 16 for 2048 x 8192 only.
int warps_for(const DecodeLinearParams& p, int vector) {
  if (p.warps != 0) return p.warps;
  const std::int64_t want = p.k / (kDecodeLinearChunk * vector) / (kernels::kLinearLoads / vector);
  return want >= 16 ? 16 : want >= 8 ? 8 : 4;
}

template <typename T, int kWarps, int kVec, bool kStats>
void launch(const DecodeLinearParams& p, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((p.n + 15) / 16);
  launch_programmatic(kernels::decode_linear_mma<T, kWarps, kVec, kStats>, dim3(blocks), dim3(kWarps * 32), p.device,
                      stream, static_cast<const T*>(p.x), static_cast<const T*>(p.weight),
                      static_cast<const T*>(p.bias), static_cast<T*>(p.out), static_cast<int>(p.rows), p.n, p.k,
                      kernels::linear_epilogue<T>(p, p.activation == LinearActivation::kRelu));
}

template <typename T, int kVec, bool kStats>
void launch_warps(const DecodeLinearParams& p, cudaStream_t stream) {
  switch (warps_for(p, kVec)) {
    case 4: launch<T, 4, kVec, kStats>(p, stream); return;
    case 8: launch<T, 8, kVec, kStats>(p, stream); return;
    case 16: launch<T, 16, kVec, kStats>(p, stream); return;
    default: launch<T, 32, kVec, kStats>(p, stream); return;
  }
}

template <typename T, bool kStats>
void launch_vector(const DecodeLinearParams& p, cudaStream_t stream) {
  switch (vector_for(p)) {
    case 4: launch_warps<T, 4, kStats>(p, stream); return;
    case 2: launch_warps<T, 2, kStats>(p, stream); return;
    default: launch_warps<T, 1, kStats>(p, stream); return;
  }
}

// x's row statistics are taken in the kernel only for a folded norm.
template <typename T>
void launch_norm(const DecodeLinearParams& p, cudaStream_t stream) {
  if (p.norm != LinearNorm::kNone) {
    launch_vector<T, true>(p, stream);
  } else {
    launch_vector<T, false>(p, stream);
  }
}

}  // namespace

bool decode_linear_supported(const DecodeLinearParams& p) {
  return (p.type == ActivationType::kFloat16 || p.type == ActivationType::kBFloat16) && p.rows >= 1 &&
         p.rows <= kDecodeLinearMaxRows && p.n >= 1 && p.k > 0 && p.k % kDecodeLinearChunk == 0 &&
         aligned16(p.x) && aligned16(p.weight) && mma_code_runs(p.device);
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
  GPUOPT_CHECK_VALUE(p.vector == 0 || p.vector == 1 || p.vector == 2 || p.vector == 4,
                     "decode_linear: vector must be 0 (chosen), 1, 2 or 4; got ", p.vector);
  GPUOPT_CHECK_VALUE(p.norm != LinearNorm::kLayer || p.norm_sum != nullptr,
                     "decode_linear: a folded layer norm needs norm_sum (the weight's row sums)");
  if (p.type == ActivationType::kFloat16) {
    launch_norm<__half>(p, stream);
  } else {
    launch_norm<__nv_bfloat16>(p, stream);
  }
}

}  // namespace gpuopt::cuda
