#include <cmath>
#include <cstdint>
#include <limits>

#include "decode_attention_kernels.cuh"
#include "pdl.cuh"
#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Split-KV: only caches longer than this are split, into splits of at least this many keys.
constexpr std::int64_t kSplitKeys = 1024;

// Warps per block: enough groups for the keys (kUnroll keys each per pass), at most 16.
template <typename T, int D>
int warps_for(std::int64_t keys) {
  using R = kernels::AttnRow<T, D>;
  const std::int64_t per_warp = static_cast<std::int64_t>(R::kGroups) * R::kUnroll;
  const std::int64_t warps = (keys + per_warp - 1) / per_warp;
  return static_cast<int>(warps < kernels::kAttnMaxWarps ? warps : kernels::kAttnMaxWarps);
}

// Blocks per (batch, head) pair: 1, or for a cache longer than kSplitKeys, enough splits of at least
// kSplitKeys keys for two blocks per SM.
std::int64_t splits_for(const DecodeAttentionParams& p) {
  if (p.keys <= kSplitKeys) return 1;
  const std::int64_t pairs = p.batch * p.heads;
  if (pairs < 1) return 1;  // nothing to split (decode_attention_supported refuses it)
  const std::int64_t want = (2 * device_attribute(cudaDevAttrMultiProcessorCount, p.device) + pairs - 1) / pairs;
  const std::int64_t most = p.keys / kSplitKeys;
  const std::int64_t s = want < most ? want : most;
  return s > 1 ? s : 1;
}

template <typename T, int D>
void launch(const DecodeAttentionParams& p, cudaStream_t stream) {
  kernels::DecodeAttentionArgs<T> a{};
  a.q = static_cast<const T*>(p.q);
  a.k = static_cast<const T*>(p.k);
  a.v = static_cast<const T*>(p.v);
  a.mask = p.mask;
  a.out = static_cast<T*>(p.out);
  const std::int64_t splits = splits_for(p);
  a.partial = splits > 1 ? p.workspace : nullptr;
  a.heads = static_cast<int>(p.heads);
  a.group = static_cast<int>(p.heads / p.kv_heads);
  a.keys = static_cast<int>(p.keys);
  a.causal = p.causal;
  a.qb = p.q_stride_b;
  a.qh = p.q_stride_h;
  a.kb = p.k_stride_b;
  a.kh = p.k_stride_h;
  a.kl = p.k_stride_l;
  a.vb = p.v_stride_b;
  a.vh = p.v_stride_h;
  a.vl = p.v_stride_l;
  a.mb = p.mask_stride_b;
  a.mh = p.mask_stride_h;
  a.ml = p.mask_stride_l;
  a.scale_log2 = p.scale * 1.4426950408889634f;  // log2(e): the kernel works in base 2
  a.k_new = static_cast<const T*>(p.k_new);
  a.v_new = static_cast<const T*>(p.v_new);
  a.nkb = p.k_new_stride_b;
  a.nkh = p.k_new_stride_h;
  a.nvb = p.v_new_stride_b;
  a.nvh = p.v_new_stride_h;
  a.position = reinterpret_cast<const long long*>(p.position);
  const dim3 grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch), static_cast<unsigned>(splits));
  const dim3 threads(static_cast<unsigned>(warps_for<T, D>((p.keys + splits - 1) / splits) * 32));
  launch_programmatic(kernels::decode_attention<T, D>, grid, threads, p.device, stream, a);
  if (splits > 1) {
    launch_programmatic(kernels::decode_attention_combine<T, D>, dim3(grid.x, grid.y), dim3(D), p.device, stream,
                        p.workspace, a.out, a.heads, static_cast<int>(splits));
  }
}

template <typename T>
void launch_dim(const DecodeAttentionParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 32: launch<T, 32>(p, stream); break;
    case 64: launch<T, 64>(p, stream); break;
    case 128: launch<T, 128>(p, stream); break;
    default: launch<T, 256>(p, stream); break;
  }
}

std::int64_t element_bytes(ActivationType t) { return t == ActivationType::kFloat32 ? 4 : 2; }

}  // namespace

bool decode_attention_supported(const DecodeAttentionParams& p) {
  const std::int64_t vec = 16 / element_bytes(p.type);
  const auto rows_aligned = [vec](std::int64_t s) { return s % vec == 0; };
  const bool dim_ok = p.head_dim == 32 || p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256;
  const bool sizes_ok = p.batch >= 1 && p.batch <= 65535 && p.heads >= 1 &&
                        p.heads <= std::numeric_limits<int>::max() && p.kv_heads >= 1 &&
                        p.heads % p.kv_heads == 0 && p.keys >= 1 &&
                        p.keys <= std::numeric_limits<int>::max();
  const bool append_ok = p.k_new == nullptr ? !p.causal :
                         (p.v_new != nullptr && p.position != nullptr && aligned16(p.k_new) && aligned16(p.v_new) &&
                          rows_aligned(p.k_new_stride_b) && rows_aligned(p.k_new_stride_h) &&
                          rows_aligned(p.v_new_stride_b) && rows_aligned(p.v_new_stride_h));
  return dim_ok && sizes_ok && append_ok && aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && aligned16(p.out) &&
         rows_aligned(p.q_stride_b) && rows_aligned(p.q_stride_h) && rows_aligned(p.k_stride_b) &&
         rows_aligned(p.k_stride_h) && rows_aligned(p.k_stride_l) && rows_aligned(p.v_stride_b) &&
         rows_aligned(p.v_stride_h) && rows_aligned(p.v_stride_l);
}

std::int64_t decode_attention_workspace(const DecodeAttentionParams& p) {
  const std::int64_t splits = splits_for(p);
  return splits > 1 ? p.batch * p.heads * splits * (p.head_dim + 2) : 0;
}

void decode_attention(const DecodeAttentionParams& p, cudaStream_t stream) {
  GPUOPT_CHECK_VALUE(!p.causal || p.k_new != nullptr,
                     "decode_attention: causal=true bounds the keys by the appended row's position and needs "
                     "appending (k_new, v_new, position); got k_new=nullptr");
  GPUOPT_CHECK_VALUE(decode_attention_supported(p),
                     "decode_attention: needs head_dim 32, 64, 128 or 256, batch 1..65535, heads a multiple "
                     "of kv_heads, keys >= 1 and 16-byte aligned rows; got batch=", p.batch, ", heads=",
                     p.heads, ", kv_heads=", p.kv_heads, ", keys=", p.keys, ", head_dim=", p.head_dim);
  GPUOPT_CHECK_VALUE(std::isfinite(p.scale), "decode_attention: scale must be finite, got ", p.scale);
  GPUOPT_CHECK_VALUE(p.workspace != nullptr || decode_attention_workspace(p) == 0,
                     "decode_attention: a split-KV call needs a workspace of ", decode_attention_workspace(p),
                     " floats");
  switch (p.type) {
    case ActivationType::kFloat32: launch_dim<float>(p, stream); break;
    case ActivationType::kFloat16: launch_dim<__half>(p, stream); break;
    case ActivationType::kBFloat16: launch_dim<__nv_bfloat16>(p, stream); break;
  }
}

}  // namespace gpuopt::cuda
