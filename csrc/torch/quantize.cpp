// gpuopt::quantize_rowwise, a torch operator (a fragment of the `gpuopt` library of ops.cpp):
//
//   gpuopt::quantize_rowwise(Tensor x, ScalarType dtype) -> (Tensor q, Tensor scales)
//       for x [..., K] of float16/bfloat16/float32 and dtype int8 or float8_e4m3fn: per row,
//       amax = max |x|, scales = amax / qmax (1 for an all-zero row; qmax 127 or 448) as float32
//       [..., 1], and q = x * (qmax / amax) rounded to int8 (clamped to +-127) or saturated to e4m3,
//       shape of x. x == q * scales up to the rounding of the quantized type.
//
// What fp8 and int8 linear layers quantize their activations with before torch._scaled_mm /
// torch._int_mm: one kernel that reads x once (the absmax and the cast in one pass). CPU: the same
// arithmetic through ATen. Meta: shapes only, so that torch.compile and CUDA graphs compose.
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
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

void check_args(const at::Tensor& x, at::ScalarType dtype) {
  const at::ScalarType xt = x.scalar_type();
  TORCH_CHECK_TYPE(xt == at::kHalf || xt == at::kBFloat16 || xt == at::kFloat, kOp,
                   ": x must be float16, bfloat16 or float32, got ", c10::toString(xt));
  TORCH_CHECK_VALUE(x.dim() >= 1, kOp, ": x must have shape [..., K], got a 0-dim tensor");
  TORCH_CHECK_VALUE(x.sym_size(-1) >= 1, kOp, ": x's last dimension K must be at least 1, got sizes ",
                    x.sym_sizes());
  TORCH_CHECK_TYPE(dtype == at::kChar || dtype == at::kFloat8_e4m3fn, kOp,
                   ": dtype must be torch.int8 or torch.float8_e4m3fn, got ", c10::toString(dtype));
}

std::vector<c10::SymInt> scale_shape(const at::Tensor& x) {
  std::vector<c10::SymInt> shape(x.sym_sizes().begin(), x.sym_sizes().end() - 1);
  shape.emplace_back(1);
  return shape;
}

std::tuple<at::Tensor, at::Tensor> quantize_cpu(const at::Tensor& x, at::ScalarType dtype) {
  check_args(x, dtype);
  const float qmax = qmax_of(dtype);
  const at::Tensor x32 = x.to(at::kFloat);
  // As the kernel: NaN does not enter the absmax (fmaxf skips it), and an inverse that overflows is 0.
  const at::Tensor amax = at::amax(at::abs(x32).nan_to_num(0.0, INFINITY, 0.0), {-1}, /*keepdim=*/true);
  const at::Tensor positive = amax.gt(0);
  const at::Tensor scales = at::where(positive, amax.div(qmax), at::ones_like(amax));
  at::Tensor inv = at::where(positive, at::full_like(amax, qmax).div(amax), at::zeros_like(amax));
  inv = at::where(inv.isfinite(), inv, at::zeros_like(inv));
  at::Tensor v = x32.mul(inv);
  at::Tensor q = dtype == at::kChar ? v.round().clamp(-127, 127).to(at::kChar) : v.clamp(-448, 448).to(dtype);
  return {q, scales};
}

std::tuple<at::Tensor, at::Tensor> quantize_cuda(const at::Tensor& x, at::ScalarType dtype) {
  check_args(x, dtype);
#ifdef GPUOPT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  const std::int64_t k = x.size(-1);
  const std::int64_t rows = k == 0 ? 0 : xc.numel() / k;
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(dtype));
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
  cuda::quantize_rows(p, c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
  return {q, scales};
#else
  (void)dtype;
  require_cuda("gpuopt::quantize_rowwise on a CUDA tensor");
  return {};
#endif
}

std::tuple<at::Tensor, at::Tensor> quantize_meta(const at::Tensor& x, at::ScalarType dtype) {
  check_args(x, dtype);
  return {at::empty_symint(x.sym_sizes(), x.options().dtype(dtype)),
          at::empty_symint(scale_shape(x), x.options().dtype(at::kFloat))};
}

}  // namespace
}  // namespace gpuopt::torch_ext

TORCH_LIBRARY_FRAGMENT(gpuopt, m) { m.def("quantize_rowwise(Tensor x, ScalarType dtype) -> (Tensor, Tensor)"); }

TORCH_LIBRARY_IMPL(gpuopt, CPU, m) { m.impl("quantize_rowwise", &gpuopt::torch_ext::quantize_cpu); }

TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) { m.impl("quantize_rowwise", &gpuopt::torch_ext::quantize_cuda); }

TORCH_LIBRARY_IMPL(gpuopt, Meta, m) { m.impl("quantize_rowwise", &gpuopt::torch_ext::quantize_meta); }
