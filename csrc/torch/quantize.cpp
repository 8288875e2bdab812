// gpuopt::quantize_rowwise, a torch operator (a fragment of the `gpuopt` library of ops.cpp):
//
//   gpuopt::quantize_rowwise(Tensor x, ScalarType dtype, str norm="none", Tensor? weight=None,
//                            Tensor? bias=None, float eps=1e-5, str activation="none")
//       -> (Tensor q, Tensor scales)
//       for x [..., K] of float16/bfloat16/float32 and dtype int8 or float8_e4m3fn: per row, y = x
//       through the prologue, amax = max |y|, scales = amax / qmax (1 for an all-zero row; qmax 127 or
//       448) as float32 [..., 1], and q = y * (qmax / amax) rounded to int8 (clamped to +-127) or
//       saturated to e4m3, shape of x. y == q * scales up to the rounding of the quantized type.
//
//       The prologue, in float32: norm "layer" ((x - mean) / sqrt(var + eps)) or "rms" (x / sqrt(mean
//       square + eps)) times weight plus bias (float32 [K] each, optional; bias with "layer" only), then
//       activation "gelu" (erf), "gelu_tanh", "relu" or "silu". It is the layer or activation that
//       produced a linear layer's input, folded into the quantization (gpuopt.quant.fold_prologues): its
//       16-bit output is never written or read again.
//
//   gpuopt::apply_quantize_rowwise(same arguments) -> (Tensor y, Tensor q, Tensor scales)
//       as quantize_rowwise, and y: the prologue's output in x's dtype (rounded once from float32; q is
//       quantized from the float32 values). A norm whose output other operations also read (a residual)
//       writes it and the quantization its layers take in one pass (gpuopt.quant.prologue).
//
// What fp8 and int8 linear layers quantize their activations with before torch._scaled_mm /
// torch._int_mm: one kernel that reads x once (the norm's statistics, the absmax and the cast in one
// pass). CPU: the same arithmetic through ATen. Meta: shapes only, so that torch.compile and CUDA graphs
// compose.
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "device.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {

constexpr const char* kOp = "quantize_rowwise";

float qmax_of(at::ScalarType t) { return t == at::kChar ? 127.0f : 448.0f; }

enum class Norm { kNone, kLayer, kRms };
enum class Act { kNone, kGelu, kGeluTanh, kRelu, kSilu };

struct Prologue {
  Norm norm = Norm::kNone;
  Act act = Act::kNone;
};

void check_vector(const char* name, const std::optional<at::Tensor>& t, const at::Tensor& x) {
  if (!t.has_value()) return;
  TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, kOp, ": ", name, " must be float32, got ",
                   c10::toString(t->scalar_type()));
  TORCH_CHECK_VALUE(t->dim() == 1 && t->sym_size(0) == x.sym_size(-1), kOp, ": ", name,
                    " must have shape [K] (K = x's last dimension, ", x.sym_size(-1), "), got sizes ",
                    t->sym_sizes());
  TORCH_CHECK_VALUE(t->device() == x.device(), kOp, ": ", name, " must be on x's device ", x.device(), ", got ",
                    t->device());
}

Prologue check_args(const at::Tensor& x, at::ScalarType dtype, const std::string& norm,
                    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
                    const std::string& activation) {
  const at::ScalarType xt = x.scalar_type();
  TORCH_CHECK_TYPE(xt == at::kHalf || xt == at::kBFloat16 || xt == at::kFloat, kOp,
                   ": x must be float16, bfloat16 or float32, got ", c10::toString(xt));
  TORCH_CHECK_VALUE(x.dim() >= 1, kOp, ": x must have shape [..., K], got a 0-dim tensor");
  TORCH_CHECK_VALUE(x.sym_size(-1) >= 1, kOp, ": x's last dimension K must be at least 1, got sizes ",
                    x.sym_sizes());
  TORCH_CHECK_TYPE(dtype == at::kChar || dtype == at::kFloat8_e4m3fn, kOp,
                   ": dtype must be torch.int8 or torch.float8_e4m3fn, got ", c10::toString(dtype));
  Prologue p;
  TORCH_CHECK_VALUE(norm == "none" || norm == "layer" || norm == "rms", kOp,
                    ": norm must be 'none', 'layer' or 'rms', got '", norm, "'");
  p.norm = norm == "layer" ? Norm::kLayer : norm == "rms" ? Norm::kRms : Norm::kNone;
  TORCH_CHECK_VALUE(activation == "none" || activation == "gelu" || activation == "gelu_tanh" ||
                        activation == "relu" || activation == "silu",
                    kOp, ": activation must be 'none', 'gelu', 'gelu_tanh', 'relu' or 'silu', got '", activation,
                    "'");
  p.act = activation == "gelu"        ? Act::kGelu
          : activation == "gelu_tanh" ? Act::kGeluTanh
          : activation == "relu"      ? Act::kRelu
          : activation == "silu"      ? Act::kSilu
                                      : Act::kNone;
  TORCH_CHECK_VALUE(p.norm != Norm::kNone || (!weight.has_value() && !bias.has_value()), kOp,
                    ": weight and bias are the norm's elementwise affine: give norm='layer' or 'rms' with them");
  TORCH_CHECK_VALUE(p.norm != Norm::kRms || !bias.has_value(), kOp,
                    ": an RMS norm has no bias: give bias=None with norm='rms'");
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0.0, kOp, ": eps must be finite and >= 0, got ", eps);
  check_vector("weight", weight, x);
  check_vector("bias", bias, x);
  return p;
}

std::vector<c10::SymInt> scale_shape(const at::Tensor& x) {
  std::vector<c10::SymInt> shape(x.sym_sizes().begin(), x.sym_sizes().end() - 1);
  shape.emplace_back(1);
  return shape;
}

// x through the prologue, in float32 (the kernel's arithmetic through ATen).
at::Tensor prologue_cpu(const at::Tensor& x32, const Prologue& p, const std::optional<at::Tensor>& weight,
                        const std::optional<at::Tensor>& bias, double eps) {
  at::Tensor y = x32;
  if (p.norm != Norm::kNone) {
    if (p.norm == Norm::kLayer) y = y.sub(at::mean(y, {-1}, /*keepdim=*/true));
    y = y.mul(at::rsqrt(at::mean(y.mul(y), {-1}, /*keepdim=*/true).add(eps)));
    if (weight.has_value()) y = y.mul(weight->to(y.device()));
    if (bias.has_value()) y = y.add(bias->to(y.device()));
  }
  switch (p.act) {
    case Act::kGelu: return at::gelu(y, "none");
    case Act::kGeluTanh: return at::gelu(y, "tanh");
    case Act::kRelu: return at::relu(y);
    case Act::kSilu: return at::silu(y);
    case Act::kNone: break;
  }
  return y;
}

// The reference: q and scales, and y (the prologue's output in x's dtype) where `keep`; as run_cuda.
std::tuple<at::Tensor, at::Tensor, at::Tensor> run_cpu(const at::Tensor& x, at::ScalarType dtype,
                                                       const std::string& norm,
                                                       const std::optional<at::Tensor>& weight,
                                                       const std::optional<at::Tensor>& bias, double eps,
                                                       const std::string& activation, bool keep) {
  const Prologue pro = check_args(x, dtype, norm, weight, bias, eps, activation);
  const float qmax = qmax_of(dtype);
  const at::Tensor x32 = prologue_cpu(x.to(at::kFloat), pro, weight, bias, eps);
  // As the kernel: NaN does not enter the absmax (fmaxf skips it), and an inverse that overflows is 0.
  const at::Tensor amax = at::amax(at::abs(x32).nan_to_num(0.0, INFINITY, 0.0), {-1}, /*keepdim=*/true);
  const at::Tensor positive = amax.gt(0);
  const at::Tensor scales = at::where(positive, amax.div(qmax), at::ones_like(amax));
  at::Tensor inv = at::where(positive, at::full_like(amax, qmax).div(amax), at::zeros_like(amax));
  inv = at::where(inv.isfinite(), inv, at::zeros_like(inv));
  at::Tensor v = x32.mul(inv);
  at::Tensor q = dtype == at::kChar ? v.round().clamp(-127, 127).to(at::kChar) : v.clamp(-448, 448).to(dtype);
  return {keep ? x32.to(x.scalar_type()) : at::Tensor(), q, scales};
}

std::tuple<at::Tensor, at::Tensor> quantize_cpu(const at::Tensor& x, at::ScalarType dtype, const std::string& norm,
                                                const std::optional<at::Tensor>& weight,
                                                const std::optional<at::Tensor>& bias, double eps,
                                                const std::string& activation) {
  auto [y, q, scales] = run_cpu(x, dtype, norm, weight, bias, eps, activation, /*keep=*/false);
  return {q, scales};
}

// The kernel: q and scales, and y (the prologue's output in x's dtype) where `keep`.
std::tuple<at::Tensor, at::Tensor, at::Tensor> run_cuda(const at::Tensor& x, at::ScalarType dtype,
                                                        const std::string& norm,
                                                        const std::optional<at::Tensor>& weight,
                                                        const std::optional<at::Tensor>& bias, double eps,
                                                        const std::string& activation, bool keep) {
  const Prologue pro = check_args(x, dtype, norm, weight, bias, eps, activation);
#ifdef GPUOPT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  const std::int64_t k = x.size(-1);
  const std::int64_t rows = k == 0 ? 0 : xc.numel() / k;
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(dtype));
  at::Tensor y = keep ? at::empty(x.sizes(), x.options()) : at::Tensor();
  std::vector<std::int64_t> sshape(x.sizes().begin(), x.sizes().end() - 1);
  sshape.push_back(1);
  at::Tensor scales = at::empty(sshape, x.options().dtype(at::kFloat));
  cuda::QuantizeRowsParams p;
  p.type = activation_type(x.scalar_type());
  p.qtype = dtype == at::kChar ? cuda::QuantType::kInt8 : cuda::QuantType::kFloat8E4M3;
  p.x = xc.const_data_ptr();
  p.q = q.mutable_data_ptr();
  p.scales = scales.mutable_data_ptr<float>();
  p.rows = rows;
  p.k = k;
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  p.norm = pro.norm == Norm::kLayer ? cuda::LinearNorm::kLayer
           : pro.norm == Norm::kRms ? cuda::LinearNorm::kRms
                                    : cuda::LinearNorm::kNone;
  p.norm_weight = w.defined() ? w.const_data_ptr<float>() : nullptr;
  p.norm_bias = b.defined() ? b.const_data_ptr<float>() : nullptr;
  p.eps = static_cast<float>(eps);
  p.activation = static_cast<cuda::QuantizeActivation>(static_cast<int>(pro.act));
  p.y = keep ? y.mutable_data_ptr() : nullptr;
  cuda::quantize_rows(p, c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
  return {y, q, scales};
#else
  (void)pro;
  (void)keep;
  require_cuda("gpuopt::quantize_rowwise on a CUDA tensor");
  return {};
#endif
}

std::tuple<at::Tensor, at::Tensor> quantize_cuda(const at::Tensor& x, at::ScalarType dtype,
                                                 const std::string& norm, const std::optional<at::Tensor>& weight,
                                                 const std::optional<at::Tensor>& bias, double eps,
                                                 const std::string& activation) {
  auto [y, q, scales] = run_cuda(x, dtype, norm, weight, bias, eps, activation, /*keep=*/false);
  return {q, scales};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> apply_cuda(const at::Tensor& x, at::ScalarType dtype,
                                                          const std::string& norm,
                                                          const std::optional<at::Tensor>& weight,
                                                          const std::optional<at::Tensor>& bias, double eps,
                                                          const std::string& activation) {
  return run_cuda(x, dtype, norm, weight, bias, eps, activation, /*keep=*/true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> apply_cpu(const at::Tensor& x, at::ScalarType dtype,
                                                         const std::string& norm,
                                                         const std::optional<at::Tensor>& weight,
                                                         const std::optional<at::Tensor>& bias, double eps,
                                                         const std::string& activation) {
  return run_cpu(x, dtype, norm, weight, bias, eps, activation, /*keep=*/true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> apply_meta(const at::Tensor& x, at::ScalarType dtype,
                                                          const std::string& norm,
                                                          const std::optional<at::Tensor>& weight,
                                                          const std::optional<at::Tensor>& bias, double eps,
                                                          const std::string& activation) {
  check_args(x, dtype, norm, weight, bias, eps, activation);
  return {at::empty_symint(x.sym_sizes(), x.options()), at::empty_symint(x.sym_sizes(), x.options().dtype(dtype)),
          at::empty_symint(scale_shape(x), x.options().dtype(at::kFloat))};
}

std::tuple<at::Tensor, at::Tensor> quantize_meta(const at::Tensor& x, at::ScalarType dtype,
                                                 const std::string& norm, const std::optional<at::Tensor>& weight,
                                                 const std::optional<at::Tensor>& bias, double eps,
                                                 const std::string& activation) {
  check_args(x, dtype, norm, weight, bias, eps, activation);
  return {at::empty_symint(x.sym_sizes(), x.options().dtype(dtype)),
          at::empty_symint(scale_shape(x), x.options().dtype(at::kFloat))};
}

}  // namespace
}  // namespace gpuopt::torch_ext

TORCH_LIBRARY_FRAGMENT(gpuopt, m) { m.def(
      "quantize_rowwise(Tensor x, ScalarType dtype, str norm=\"none\", Tensor? weight=None, Tensor? bias=None, "
      "float eps=1e-05, str activation=\"none\") -> (Tensor, Tensor)");
  m.def(
      "apply_quantize_rowwise(Tensor x, ScalarType dtype, str norm=\"none\", Tensor? weight=None, "
      "Tensor? bias=None, float eps=1e-05, str activation=\"none\") -> (Tensor, Tensor, Tensor)"); }

TORCH_LIBRARY_IMPL(gpuopt, CPU, m) {
  m.impl("quantize_rowwise", &gpuopt::torch_ext::quantize_cpu);
  m.impl("apply_quantize_rowwise", &gpuopt::torch_ext::apply_cpu);
}

TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("quantize_rowwise", &gpuopt::torch_ext::quantize_cuda);
  m.impl("apply_quantize_rowwise", &gpuopt::torch_ext::apply_cuda);
}

TORCH_LIBRARY_IMPL(gpuopt, Meta, m) {
  m.impl("quantize_rowwise", &gpuopt::torch_ext::quantize_meta);
  m.impl("apply_quantize_rowwise", &gpuopt::torch_ext::apply_meta);
}
