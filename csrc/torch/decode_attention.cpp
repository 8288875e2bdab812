// gpuopt::decode_attention, a torch operator registered like those of ops.cpp (a fragment of the
// `gpuopt` library that ops.cpp defines):
//
//   gpuopt::decode_attention(Tensor q, Tensor k, Tensor v, Tensor? mask=None, float? scale=None)
//       -> Tensor
//       Attention of one query token: q [B, H, 1, D], k and v [B, Hkv, L, D] (H a multiple of Hkv:
//       query head h reads KV head h / (H / Hkv)), all of one dtype (float16, bfloat16 or
//       float32); mask a bool tensor broadcastable to [B, H, 1, L] (True: attend), None for every
//       key; scale multiplies the dot products (None: 1 / sqrt(D)). Returns [B, 1, H, D] in q's
//       dtype -- the layout a Hugging Face attention function returns -- with a query that no key
//       may attend to given zeros.
//
//   gpuopt::decode_attention_append(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k,
//       Tensor v, Tensor position, Tensor? mask=None, float? scale=None, bool causal=False) -> Tensor
//       The same attention after writing the new token's key and value (k and v [B, Hkv, 1, D]) into
//       the caches at row `position` (an int64 tensor of one element on their device) -- a static KV
//       cache's update and the decode step's attention in one kernel. The mask must let the new row
//       through. causal: only rows [0, position] are attended (with the mask, if any, as well) -- a
//       decode step's causal mask without a mask tensor; the kernel then reads no row past position.
//       On the CPU a position outside the cache is an IndexError; on CUDA (where checking it would
//       synchronize) the kernel writes nothing (causal: a negative position attends to no key and
//       gives zeros, one past the end to the whole cache), and the reference path (other head
//       sizes, strided rows) stops at index_copy_'s device-side assertion.
//
// CUDA: gpuopt's decode kernel (gpuopt/cuda.h, decode_attention; a long cache split over several
// blocks per head, their parts in a workspace from torch's allocator) where it applies (D 32, 64, 128
// or 256, aligned rows), else the same float32 reference as the CPU kernel. Capturable in a CUDA
// graph. Meta: shapes only.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "device.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {

// The operator and its cache arguments, as the messages name them.
struct Names {
  const char* op;
  const char* k;
  const char* v;
};
constexpr Names kAttention{"decode_attention", "k", "v"};
constexpr Names kAppend{"decode_attention_append", "k_cache", "v_cache"};

// Every kernel checks the same (Meta included, so that tracing raises what running would).
void check_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const std::optional<at::Tensor>& mask, std::optional<double> scale, const Names& n = kAttention) {
  const at::ScalarType dtype = q.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat, n.op,
                   ": q must be float16, bfloat16 or float32, got ", dtype_name(dtype));
  TORCH_CHECK_TYPE(k.scalar_type() == dtype && v.scalar_type() == dtype, n.op, ": ", n.k, " and ", n.v,
                   " must have q's dtype (", dtype_name(dtype), "), got ", dtype_name(k.scalar_type()), " and ",
                   dtype_name(v.scalar_type()));
  TORCH_CHECK_VALUE(q.dim() == 4 && q.sym_size(2) == 1, n.op,
                    ": q must have shape [batch, heads, 1, head_dim] (one query token), got sizes ",
                    q.sym_sizes());
  TORCH_CHECK_VALUE(k.dim() == 4 && v.sym_sizes() == k.sym_sizes(), n.op, ": ", n.k, " and ", n.v,
                    " must have one shape [batch, kv_heads, keys, head_dim], got sizes ", k.sym_sizes(), " and ",
                    v.sym_sizes());
  TORCH_CHECK_VALUE(k.sym_size(0) == q.sym_size(0) && k.sym_size(3) == q.sym_size(3), n.op, ": ", n.k,
                    "'s batch and head_dim must equal q's, got q sizes ", q.sym_sizes(), " and ", n.k,
                    " sizes ", k.sym_sizes());
  TORCH_CHECK_VALUE(k.sym_size(1) >= 1 && q.sym_size(1) % k.sym_size(1) == 0, n.op, ": q's heads must be a multiple of ",
                    n.k, "'s kv_heads, got ", q.sym_size(1), " and ", k.sym_size(1));
  TORCH_CHECK_VALUE(k.sym_size(2) >= 1, n.op, ": ", n.k, " must hold at least one key, got sizes ", k.sym_sizes());
  TORCH_CHECK_VALUE(k.device() == q.device() && v.device() == q.device(), n.op, ": ", n.k, " and ", n.v,
                    " must be on q's device (", q.device(), "), got ", k.device(), " and ", v.device());
  if (mask.has_value()) {
    TORCH_CHECK_TYPE(mask->scalar_type() == at::kBool, n.op,
                     ": mask must be bool (True: attend), got ", dtype_name(mask->scalar_type()));
    TORCH_CHECK_VALUE(mask->device() == q.device(), n.op, ": mask must be on q's device (", q.device(),
                      "), got ", mask->device());
    const bool shape_ok = mask->dim() == 4 &&
                          (mask->sym_size(0) == 1 || mask->sym_size(0) == q.sym_size(0)) &&
                          (mask->sym_size(1) == 1 || mask->sym_size(1) == q.sym_size(1)) &&
                          mask->sym_size(2) == 1 && mask->sym_size(3) == k.sym_size(2);
    TORCH_CHECK_VALUE(shape_ok, n.op, ": mask must be broadcastable to [batch, heads, 1, keys] = [",
                      q.sym_size(0), ", ", q.sym_size(1), ", 1, ", k.sym_size(2), "], got sizes ",
                      mask->sym_sizes());
  }
  if (scale.has_value()) {
    TORCH_CHECK_VALUE(std::isfinite(*scale), n.op, ": scale must be finite, got ", *scale);
  }
}

double scale_of(const at::Tensor& q, std::optional<double> scale) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
}

// softmax(scale * q k^T, masked) v in float32, as [B, 1, H, D] in q's dtype.
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<at::Tensor>& mask, double scale) {
  const std::int64_t group = q.size(1) / k.size(1);
  at::Tensor kf = k.to(at::kFloat);
  at::Tensor vf = v.to(at::kFloat);
  if (group > 1) {
    kf = at::repeat_interleave(kf, group, 1);
    vf = at::repeat_interleave(vf, group, 1);
  }
  at::Tensor scores = at::matmul(q.to(at::kFloat), kf.transpose(-1, -2)).mul_(scale);  // [B, H, 1, L]
  at::Tensor probs;
  if (mask.has_value()) {
    // Masked rows take no part, whatever they hold (the kernel never reads them): a NaN or inf there
    // would otherwise reach the output through 0 * NaN in the product with V.
    vf = vf.masked_fill(mask->logical_not().transpose(-1, -2), 0.0);
    scores.masked_fill_(mask->logical_not(), -std::numeric_limits<float>::infinity());
    probs = at::softmax(scores, -1);
    // A row with every key masked is NaN after the softmax: zeros instead, as the kernel gives.
    probs = at::where(mask->any(-1, /*keepdim=*/true), probs, at::zeros_like(probs));
  } else {
    probs = at::softmax(scores, -1);
  }
  return at::matmul(probs, vf).transpose(1, 2).contiguous().to(q.scalar_type());
}

// decode_attention_append's new rows and position, checked against the caches (after check_args).
struct Append {
  const at::Tensor& k;
  const at::Tensor& v;
  const at::Tensor& position;
};

void check_append(const at::Tensor& k_cache, const Append& a) {
  const char* op = kAppend.op;
  TORCH_CHECK_TYPE(a.k.scalar_type() == k_cache.scalar_type() && a.v.scalar_type() == k_cache.scalar_type(), op,
                   ": k and v must have the caches' dtype (", dtype_name(k_cache.scalar_type()), "), got ",
                   dtype_name(a.k.scalar_type()), " and ", dtype_name(a.v.scalar_type()));
  const bool shape_ok = a.k.dim() == 4 && a.v.sym_sizes() == a.k.sym_sizes() &&
                        a.k.sym_size(0) == k_cache.sym_size(0) && a.k.sym_size(1) == k_cache.sym_size(1) &&
                        a.k.sym_size(2) == 1 && a.k.sym_size(3) == k_cache.sym_size(3);
  TORCH_CHECK_VALUE(shape_ok, op, ": k and v must have shape [batch, kv_heads, 1, head_dim] = [",
                    k_cache.sym_size(0), ", ", k_cache.sym_size(1), ", 1, ", k_cache.sym_size(3),
                    "] (one new token), got sizes ", a.k.sym_sizes(), " and ", a.v.sym_sizes());
  TORCH_CHECK_TYPE(a.position.scalar_type() == at::kLong, op, ": position must be int64, got ",
                   dtype_name(a.position.scalar_type()));
  TORCH_CHECK_VALUE(a.position.sym_numel() == 1, op, ": position must hold one element, got sizes ",
                    a.position.sym_sizes());
  TORCH_CHECK_VALUE(a.k.device() == k_cache.device() && a.v.device() == k_cache.device() &&
                        a.position.device() == k_cache.device(),
                    op, ": k, v and position must be on the caches' device (", k_cache.device(), "), got ",
                    a.k.device(), ", ", a.v.device(), " and ", a.position.device());
}

// decode_attention_append's checks, the same for each of its kernels.
Append checked_append(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& position, const std::optional<at::Tensor>& mask,
                      std::optional<double> scale) {
  check_args(q, k_cache, v_cache, mask, scale, kAppend);
  const Append a{k, v, position};
  check_append(k_cache, a);
  return a;
}

// The update without the kernel: the rows written by index_copy_ (on CUDA a position outside the
// cache is its device-side assertion; the kernel path writes nothing).
void write_rows(const at::Tensor& k_cache, const at::Tensor& v_cache, const Append& a) {
  const at::Tensor index = a.position.reshape({1});
  k_cache.index_copy_(2, index, a.k);
  v_cache.index_copy_(2, index, a.v);
}

// The mask the reference attends with: `mask`, and with causal the rows [0, position] only (computed
// on the position's device: no synchronization).
std::optional<at::Tensor> reference_mask(const at::Tensor& k_cache, const at::Tensor& position,
                                         const std::optional<at::Tensor>& mask, bool causal) {
  if (!causal) return mask;
  at::Tensor rows = at::arange(k_cache.size(2), position.options()).le(position.reshape({})).view({1, 1, 1, -1});
  return mask.has_value() ? mask->logical_and(rows) : rows;
}

at::Tensor decode_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& mask, std::optional<double> scale) {
  check_args(q, k, v, mask, scale);
  return reference(q, k, v, mask, scale_of(q, scale));
}

at::Tensor decode_attention_append_cpu(const at::Tensor& q, at::Tensor& k_cache, at::Tensor& v_cache,
                                       const at::Tensor& k, const at::Tensor& v, const at::Tensor& position,
                                       const std::optional<at::Tensor>& mask, std::optional<double> scale,
                                       bool causal) {
  const Append a = checked_append(q, k_cache, v_cache, k, v, position, mask, scale);
  const std::int64_t row = position.item<std::int64_t>();  // a host value on the CPU
  TORCH_CHECK_INDEX(row >= 0 && row < k_cache.size(2), kAppend.op, ": position must be in [0, ", k_cache.size(2),
                    ") (the caches' keys), got ", row);
  write_rows(k_cache, v_cache, a);
  return reference(q, k_cache, v_cache, reference_mask(k_cache, position, mask, causal), scale_of(q, scale));
}

at::Tensor run_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const std::optional<at::Tensor>& mask, std::optional<double> scale, const Append* append,
                    bool causal = false) {
#ifdef GPUOPT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(q.device());
  const std::int64_t batch = q.size(0), heads = q.size(1), dim = q.size(3);
  at::Tensor out = at::empty({batch, 1, heads, dim}, q.options());
  cuda::DecodeAttentionParams p;
  p.type = activation_type(q.scalar_type());
  p.q = q.const_data_ptr();
  p.k = k.const_data_ptr();
  p.v = v.const_data_ptr();
  p.out = out.mutable_data_ptr();
  p.batch = batch;
  p.heads = heads;
  p.kv_heads = k.size(1);
  p.keys = k.size(2);
  p.head_dim = dim;
  // A dimension of size 1 is only ever read at index 0: its stride, whatever it is, is taken as 0
  // (so that an odd stride there does not fail the kernel's alignment check).
  const auto stride = [](const at::Tensor& t, int d) { return t.size(d) == 1 ? 0 : t.stride(d); };
  p.q_stride_b = stride(q, 0);
  p.q_stride_h = stride(q, 1);
  p.k_stride_b = stride(k, 0);
  p.k_stride_h = stride(k, 1);
  p.k_stride_l = stride(k, 2);
  p.v_stride_b = stride(v, 0);
  p.v_stride_h = stride(v, 1);
  p.v_stride_l = stride(v, 2);
  if (mask.has_value()) {
    p.mask = mask->const_data_ptr<bool>();
    p.mask_stride_b = stride(*mask, 0);
    p.mask_stride_h = stride(*mask, 1);
    p.mask_stride_l = stride(*mask, 3);
  }
  p.scale = static_cast<float>(scale_of(q, scale));
  p.device = q.device().index();
  p.causal = causal;
  bool contiguous_rows = q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1;
  if (append != nullptr) {
    p.k_new = append->k.const_data_ptr();
    p.v_new = append->v.const_data_ptr();
    p.k_new_stride_b = stride(append->k, 0);
    p.k_new_stride_h = stride(append->k, 1);
    p.v_new_stride_b = stride(append->v, 0);
    p.v_new_stride_h = stride(append->v, 1);
    p.position = append->position.const_data_ptr<std::int64_t>();
    contiguous_rows = contiguous_rows && append->k.stride(3) == 1 && append->v.stride(3) == 1;
  }
  // A strided head_dim (or unaligned rows, another head_dim) takes the reference.
  if (contiguous_rows && cuda::decode_attention_supported(p)) {
    // Split-KV's workspace from torch's caching allocator: capturable, and reused across calls.
    const std::int64_t floats = cuda::decode_attention_workspace(p);
    at::Tensor workspace;
    if (floats > 0) {
      workspace = at::empty({floats}, q.options().dtype(at::kFloat));
      p.workspace = workspace.mutable_data_ptr<float>();
    }
    cuda::decode_attention(p, c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
    return out;
  }
  if (append == nullptr) return reference(q, k, v, mask, scale_of(q, scale));
  write_rows(k, v, *append);
  return reference(q, k, v, reference_mask(k, append->position, mask, causal), scale_of(q, scale));
#else
  (void)mask;
  (void)scale;
  (void)append;
  (void)causal;
  require_cuda("gpuopt::decode_attention on a CUDA tensor");
  return {};
#endif
}

at::Tensor decode_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::optional<at::Tensor>& mask, std::optional<double> scale) {
  check_args(q, k, v, mask, scale);
  return run_cuda(q, k, v, mask, scale, nullptr);
}

at::Tensor decode_attention_append_cuda(const at::Tensor& q, at::Tensor& k_cache, at::Tensor& v_cache,
                                        const at::Tensor& k, const at::Tensor& v, const at::Tensor& position,
                                        const std::optional<at::Tensor>& mask, std::optional<double> scale,
                                        bool causal) {
  const Append a = checked_append(q, k_cache, v_cache, k, v, position, mask, scale);
  // Several blocks write the caches: rows that overlap in memory (an expanded cache) would race.
  at::assert_no_internal_overlap(k_cache);
  at::assert_no_internal_overlap(v_cache);
  at::assert_no_overlap(k_cache, v_cache);
  at::assert_no_overlap(k_cache, k);
  at::assert_no_overlap(v_cache, v);
  return run_cuda(q, k_cache, v_cache, mask, scale, &a, causal);
}

at::Tensor decode_attention_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::optional<at::Tensor>& mask, std::optional<double> scale) {
  check_args(q, k, v, mask, scale);
  return at::empty_symint({q.sym_size(0), 1, q.sym_size(1), q.sym_size(3)}, q.options());
}

at::Tensor decode_attention_append_meta(const at::Tensor& q, at::Tensor& k_cache, at::Tensor& v_cache,
                                        const at::Tensor& k, const at::Tensor& v, const at::Tensor& position,
                                        const std::optional<at::Tensor>& mask, std::optional<double> scale,
                                        bool /*causal*/) {
  checked_append(q, k_cache, v_cache, k, v, position, mask, scale);
  return at::empty_symint({q.sym_size(0), 1, q.sym_size(1), q.sym_size(3)}, q.options());
}

}  // namespace
}  // namespace gpuopt::torch_ext

TORCH_LIBRARY_FRAGMENT(gpuopt, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor? mask=None, float? scale=None) -> Tensor");
  m.def(
      "decode_attention_append(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, "
      "Tensor position, Tensor? mask=None, float? scale=None, bool causal=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(gpuopt, CPU, m) {
  m.impl("decode_attention", &gpuopt::torch_ext::decode_attention_cpu);
  m.impl("decode_attention_append", &gpuopt::torch_ext::decode_attention_append_cpu);
}

TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("decode_attention", &gpuopt::torch_ext::decode_attention_cuda);
  m.impl("decode_attention_append", &gpuopt::torch_ext::decode_attention_append_cuda);
}

TORCH_LIBRARY_IMPL(gpuopt, Meta, m) {
  m.impl("decode_attention", &gpuopt::torch_ext::decode_attention_meta);
  m.impl("decode_attention_append", &gpuopt::torch_ext::decode_attention_append_meta);
}
