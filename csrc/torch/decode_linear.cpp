// gpuopt::decode_linear, a torch operator registered like those of ops.cpp (a fragment of the `gpuopt`
// library that ops.cpp defines):
//
//   gpuopt::decode_linear(Tensor x, Tensor weight, Tensor? bias=None, str activation="none",
//                         Tensor? residual=None, str norm="none", Tensor? norm_sum=None, float eps=1e-5) -> Tensor
//       out = act(norm(x) @ weight.T + bias) + residual, shape [..., N], for x of float16/bfloat16/float32
//       [..., K], a weight [N, K] and an optional bias [N] and residual [..., N] of x's dtype; activation
//       "none" or "relu". norm "layer" or "rms": a norm of x folded in -- its elementwise scale already
//       multiplied into the weight's columns, its shift into the bias -- so x's rows are normalized without
//       affine (eps added to the variance or mean square); "layer" needs norm_sum = weight.float().sum(1)
//       (the kernel takes the mean out of its sums: csrc/cuda/linear_epilogue.cuh).
//
// CPU: ATen's linear. CUDA: for decode batches (1 to 8 rows of fp16/bf16, K a multiple of 32, aligned
// contiguous data, compute capability 8.0+) gpuopt's bandwidth-bound tensor-core kernel with the bias
// and activation in its epilogue; otherwise ATen's linear (cuBLAS). Both capturable in a CUDA graph.
// Meta: shapes only.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/relu.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "decode_linear.h"
#include "device.h"
#include "linear_epilogue.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {

constexpr const char* kOp = "decode_linear";

std::atomic<bool> g_cublas{false};  // decode_linear_kernel("cublas")
std::atomic<int> g_warps{0};
std::atomic<int> g_vector{0};

bool relu(const std::string& activation) { return relu_activation(kOp, activation); }

void check_args(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                const std::string& activation) {
  const at::ScalarType dtype = x.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat, kOp,
                   ": x must be float16, bfloat16 or float32, got ", dtype_name(dtype));
  TORCH_CHECK_VALUE(x.dim() >= 1, kOp, ": x must have shape [..., K], got a 0-dim tensor");
  TORCH_CHECK_TYPE(weight.scalar_type() == dtype, kOp, ": weight must have x's dtype (", dtype_name(dtype),
                   "), got ", dtype_name(weight.scalar_type()));
  TORCH_CHECK_VALUE(weight.dim() == 2, kOp, ": weight must be 2-D [N, K], got sizes ", weight.sym_sizes());
  TORCH_CHECK_VALUE(x.sym_size(-1) == weight.sym_size(1), kOp,
                    ": x's last dimension must equal weight's K (weight is [N, K]), got x sizes ", x.sym_sizes(),
                    " and weight sizes ", weight.sym_sizes());
  TORCH_CHECK_VALUE(weight.device() == x.device(), kOp, ": weight must be on x's device (", x.device(),
                    "), got ", weight.device());
  if (bias.has_value()) {
    TORCH_CHECK_TYPE(bias->scalar_type() == dtype, kOp, ": bias must have x's dtype (", dtype_name(dtype),
                     "), got ", dtype_name(bias->scalar_type()));
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->sym_size(0) == weight.sym_size(0), kOp,
                      ": bias must have shape [N] with N = weight.size(0) = ", weight.sym_size(0), ", got sizes ",
                      bias->sym_sizes());
    TORCH_CHECK_VALUE(bias->device() == x.device(), kOp, ": bias must be on x's device (", x.device(),
                      "), got ", bias->device());
  }
  relu(activation);
}

// The operator's arguments past the matmul's (linear_epilogue.h).
struct Extras {
  const std::optional<at::Tensor>& residual;
  FoldedNorm norm;
  const std::optional<at::Tensor>& norm_sum;
  double eps;
};

Extras check_extras(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& residual,
                    const std::string& norm, const std::optional<at::Tensor>& norm_sum, double eps) {
  return {residual, check_linear_extras(kOp, x, weight.sym_size(0), residual, norm, norm_sum, eps), norm_sum, eps};
}

at::Tensor reference(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                     bool apply_relu, const Extras& e) {
  at::Tensor y = at::linear(normalized_rows(x, e.norm, e.eps), weight, bias);
  if (apply_relu) y = at::relu(y);
  if (e.residual.has_value()) y = y.add(*e.residual);
  return y;
}

at::Tensor decode_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             const std::string& activation, const std::optional<at::Tensor>& residual,
                             const std::string& norm, const std::optional<at::Tensor>& norm_sum, double eps) {
  check_args(x, weight, bias, activation);
  return reference(x, weight, bias, relu(activation), check_extras(x, weight, residual, norm, norm_sum, eps));
}

at::Tensor decode_linear_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              const std::string& activation, const std::optional<at::Tensor>& residual,
                              const std::string& norm, const std::optional<at::Tensor>& norm_sum, double eps) {
  check_args(x, weight, bias, activation);
  const bool apply_relu = relu(activation);
  const Extras e = check_extras(x, weight, residual, norm, norm_sum, eps);
#ifdef GPUOPT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(x.device());
  const std::int64_t n = weight.size(0);
  const std::int64_t k = weight.size(1);
  std::int64_t rows = 1;
  for (std::int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  if (g_cublas.load(std::memory_order_relaxed) || rows < 1 || rows > cuda::kDecodeLinearMaxRows ||
      !weight.is_contiguous() || (bias.has_value() && !bias->is_contiguous())) {
    return reference(x, weight, bias, apply_relu, e);
  }
  const at::Tensor x2 = x.reshape({rows, k}).contiguous();
  const at::Tensor r2 = residual.has_value() ? residual->reshape({rows, n}).contiguous() : at::Tensor();
  const at::Tensor sums = norm_sum.has_value() ? norm_sum->contiguous() : at::Tensor();
  cuda::DecodeLinearParams p;
  p.type = activation_type(x.scalar_type());
  p.x = x2.const_data_ptr();
  p.weight = weight.const_data_ptr();
  p.bias = bias.has_value() ? bias->const_data_ptr() : nullptr;
  p.rows = rows;
  p.n = n;
  p.k = k;
  p.device = x.device().index();
  p.activation = apply_relu ? cuda::LinearActivation::kRelu : cuda::LinearActivation::kNone;
  p.warps = g_warps.load(std::memory_order_relaxed);
  p.vector = g_vector.load(std::memory_order_relaxed);
  p.norm = cuda_norm(e.norm);
  p.norm_sum = sums.defined() ? sums.const_data_ptr<float>() : nullptr;
  p.eps = static_cast<float>(eps);
  p.residual = r2.defined() ? r2.const_data_ptr() : nullptr;
  if (!cuda::decode_linear_supported(p)) return reference(x, weight, bias, apply_relu, e);
  at::Tensor out = at::empty({rows, n}, x.options());
  p.out = out.mutable_data_ptr();
  cuda::decode_linear(p, c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
  std::vector<std::int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);  // [..., N]
  out_shape.push_back(n);
  return out.view(out_shape);
#else
  (void)apply_relu;
  (void)e;
  require_cuda("gpuopt::decode_linear on a CUDA tensor");
  return {};
#endif
}

at::Tensor decode_linear_meta(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              const std::string& activation, const std::optional<at::Tensor>& residual,
                              const std::string& norm, const std::optional<at::Tensor>& norm_sum, double eps) {
  check_args(x, weight, bias, activation);
  check_extras(x, weight, residual, norm, norm_sum, eps);
  std::vector<c10::SymInt> shape(x.sym_sizes().begin(), x.sym_sizes().end() - 1);
  shape.push_back(weight.sym_size(0));
  return at::empty_symint(shape, x.options());
}

}  // namespace

std::string decode_linear_kernel() { return g_cublas.load() ? "cublas" : "auto"; }

std::string set_decode_linear_kernel(const std::string& name) {
  TORCH_CHECK_VALUE(name == "auto" || name == "cublas",
                    "decode_linear_kernel: kernel must be 'auto' or 'cublas', got '", name, "'");
  return g_cublas.exchange(name == "cublas") ? "cublas" : "auto";
}

std::pair<int, int> decode_linear_layout() { return {g_warps.load(), g_vector.load()}; }

std::pair<int, int> set_decode_linear_layout(int warps, int vector) {
  TORCH_CHECK_VALUE(warps == 0 || warps == 4 || warps == 8 || warps == 16 || warps == 32,
                    "decode_linear_layout: warps must be 0 (chosen from K), 4, 8, 16 or 32, got ", warps);
  TORCH_CHECK_VALUE(vector == 0 || vector == 1 || vector == 2 || vector == 4,
                    "decode_linear_layout: vector must be 0 (chosen), 1, 2 or 4, got ", vector);
  return {g_warps.exchange(warps), g_vector.exchange(vector)};
}

#ifdef GPUOPT_WITH_CUDA
bool programmatic_launch() { return cuda::programmatic_launch(); }
bool set_programmatic_launch(bool enabled) { return cuda::set_programmatic_launch(enabled); }
bool programmatic_launch_runs(int device) {
  return cuda::programmatic_launch_runs(checked_cuda_device(device, "programmatic_launch_runs"));
}
#else
namespace {
std::atomic<bool> g_programmatic{true};  // nothing launches without CUDA; kept so that the setting reads back
}  // namespace
bool programmatic_launch() { return g_programmatic.load(); }
bool set_programmatic_launch(bool enabled) { return g_programmatic.exchange(enabled); }
bool programmatic_launch_runs(int /*device*/) { return false; }
#endif

}  // namespace gpuopt::torch_ext

TORCH_LIBRARY_FRAGMENT(gpuopt, m) {
  m.def(
      "decode_linear(Tensor x, Tensor weight, Tensor? bias=None, str activation=\"none\", Tensor? residual=None, "
      "str norm=\"none\", Tensor? norm_sum=None, float eps=1e-05) -> Tensor");
}

TORCH_LIBRARY_IMPL(gpuopt, CPU, m) { m.impl("decode_linear", &gpuopt::torch_ext::decode_linear_cpu); }

TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) { m.impl("decode_linear", &gpuopt::torch_ext::decode_linear_cuda); }

TORCH_LIBRARY_IMPL(gpuopt, Meta, m) { m.impl("decode_linear", &gpuopt::torch_ext::decode_linear_meta); }
