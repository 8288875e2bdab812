#include "linear_epilogue.h"

#include <ATen/ops/layer_norm.h>
#include <ATen/ops/rsqrt.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "device.h"

namespace gpuopt::torch_ext {

FoldedNorm check_linear_extras(const char* op, const at::Tensor& x, const c10::SymInt& n,
                               const std::optional<at::Tensor>& residual, const std::string& norm,
                               const std::optional<at::Tensor>& norm_sum, double eps) {
  TORCH_CHECK_VALUE(norm == "none" || norm == "layer" || norm == "rms", op,
                    ": norm must be 'none', 'layer' or 'rms', got '", norm, "'");
  const FoldedNorm folded = norm == "layer" ? FoldedNorm::kLayer : norm == "rms" ? FoldedNorm::kRms : FoldedNorm::kNone;
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
  if (residual.has_value()) {
    TORCH_CHECK_TYPE(residual->scalar_type() == x.scalar_type(), op, ": residual must have x's dtype (",
                     dtype_name(x.scalar_type()), "), got ", dtype_name(residual->scalar_type()));
    std::vector<c10::SymInt> shape(x.sym_sizes().begin(), x.sym_sizes().end() - 1);
    shape.push_back(n);
    TORCH_CHECK_VALUE(residual->sym_sizes().equals(shape), op, ": residual must have the output's shape ",
                      c10::SymIntArrayRef(shape),
                      ", got sizes ", residual->sym_sizes());
    TORCH_CHECK_VALUE(residual->device() == x.device(), op, ": residual must be on x's device (", x.device(),
                      "), got ", residual->device());
  }
  TORCH_CHECK_VALUE(folded == FoldedNorm::kLayer || !norm_sum.has_value(), op,
                    ": norm_sum is taken with norm='layer' only, got norm='", norm, "'");
  if (folded == FoldedNorm::kLayer) {
    TORCH_CHECK_VALUE(norm_sum.has_value(), op,
                      ": norm='layer' needs norm_sum, the weight's row sums in float32 (times the scales for int8)");
    TORCH_CHECK_TYPE(norm_sum->scalar_type() == at::kFloat, op, ": norm_sum must be float32, got ",
                     dtype_name(norm_sum->scalar_type()));
    TORCH_CHECK_VALUE(norm_sum->dim() == 1 && norm_sum->sym_size(0) == n, op, ": norm_sum must have shape [N] with N = ",
                      n, ", got sizes ", norm_sum->sym_sizes());
    TORCH_CHECK_VALUE(norm_sum->device() == x.device(), op, ": norm_sum must be on x's device (", x.device(),
                      "), got ", norm_sum->device());
  }
  return folded;
}

at::Tensor normalized_rows(const at::Tensor& x, FoldedNorm norm, double eps) {
  if (norm == FoldedNorm::kNone) return x;
  const at::Tensor xf = x.to(at::kFloat);
  if (norm == FoldedNorm::kLayer) return at::layer_norm(xf, {x.size(-1)}, std::nullopt, std::nullopt, eps).to(x.scalar_type());
  return xf.mul(at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true).add(eps))).to(x.scalar_type());
}

}  // namespace gpuopt::torch_ext
