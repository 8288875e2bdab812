// What gpuopt's decode linear operators (decode_linear.cpp, int8_linear.cpp) take besides the matmul: a
// residual added to the output, and a norm of x folded in (csrc/cuda/linear_epilogue.cuh): its
// elementwise affine already in the weight and bias, x's rows normalized without it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>

#include <optional>
#include <string>

#ifdef GPUOPT_WITH_CUDA
#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {

enum class FoldedNorm { kNone, kLayer, kRms };

// Checks an operator's residual (shape [..., n] of x's batch dimensions, x's dtype and device), norm
// ("none", "layer" or "rms"), norm_sum (float32 [n] on x's device, required by "layer") and eps (finite,
// >= 0): TypeError or ValueError naming `op`, the argument and the value. Returns the norm.
FoldedNorm check_linear_extras(const char* op, const at::Tensor& x, const c10::SymInt& n,
                               const std::optional<at::Tensor>& residual, const std::string& norm,
                               const std::optional<at::Tensor>& norm_sum, double eps);

// x's rows normalized as the folded norm does it, in float32, then rounded to x's dtype (as the model's
// own norm hands its output to the linear layer): a layer norm (mean, variance) or RMS norm (mean square),
// without affine; x itself for kNone. The operators' reference path.
at::Tensor normalized_rows(const at::Tensor& x, FoldedNorm norm, double eps);

#ifdef GPUOPT_WITH_CUDA
inline cuda::LinearNorm cuda_norm(FoldedNorm norm) {
  return norm == FoldedNorm::kLayer ? cuda::LinearNorm::kLayer
         : norm == FoldedNorm::kRms ? cuda::LinearNorm::kRms
                                    : cuda::LinearNorm::kNone;
}
#endif

}  // namespace gpuopt::torch_ext
