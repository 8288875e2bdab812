// Tensor conversions a config applies to a model's parameters and buffers and to its inputs.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace gpuopt::torch_ext {

struct ConvertSpec {
  std::optional<c10::Device> device;
  std::optional<at::ScalarType> dtype;  // applied to floating-point tensors only
  bool channels_last = false;           // 4-D -> channels_last, 5-D -> channels_last_3d
};

// The converted tensor (the same tensor when nothing changes). `changed_layout` is set when a
// channels-last conversion applied (the tensor had 4 or 5 dimensions).
at::Tensor convert(const at::Tensor& t, const ConvertSpec& spec, bool* changed_layout = nullptr);

}  // namespace gpuopt::torch_ext
