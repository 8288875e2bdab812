// gpuopt's kernels that take or return tensors, as torch operators (torch.ops.gpuopt.*),
// registered the way pytorch/extension-cpp does: a schema, CPU and CUDA kernels computing the same
// values, and a Meta kernel so that FakeTensor, torch.compile and torch.library.opcheck can trace
// them without running anything. The registration is static: loading gpuopt._C (`import gpuopt`)
// makes the operators available.
//
//   gpuopt::fill_pattern_(Tensor(a!) out, int seed) -> ()
//       out.view(-1)[i] = pattern(i, seed) (gpuopt/pattern.h) for a contiguous int32 tensor; on
//       CUDA, on the current stream of out's device. Returns nothing (torch.library.custom_op's
//       rule for mutating ops), so that torch.compile functionalizes it on older torch too
//       (checked on 2.11).
//   gpuopt::pattern(SymInt numel, int seed, Device device) -> Tensor
//       a new 1-D int32 tensor holding that pattern: empty + fill_pattern_
//       (CompositeImplicitAutograd, so it needs no kernels of its own).
//
// The L2 flush of the timing loop and the ceilings' buffers call the CUDA launcher directly on
// gpuopt's own scratch memory: no tensor crosses there, so they do not go through these operators.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <utility>

#include "device.h"
#include "gpuopt/pattern.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {

std::uint32_t checked_seed(std::int64_t seed, const char* op) {
  TORCH_CHECK_VALUE(seed >= 0 && seed <= 0xffffffffLL, op, ": seed must be in [0, 2^32), got ",
                    seed);
  return static_cast<std::uint32_t>(seed);
}

// Every kernel checks the same (Meta included, so that tracing raises what running would).
std::uint32_t checked_fill_args(const at::Tensor& out, std::int64_t seed) {
  TORCH_CHECK_TYPE(out.scalar_type() == at::kInt, "fill_pattern_: out must be int32, got ",
                   out.scalar_type());
  TORCH_CHECK_VALUE(out.is_contiguous(), "fill_pattern_: out must be contiguous, got sizes ",
                    out.sym_sizes(), " with strides ", out.sym_strides());
  return checked_seed(seed, "fill_pattern_");
}

void fill_pattern_cpu(at::Tensor& out, std::int64_t seed) {
  const std::uint32_t s = checked_fill_args(out, seed);
  auto* values = reinterpret_cast<std::uint32_t*>(out.mutable_data_ptr<std::int32_t>());
  at::parallel_for(0, out.numel(), 1 << 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      values[i] = pattern(static_cast<std::uint64_t>(i), s);
    }
  });
}

void fill_pattern_cuda(at::Tensor& out, std::int64_t seed) {
  const std::uint32_t s = checked_fill_args(out, seed);
#ifdef GPUOPT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(out.device());
  auto* values = reinterpret_cast<std::uint32_t*>(out.mutable_data_ptr<std::int32_t>());
  cuda::fill_pattern(values, out.numel(), s,
                     c10::cuda::getCurrentCUDAStream(out.device().index()).stream());
#else
  (void)s;
  require_cuda("gpuopt::fill_pattern_ on a CUDA tensor");
#endif
}

void fill_pattern_meta(at::Tensor& out, std::int64_t seed) {
  (void)checked_fill_args(out, seed);
}

at::Tensor pattern_tensor(c10::SymInt numel, std::int64_t seed, c10::Device device) {
  TORCH_CHECK_VALUE(numel >= 0, "pattern: numel must be >= 0, got ", numel);
  (void)checked_seed(seed, "pattern");
  at::Tensor out =
      at::empty_symint({std::move(numel)}, at::TensorOptions().dtype(at::kInt).device(device));
  static const auto fill = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("gpuopt::fill_pattern_", "")
                               .typed<void(at::Tensor&, std::int64_t)>();
  fill.call(out, seed);
  return out;
}

}  // namespace
}  // namespace gpuopt::torch_ext

TORCH_LIBRARY(gpuopt, m) {
  m.def("fill_pattern_(Tensor(a!) out, int seed) -> ()");
  m.def("pattern(SymInt numel, int seed, Device device) -> Tensor");
}

TORCH_LIBRARY_IMPL(gpuopt, CPU, m) {
  m.impl("fill_pattern_", &gpuopt::torch_ext::fill_pattern_cpu);
}

TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("fill_pattern_", &gpuopt::torch_ext::fill_pattern_cuda);
}

TORCH_LIBRARY_IMPL(gpuopt, Meta, m) {
  m.impl("fill_pattern_", &gpuopt::torch_ext::fill_pattern_meta);
}

TORCH_LIBRARY_IMPL(gpuopt, CompositeImplicitAutograd, m) {
  m.impl("pattern", &gpuopt::torch_ext::pattern_tensor);
}
