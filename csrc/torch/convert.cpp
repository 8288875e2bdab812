#include "convert.h"

namespace gpuopt::torch_ext {

at::Tensor convert(const at::Tensor& t, const ConvertSpec& spec, bool* changed_layout) {
  at::Tensor out = t;
  if (spec.device.has_value() && out.device() != *spec.device) out = out.to(*spec.device);
  if (spec.dtype.has_value() && out.is_floating_point() && out.scalar_type() != *spec.dtype) {
    out = out.to(*spec.dtype);
  }
  if (spec.channels_last && (out.dim() == 4 || out.dim() == 5)) {
    out = out.contiguous(out.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d);
    if (changed_layout != nullptr) *changed_layout = true;
  }
  return out;
}

}  // namespace gpuopt::torch_ext
