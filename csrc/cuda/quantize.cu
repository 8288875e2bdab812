#include <cstdint>

#include "gpuopt/cuda.h"
#include "quantize_kernels.cuh"

namespace gpuopt::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <typename T>
void launch(const QuantizeRowsParams& p, cudaStream_t stream) {
  const bool fp8 = p.qtype == QuantType::kFloat8E4M3;
  const float qmax = fp8 ? kFloat8E4M3Max : kInt8Max;
  const auto* x = static_cast<const T*>(p.x);
  auto* q = static_cast<std::uint8_t*>(p.q);
  const auto blocks = static_cast<unsigned>(p.rows);
  constexpr int kThreads = kernels::kQuantizeThreads;
  const std::int64_t chunks = (p.k + 16 * kThreads - 1) / (16 * kThreads);  // 16-value chunks per thread
  const bool held = p.k % 16 == 0 && aligned16(p.x) && aligned16(p.q);
  if (held && chunks <= 1) {
    kernels::quantize_rows_held<T, 1><<<blocks, kThreads, 0, stream>>>(x, q, p.scales, p.k, qmax, fp8);
  } else if (held && chunks <= 2) {
    kernels::quantize_rows_held<T, 2><<<blocks, kThreads, 0, stream>>>(x, q, p.scales, p.k, qmax, fp8);
  } else if (held && chunks <= 4) {
    kernels::quantize_rows_held<T, 4><<<blocks, kThreads, 0, stream>>>(x, q, p.scales, p.k, qmax, fp8);
  } else {
    kernels::quantize_rows_any<T><<<blocks, kThreads, 0, stream>>>(x, q, p.scales, p.k, qmax, fp8);
  }
  GPUOPT_CHECK_LAUNCH();
}

}  // namespace

void quantize_rows(const QuantizeRowsParams& p, cudaStream_t stream) {
  GPUOPT_CHECK_VALUE(p.rows >= 0 && p.k >= 1, "quantize_rows: rows must be >= 0 and k >= 1, got rows=", p.rows,
                     " k=", p.k);
  GPUOPT_CHECK_VALUE(p.rows <= 0x7fffffff, "quantize_rows: at most 2^31 - 1 rows, got ", p.rows);
  if (p.rows == 0) return;
  GPUOPT_CHECK_VALUE(p.x != nullptr && p.q != nullptr && p.scales != nullptr, "quantize_rows: null pointer");
  switch (p.type) {
    case ActivationType::kFloat16: launch<__half>(p, stream); break;
    case ActivationType::kBFloat16: launch<__nv_bfloat16>(p, stream); break;
    case ActivationType::kFloat32: launch<float>(p, stream); break;
  }
}

}  // namespace gpuopt::cuda
