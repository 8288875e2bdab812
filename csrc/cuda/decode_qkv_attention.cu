#include <cstdint>
#include <limits>

#include "decode_qkv_attention_kernels.cuh"
#include "linear_epilogue.cuh"
#include "pdl.cuh"
#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// The projection's layout: 16 warps, two 16-byte loads of each weight row per lane and chunk (decode_linear's
// choice for k >= 2048), one batch of loads a warp at k = 2048.
constexpr int kWarps = 16;
constexpr int kVec = 2;
constexpr std::int64_t kMinK = 2048;
// One block attends a head: longer caches are split by decode_attention (its kSplitKeys).
constexpr std::int64_t kMaxKeys = 1024;

template <typename T, bool kStats, int D>
void launch(const DecodeQkvAttentionParams& p, cudaStream_t stream) {
  kernels::QkvAttentionArgs<T> a{};
  const std::int64_t width = p.heads * D;  // of each of q, k and v
  auto* qkv = static_cast<T*>(p.qkv);
  auto& at = a.attn;
  at.q = qkv;
  at.k = static_cast<const T*>(p.k_cache);
  at.v = static_cast<const T*>(p.v_cache);
  at.mask = nullptr;
  at.out = static_cast<T*>(p.out);
  at.partial = nullptr;
  at.heads = static_cast<int>(p.heads);
  at.group = 1;
  at.keys = static_cast<int>(p.keys);
  at.causal = true;
  at.qb = 3 * width;
  at.qh = D;
  at.kb = p.heads * p.keys * D;
  at.kh = p.keys * D;
  at.kl = D;
  at.vb = at.kb;
  at.vh = at.kh;
  at.vl = at.kl;
  at.mb = at.mh = at.ml = 0;
  at.scale_log2 = p.scale * 1.4426950408889634f;  // log2(e): the kernel works in base 2
  at.k_new = qkv + width;
  at.v_new = qkv + 2 * width;
  at.nkb = at.nvb = 3 * width;
  at.nkh = at.nvh = D;
  at.position = reinterpret_cast<const long long*>(p.position);
  a.x = static_cast<const T*>(p.x);
  a.weight = static_cast<const T*>(p.weight);
  a.bias = static_cast<const T*>(p.bias);
  a.qkv = qkv;
  a.rows = static_cast<int>(p.rows);
  a.k = p.k;
  a.counters = p.counters;
  kernels::LinearEpilogue<T> ep;
  ep.norm = static_cast<int>(p.norm);
  ep.norm_sum = p.norm_sum;
  ep.eps = p.eps;
  const auto blocks = static_cast<unsigned>(p.heads * 3 * D / 16);
  launch_programmatic(kernels::decode_qkv_attention<T, kWarps, kVec, kStats, D>, dim3(blocks), dim3(kWarps * 32),
                      p.device, stream, a, ep);
}

template <typename T, bool kStats>
void launch_dim(const DecodeQkvAttentionParams& p, cudaStream_t stream) {
  if (p.head_dim == 64) {
    launch<T, kStats, 64>(p, stream);
  } else {
    launch<T, kStats, 128>(p, stream);
  }
}

template <typename T>
void launch_norm(const DecodeQkvAttentionParams& p, cudaStream_t stream) {
  if (p.norm != LinearNorm::kNone) {
    launch_dim<T, true>(p, stream);
  } else {
    launch_dim<T, false>(p, stream);
  }
}

}  // namespace

bool decode_qkv_attention_supported(const DecodeQkvAttentionParams& p) {
  return (p.type == ActivationType::kFloat16 || p.type == ActivationType::kBFloat16) &&
         (p.head_dim == 64 || p.head_dim == 128) && p.rows >= 1 && p.rows <= kDecodeLinearMaxRows &&
         p.k >= kMinK && p.k % (kVec * kDecodeLinearChunk) == 0 && p.keys >= 1 && p.keys <= kMaxKeys &&
         p.heads >= 1 && p.heads * 3 * p.head_dim / 16 <= std::numeric_limits<int>::max() && aligned16(p.x) &&
         aligned16(p.weight) && aligned16(p.qkv) && aligned16(p.out) && aligned16(p.k_cache) &&
         aligned16(p.v_cache) && mma_code_runs(p.device);
}

void decode_qkv_attention(const DecodeQkvAttentionParams& p, cudaStream_t stream) {
  GPUOPT_CHECK_VALUE(decode_qkv_attention_supported(p),
                     "decode_qkv_attention: needs float16 or bfloat16, head_dim 64 or 128, 1 <= rows <= ",
                     kDecodeLinearMaxRows, ", k a multiple of 64 and >= ", kMinK, ", 1 <= keys <= ", kMaxKeys,
                     ", 16-byte aligned data and compute capability 8.0+; got rows=", p.rows, ", k=", p.k,
                     ", heads=", p.heads, ", head_dim=", p.head_dim, ", keys=", p.keys);
  GPUOPT_CHECK_VALUE(p.position != nullptr && p.counters != nullptr,
                     "decode_qkv_attention: position and counters must not be null");
  GPUOPT_CHECK_VALUE(p.norm != LinearNorm::kLayer || p.norm_sum != nullptr,
                     "decode_qkv_attention: a folded layer norm needs norm_sum (the weight's row sums)");
  if (p.type == ActivationType::kFloat16) {
    launch_norm<__half>(p, stream);
  } else {
    launch_norm<__nv_bfloat16>(p, stream);
  }
}

}  // namespace gpuopt::cuda
