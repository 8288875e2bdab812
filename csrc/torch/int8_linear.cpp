// gpuopt::int8_weight_only_linear, a torch operator registered like those of ops.cpp (a fragment of
// the `gpuopt` library that ops.cpp defines):
//
//   gpuopt::int8_weight_only_linear(Tensor x, Tensor weight, Tensor scales, Tensor? bias=None,
//                                   str activation="none", Tensor? residual=None, str norm="none",
//                                   Tensor? norm_sum=None, float eps=1e-5) -> Tensor
//       out = act((x @ weight.float().T) * scales + bias) in x's dtype (act: "none" or "relu", applied in the
//       kernel's epilogue), shape [..., N], for x of
//       float16/bfloat16/float32 [..., K], an int8 weight [N, K] (contiguous), per-output-channel
//       scales [N] (float32 or x's dtype) and an optional bias [N] of x's dtype. residual, norm, norm_sum
//       and eps as gpuopt::decode_linear's (decode_linear.cpp): out = act(norm(x) @ w.T + bias) + residual,
//       norm_sum = (weight.float() * scales[:, None]).sum(1) for norm "layer".
//
// CPU: the float32 reference through ATen. CUDA: for decode batches (1 to 16 rows, K a multiple
// of 16, aligned x and weight) a bandwidth-bound kernel that reads the int8 weight once (half the
// bytes of fp16); otherwise the weight is dequantized to x's dtype and multiplied with cuBLAS, so
// int8 pays off for small batches only. Both CUDA paths are capturable in a CUDA graph. Meta:
// shapes only.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "device.h"
#include "int8_linear.h"
#include "linear_epilogue.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {

constexpr const char* kOp = "int8_weight_only_linear";

// The names of int8_linear_kernel(), in the order of cuda::Int8Kernel.
constexpr std::array<const char*, 3> kKernels = {"auto", "simt", "tensor-core"};
std::atomic<int> g_kernel{0};
std::atomic<int> g_warps{0};
std::atomic<int> g_vector{0};

bool relu(const std::string& activation) { return relu_activation(kOp, activation); }

void check_device(const char* name, const at::Tensor& t, const at::Tensor& x) {
  TORCH_CHECK_VALUE(t.device() == x.device(), kOp, ": ", name, " must be on x's device (",
                    x.device(), "), got ", t.device());
}

// Every kernel checks the same (Meta included, so that tracing raises what running would).
void check_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                const std::optional<at::Tensor>& bias, const std::string& activation) {
  const at::ScalarType dtype = x.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat, kOp,
                   ": x must be float16, bfloat16 or float32, got ", dtype_name(dtype));
  TORCH_CHECK_VALUE(x.dim() >= 1, kOp, ": x must have shape [..., K], got a 0-dim tensor");
  TORCH_CHECK_TYPE(weight.scalar_type() == at::kChar, kOp, ": weight must be int8, got ",
                   dtype_name(weight.scalar_type()));
  TORCH_CHECK_VALUE(weight.dim() == 2, kOp, ": weight must be 2-D [N, K], got sizes ",
                    weight.sym_sizes());
  TORCH_CHECK_VALUE(weight.is_contiguous(), kOp, ": weight must be contiguous, got sizes ",
                    weight.sym_sizes(), " with strides ", weight.sym_strides());
  TORCH_CHECK_VALUE(x.sym_size(-1) == weight.sym_size(1), kOp,
                    ": x's last dimension must equal weight's K (weight is [N, K]), got x sizes ",
                    x.sym_sizes(), " and weight sizes ", weight.sym_sizes());
  TORCH_CHECK_TYPE(scales.scalar_type() == at::kFloat || scales.scalar_type() == dtype, kOp,
                   ": scales must be float32 or x's dtype (", dtype_name(dtype), "), got ",
                   dtype_name(scales.scalar_type()));
  TORCH_CHECK_VALUE(scales.dim() == 1 && scales.sym_size(0) == weight.sym_size(0), kOp,
                    ": scales must have shape [N] with N = weight.size(0) = ", weight.sym_size(0),
                    ", got sizes ", scales.sym_sizes());
  check_device("weight", weight, x);
  check_device("scales", scales, x);
  if (bias.has_value()) {
    TORCH_CHECK_TYPE(bias->scalar_type() == dtype, kOp, ": bias must have x's dtype (",
                     dtype_name(dtype), "), got ", dtype_name(bias->scalar_type()));
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->sym_size(0) == weight.sym_size(0), kOp,
                      ": bias must have shape [N] with N = weight.size(0) = ", weight.sym_size(0),
                      ", got sizes ", bias->sym_sizes());
    check_device("bias", *bias, x);
  }
  relu(activation);
}

at::Tensor int8_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                           const std::optional<at::Tensor>& bias, const std::string& activation,
                           const std::optional<at::Tensor>& residual, const std::string& norm,
                           const std::optional<at::Tensor>& norm_sum, double eps) {
  check_args(x, weight, scales, bias, activation);
  const FoldedNorm folded = check_linear_extras(kOp, x, weight.sym_size(0), residual, norm, norm_sum, eps);
  at::Tensor y = at::matmul(normalized_rows(x, folded, eps).to(at::kFloat), weight.to(at::kFloat).t());
  y.mul_(scales.to(at::kFloat));
  if (bias.has_value()) y.add_(bias->to(at::kFloat));
  if (relu(activation)) y.clamp_min_(0);
  if (residual.has_value()) y.add_(residual->to(at::kFloat));
  return y.to(x.scalar_type());
}

at::Tensor int8_linear_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                            const std::optional<at::Tensor>& bias, const std::string& activation,
                            const std::optional<at::Tensor>& residual, const std::string& norm,
                            const std::optional<at::Tensor>& norm_sum, double eps) {
  check_args(x, weight, scales, bias, activation);
  const bool apply_relu = relu(activation);
  const FoldedNorm folded = check_linear_extras(kOp, x, weight.sym_size(0), residual, norm, norm_sum, eps);
#ifdef GPUOPT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(x.device());
  const std::int64_t n = weight.size(0);
  const std::int64_t k = weight.size(1);
  std::vector<std::int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);  // [..., N]
  out_shape.push_back(n);
  std::int64_t rows = 1;
  for (std::int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  const at::Tensor x2 = x.reshape({rows, k}).contiguous();
  const at::Tensor s = scales.contiguous();
  const std::optional<at::Tensor> b =
      bias.has_value() ? std::optional<at::Tensor>(bias->contiguous()) : std::nullopt;
  const at::Tensor r2 = residual.has_value() ? residual->reshape({rows, n}).contiguous() : at::Tensor();
  const at::Tensor sums = norm_sum.has_value() ? norm_sum->contiguous() : at::Tensor();

  cuda::Int8LinearParams p;
  p.type = activation_type(x.scalar_type());
  p.x = x2.const_data_ptr();
  p.weight = weight.const_data_ptr<std::int8_t>();
  p.scales = s.const_data_ptr();
  p.scales_fp32 = s.scalar_type() == at::kFloat;
  p.bias = b.has_value() ? b->const_data_ptr() : nullptr;
  p.rows = rows;
  p.n = n;
  p.k = k;
  p.device = x.device().index();
  p.kernel = static_cast<cuda::Int8Kernel>(g_kernel.load(std::memory_order_relaxed));
  p.mma_warps = g_warps.load(std::memory_order_relaxed);
  p.mma_vector = g_vector.load(std::memory_order_relaxed);
  p.relu = apply_relu;
  p.norm = cuda_norm(folded);
  p.norm_sum = sums.defined() ? sums.const_data_ptr<float>() : nullptr;
  p.eps = static_cast<float>(eps);
  p.residual = r2.defined() ? r2.const_data_ptr() : nullptr;
  TORCH_CHECK_VALUE(p.kernel != cuda::Int8Kernel::kTensorCore || !cuda::int8_linear_supported(p) ||
                        cuda::int8_linear_tensor_cores(p),
                    kOp, ": int8_linear_kernel is 'tensor-core', which needs float16 or bfloat16 x (got ",
                    dtype_name(x.scalar_type()), "), K a multiple of 64 (got ", k,
                    ") and compute capability 8.0 or newer");
  if (cuda::int8_linear_supported(p)) {
    at::Tensor out = at::empty({rows, n}, x.options());
    p.out = out.mutable_data_ptr();
    cuda::int8_linear(p, c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
    return out.view(out_shape);
  }
  // Larger batches (or odd K, unaligned data): dequantize and use cuBLAS. The scales are folded
  // into the weight before the GEMM so that fp16 sums stay in the range of the original weights.
  at::Tensor w = weight.to(x.scalar_type());
  w.mul_(s.unsqueeze(1));
  at::Tensor y = at::matmul(normalized_rows(x2, folded, eps), w.t());
  if (b.has_value()) y.add_(*b);
  if (apply_relu) y.clamp_min_(0);
  if (r2.defined()) y.add_(r2);
  return y.view(out_shape);
#else
  (void)apply_relu;
  (void)folded;
  require_cuda("gpuopt::int8_weight_only_linear on a CUDA tensor");
  return {};
#endif
}

at::Tensor int8_linear_meta(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                            const std::optional<at::Tensor>& bias, const std::string& activation,
                            const std::optional<at::Tensor>& residual, const std::string& norm,
                            const std::optional<at::Tensor>& norm_sum, double eps) {
  check_args(x, weight, scales, bias, activation);
  check_linear_extras(kOp, x, weight.sym_size(0), residual, norm, norm_sum, eps);
  std::vector<c10::SymInt> shape(x.sym_sizes().begin(), x.sym_sizes().end() - 1);
  shape.push_back(weight.sym_size(0));
  return at::empty_symint(shape, x.options());
}

}  // namespace

std::string int8_linear_kernel() { return kKernels[g_kernel.load()]; }

std::string set_int8_linear_kernel(const std::string& name) {
  for (std::size_t i = 0; i < kKernels.size(); ++i) {
    if (name == kKernels[i]) return kKernels[g_kernel.exchange(static_cast<int>(i))];
  }
  TORCH_CHECK_VALUE(false, "int8_linear_kernel: kernel must be one of 'auto', 'simt', 'tensor-core', got '",
                    name, "'");
  return {};
}

int int8_linear_warps() { return g_warps.load(); }

int set_int8_linear_warps(int warps) {
  TORCH_CHECK_VALUE(warps == 0 || warps == 4 || warps == 8 || warps == 16 || warps == 32,
                    "int8_linear_warps: warps must be 0 (chosen from N and K), 4, 8, 16 or 32, got ", warps);
  return g_warps.exchange(warps);
}

int int8_linear_vector() { return g_vector.load(); }

int set_int8_linear_vector(int vector) {
  TORCH_CHECK_VALUE(vector >= 0 && vector <= 2,
                    "int8_linear_vector: vector must be 0 (chosen from K), 1 or 2, got ", vector);
  return g_vector.exchange(vector);
}

}  // namespace gpuopt::torch_ext

TORCH_LIBRARY_FRAGMENT(gpuopt, m) {
  m.def(
      "int8_weight_only_linear(Tensor x, Tensor weight, Tensor scales, Tensor? bias=None, "
      "str activation=\"none\", Tensor? residual=None, str norm=\"none\", Tensor? norm_sum=None, "
      "float eps=1e-05) -> Tensor");
}

TORCH_LIBRARY_IMPL(gpuopt, CPU, m) {
  m.impl("int8_weight_only_linear", &gpuopt::torch_ext::int8_linear_cpu);
}

TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("int8_weight_only_linear", &gpuopt::torch_ext::int8_linear_cuda);
}

TORCH_LIBRARY_IMPL(gpuopt, Meta, m) {
  m.impl("int8_weight_only_linear", &gpuopt::torch_ext::int8_linear_meta);
}
