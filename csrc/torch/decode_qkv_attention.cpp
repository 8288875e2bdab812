// gpuopt::decode_qkv_attention, a torch operator registered like those of ops.cpp (a fragment of the
// `gpuopt` library that ops.cpp defines):
//
//   gpuopt::decode_qkv_attention(Tensor x, Tensor weight, Tensor? bias, Tensor(a!) k_cache, Tensor(b!) v_cache,
//       Tensor position, Tensor(c!) counters, str norm="none", Tensor? norm_sum=None, float eps=1e-05,
//       float? scale=None) -> Tensor
//       An attention layer's decode step up to its output projection, for one new token: the fused
//       projection qkv = gpuopt::decode_linear(x, weight, bias, norm=norm, norm_sum=norm_sum, eps=eps) of x
//       [B, 1, K] with weight [3 H D, K] (q's rows, then k's, then v's; H and D the caches'), then
//       gpuopt::decode_attention_append(q, k_cache, v_cache, k, v, position, scale=scale, causal=True) with
//       q, k and v the thirds of qkv as [B, H, 1, D] and the caches [B, H, L, D]. Returns [B, 1, H, D].
//       counters: int32, at least H elements, zero, on x's device: the CUDA kernel's count of each head's
//       finished tiles, left zero.
//
// CUDA: one kernel (gpuopt/cuda.h, decode_qkv_attention) where it applies -- fp16/bf16, D 64 or 128, 1 to 8
// rows, K a multiple of 64 and at least 2048, caches of at most 1024 keys, contiguous aligned data, gpuopt's
// decode linear kernel not turned off -- else the two operators, as on the CPU. Capturable in a CUDA graph.
// Meta: shapes only.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "decode_linear.h"
#include "device.h"
#include "linear_epilogue.h"

#ifdef GPUOPT_WITH_CUDA
#include <ATen/MemoryOverlap.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {

constexpr const char* kOp = "decode_qkv_attention";

// The checks of what this operator adds to the two it is made of (which check the rest).
void check_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& k_cache, const at::Tensor& counters) {
  TORCH_CHECK_VALUE(x.dim() == 3 && x.sym_size(1) == 1, kOp,
                    ": x must have shape [batch, 1, K] (one new token), got sizes ", x.sym_sizes());
  TORCH_CHECK_VALUE(k_cache.dim() == 4, kOp, ": k_cache must have shape [batch, heads, keys, head_dim], got sizes ",
                    k_cache.sym_sizes());
  TORCH_CHECK_VALUE(k_cache.sym_size(0) == x.sym_size(0), kOp, ": k_cache must have x's batch (", x.sym_size(0),
                    "), got sizes ", k_cache.sym_sizes());
  const c10::SymInt rows = k_cache.sym_size(1) * k_cache.sym_size(3) * 3;
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.sym_size(0) == rows, kOp,
                    ": weight must have shape [3 * heads * head_dim, K] = [", rows,
                    ", K] (q's rows, then k's, then v's; heads and head_dim the caches'), got sizes ",
                    weight.sym_sizes());
  TORCH_CHECK_TYPE(counters.scalar_type() == at::kInt, kOp, ": counters must be int32, got ",
                   dtype_name(counters.scalar_type()));
  TORCH_CHECK_VALUE(counters.dim() == 1 && counters.sym_size(0) >= k_cache.sym_size(1), kOp,
                    ": counters must be 1-D with at least heads = ", k_cache.sym_size(1), " elements, got sizes ",
                    counters.sym_sizes());
  TORCH_CHECK_VALUE(counters.device() == x.device(), kOp, ": counters must be on x's device (", x.device(), "), got ",
                    counters.device());
}

// The operator as its two parts: gpuopt::decode_linear, then gpuopt::decode_attention_append.
at::Tensor composed(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                    at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& position, const std::string& norm,
                    const std::optional<at::Tensor>& norm_sum, double eps, std::optional<double> scale) {
  static const auto linear =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("gpuopt::decode_linear", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            const std::string&, const std::optional<at::Tensor>&, const std::string&,
                            const std::optional<at::Tensor>&, double)>();
  static const auto append =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("gpuopt::decode_attention_append", "")
          .typed<at::Tensor(const at::Tensor&, at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const std::optional<at::Tensor>&, std::optional<double>, bool)>();
  const at::Tensor qkv = linear.call(x, weight, bias, "none", std::nullopt, norm, norm_sum, eps);
  const std::int64_t batch = k_cache.size(0), heads = k_cache.size(1), dim = k_cache.size(3);
  const std::int64_t width = heads * dim;
  const auto part = [&](std::int64_t i) {
    return qkv.narrow(-1, i * width, width).view({batch, 1, heads, dim}).transpose(1, 2);
  };
  return append.call(part(0), k_cache, v_cache, part(1), part(2), position, std::nullopt, scale, true);
}

at::Tensor decode_qkv_attention_cpu(const at::Tensor& x, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, at::Tensor& k_cache, at::Tensor& v_cache,
                                    const at::Tensor& position, at::Tensor& counters, const std::string& norm,
                                    const std::optional<at::Tensor>& norm_sum, double eps,
                                    std::optional<double> scale) {
  check_args(x, weight, k_cache, counters);
  return composed(x, weight, bias, k_cache, v_cache, position, norm, norm_sum, eps, scale);
}

at::Tensor decode_qkv_attention_cuda(const at::Tensor& x, const at::Tensor& weight,
                                     const std::optional<at::Tensor>& bias, at::Tensor& k_cache, at::Tensor& v_cache,
                                     const at::Tensor& position, at::Tensor& counters, const std::string& norm,
                                     const std::optional<at::Tensor>& norm_sum, double eps,
                                     std::optional<double> scale) {
  check_args(x, weight, k_cache, counters);
#ifdef GPUOPT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(x.device());
  const at::ScalarType dtype = x.scalar_type();
  const bool same = weight.scalar_type() == dtype && k_cache.scalar_type() == dtype &&
                    v_cache.scalar_type() == dtype && v_cache.sizes() == k_cache.sizes() &&
                    (!bias.has_value() || (bias->scalar_type() == dtype && bias->dim() == 1 &&
                                           bias->size(0) == weight.size(0) && bias->is_contiguous() &&
                                           bias->device() == x.device())) &&
                    weight.device() == x.device() && k_cache.device() == x.device() &&
                    v_cache.device() == x.device() && position.device() == x.device() &&
                    position.scalar_type() == at::kLong && position.numel() == 1 && weight.size(1) == x.size(2) &&
                    weight.is_contiguous() &&
                    x.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                    counters.is_contiguous() && (dtype == at::kHalf || dtype == at::kBFloat16) &&
                    decode_linear_kernel() != "cublas";
  if (same) {
    // The operators' own checks of the folded norm and of the caches, before the kernel runs.
    const FoldedNorm folded = check_linear_extras("decode_linear", x, weight.sym_size(0), std::nullopt, norm, norm_sum,
                                                  eps);
    at::assert_no_internal_overlap(k_cache);
    at::assert_no_internal_overlap(v_cache);
    at::assert_no_overlap(k_cache, v_cache);
    cuda::DecodeQkvAttentionParams p;
    p.type = activation_type(dtype);
    p.rows = x.size(0);
    p.k = x.size(2);
    p.heads = k_cache.size(1);
    p.keys = k_cache.size(2);
    p.head_dim = k_cache.size(3);
    const at::Tensor sums = norm_sum.has_value() ? norm_sum->contiguous() : at::Tensor();
    at::Tensor qkv = at::empty({p.rows, weight.size(0)}, x.options());
    at::Tensor out = at::empty({p.rows, 1, p.heads, p.head_dim}, x.options());
    p.x = x.const_data_ptr();
    p.weight = weight.const_data_ptr();
    p.bias = bias.has_value() ? bias->const_data_ptr() : nullptr;
    p.qkv = qkv.mutable_data_ptr();
    p.out = out.mutable_data_ptr();
    p.k_cache = k_cache.mutable_data_ptr();
    p.v_cache = v_cache.mutable_data_ptr();
    p.position = position.const_data_ptr<std::int64_t>();
    p.counters = counters.mutable_data_ptr<int>();
    p.norm = cuda_norm(folded);
    p.norm_sum = sums.defined() ? sums.const_data_ptr<float>() : nullptr;
    p.eps = static_cast<float>(eps);
    p.scale = static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim)));
    p.device = x.device().index();
    if (cuda::decode_qkv_attention_supported(p) && std::isfinite(p.scale)) {
      cuda::decode_qkv_attention(p, c10::cuda::getCurrentCUDAStream(p.device).stream());
      return out;
    }
  }
  return composed(x, weight, bias, k_cache, v_cache, position, norm, norm_sum, eps, scale);
#else
  (void)bias;
  (void)v_cache;
  (void)position;
  (void)norm;
  (void)norm_sum;
  (void)eps;
  (void)scale;
  require_cuda("gpuopt::decode_qkv_attention on a CUDA tensor");
  return {};
#endif
}

at::Tensor decode_qkv_attention_meta(const at::Tensor& x, const at::Tensor& weight,
                                     const std::optional<at::Tensor>& /*bias*/, at::Tensor& k_cache,
                                     at::Tensor& /*v_cache*/, const at::Tensor& /*position*/, at::Tensor& counters,
                                     const std::string& /*norm*/, const std::optional<at::Tensor>& /*norm_sum*/,
                                     double /*eps*/, std::optional<double> /*scale*/) {
  check_args(x, weight, k_cache, counters);
  return at::empty_symint({x.sym_size(0), 1, k_cache.sym_size(1), k_cache.sym_size(3)}, x.options());
}

}  // namespace
}  // namespace gpuopt::torch_ext

TORCH_LIBRARY_FRAGMENT(gpuopt, m) {
  m.def(
      "decode_qkv_attention(Tensor x, Tensor weight, Tensor? bias, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor position, Tensor(c!) counters, str norm=\"none\", Tensor? norm_sum=None, float eps=1e-05, "
      "float? scale=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(gpuopt, CPU, m) { m.impl("decode_qkv_attention", &gpuopt::torch_ext::decode_qkv_attention_cpu); }

TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) { m.impl("decode_qkv_attention", &gpuopt::torch_ext::decode_qkv_attention_cuda); }

TORCH_LIBRARY_IMPL(gpuopt, Meta, m) { m.impl("decode_qkv_attention", &gpuopt::torch_ext::decode_qkv_attention_meta); }
