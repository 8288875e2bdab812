#include "guards.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

namespace gpuopt::torch_ext {
namespace {

std::string precision_name(at::Float32MatmulPrecision p) {
  switch (p) {
    case at::Float32MatmulPrecision::HIGHEST: return "highest";
    case at::Float32MatmulPrecision::HIGH: return "high";
    case at::Float32MatmulPrecision::MEDIUM: return "medium";
  }
  return "highest";
}

}  // namespace

void validate(const StateSpec& spec) {
  if (spec.autocast.value_or(false)) {
    TORCH_CHECK_VALUE(at::autocast::is_autocast_available(spec.device_type), "autocast is not available for device type ",
                      c10::DeviceTypeName(spec.device_type, /*lower_case=*/true));
    const at::ScalarType d = spec.autocast_dtype;
    TORCH_CHECK_VALUE(d == at::kHalf || d == at::kBFloat16, "autocast dtype must be torch.float16 or torch.bfloat16, got ",
                      d);
  }
}

StateGuard::StateGuard(const StateSpec& spec) : spec_(spec) {
  validate(spec_);
  at::Context& ctx = at::globalContext();
  if (spec_.autocast.has_value()) {
    // The same steps as torch.autocast.__enter__, in C++.
    prev_autocast_ = at::autocast::is_autocast_enabled(spec_.device_type);
    prev_autocast_dtype_ = at::autocast::get_autocast_dtype(spec_.device_type);
    prev_autocast_cache_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_enabled(spec_.device_type, *spec_.autocast);
    if (*spec_.autocast) at::autocast::set_autocast_dtype(spec_.device_type, spec_.autocast_dtype);
    at::autocast::increment_nesting();
    at::autocast::set_autocast_cache_enabled(spec_.autocast_cache);
  }
  if (spec_.tf32.has_value()) {
    prev_matmul_precision_ = precision_name(ctx.float32MatmulPrecision());
    prev_cudnn_tf32_ = ctx.allowTF32CuDNN();
    ctx.setFloat32MatmulPrecision(*spec_.tf32 ? "high" : "highest");
    ctx.setAllowTF32CuDNN(*spec_.tf32);
  }
  if (spec_.cudnn_benchmark.has_value()) {
    prev_cudnn_benchmark_ = ctx.benchmarkCuDNN();
    ctx.setBenchmarkCuDNN(*spec_.cudnn_benchmark);
  }
  if (spec_.inference_mode) inference_.emplace(true);
}

StateGuard::~StateGuard() {
  inference_.reset();
  at::Context& ctx = at::globalContext();
  if (spec_.cudnn_benchmark.has_value()) ctx.setBenchmarkCuDNN(prev_cudnn_benchmark_);
  if (spec_.tf32.has_value()) {
    ctx.setFloat32MatmulPrecision(prev_matmul_precision_);
    ctx.setAllowTF32CuDNN(prev_cudnn_tf32_);
  }
  if (spec_.autocast.has_value()) {
    // torch.autocast.__exit__: the cast cache lives as long as the outermost autocast region.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(spec_.device_type, prev_autocast_);
    at::autocast::set_autocast_dtype(spec_.device_type, prev_autocast_dtype_);
    at::autocast::set_autocast_cache_enabled(prev_autocast_cache_);
  }
}

StateSnapshot snapshot() {
  const at::Context& ctx = at::globalContext();
  return {at::autocast::is_autocast_enabled(c10::DeviceType::CUDA),
          at::autocast::is_autocast_enabled(c10::DeviceType::CPU),
          at::autocast::get_autocast_dtype(c10::DeviceType::CUDA),
          at::autocast::get_autocast_dtype(c10::DeviceType::CPU),
          precision_name(ctx.float32MatmulPrecision()),
          ctx.allowTF32CuDNN(),
          ctx.benchmarkCuDNN(),
          c10::InferenceMode::is_enabled()};
}

}  // namespace gpuopt::torch_ext
