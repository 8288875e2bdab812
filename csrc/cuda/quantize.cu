#include <algorithm>
#include <cstdint>

#include "gpuopt/cuda.h"
#include "quantize_kernels.cuh"

namespace gpuopt::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Rows of `chunks` 16-value chunks, kGroup threads each: kVecs = ceil(chunks / kGroup) <= 4.
template <typename T, int kGroup>
void launch_grouped(const T* x, std::uint8_t* q, const QuantizeRowsParams& p, std::int64_t chunks, float qmax,
                    bool fp8, const kernels::Prologue& pro, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kernels::kQuantizeThreads / kGroup;
  const auto blocks = static_cast<unsigned>((p.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  constexpr int kThreads = kernels::kQuantizeThreads;
  switch ((chunks + kGroup - 1) / kGroup) {
    case 1: kernels::quantize_rows_grouped<T, kGroup, 1><<<blocks, kThreads, 0, stream>>>(x, q, p.scales, p.rows, p.k, qmax, fp8, pro); break;
    case 2: kernels::quantize_rows_grouped<T, kGroup, 2><<<blocks, kThreads, 0, stream>>>(x, q, p.scales, p.rows, p.k, qmax, fp8, pro); break;
    case 3: kernels::quantize_rows_grouped<T, kGroup, 3><<<blocks, kThreads, 0, stream>>>(x, q, p.scales, p.rows, p.k, qmax, fp8, pro); break;
    default: kernels::quantize_rows_grouped<T, kGroup, 4><<<blocks, kThreads, 0, stream>>>(x, q, p.scales, p.rows, p.k, qmax, fp8, pro); break;
  }
}

// Threads per row for a row of `chunks` 16-value chunks held in registers (at most 4 per thread): the
// widest of 32, 16, 8 that divides the row evenly, else the narrowest that holds it; 0 when a row is too
// long for one warp (a block per row then).
int group_for(std::int64_t chunks) {
  if (chunks > 4 * 32) return 0;
  for (int g : {32, 16, 8}) {
    if (chunks % g == 0 && (chunks + g - 1) / g <= 4) return g;
  }
  for (int g : {8, 16, 32}) {
    if ((chunks + g - 1) / g <= 4) return g;
  }
  return 32;
}

// Threads of a block holding a row of k values in kVecs 16-value chunks each: the fewest warps that hold it
// (3072 values: 192 threads, none idle).
unsigned held_threads(std::int64_t k, int vecs) {
  const std::int64_t per_thread = 16 * static_cast<std::int64_t>(vecs);
  const std::int64_t threads = ((k + per_thread - 1) / per_thread + 31) / 32 * 32;
  return static_cast<unsigned>(std::min<std::int64_t>(threads, kernels::kQuantizeThreads));
}

template <typename T>
void launch(const QuantizeRowsParams& p, cudaStream_t stream) {
  const bool fp8 = p.qtype == QuantType::kFloat8E4M3;
  const float qmax = fp8 ? kFloat8E4M3Max : kInt8Max;
  const auto* x = static_cast<const T*>(p.x);
  auto* q = static_cast<std::uint8_t*>(p.q);
  kernels::Prologue pro;
  pro.norm = p.norm == LinearNorm::kLayer ? 1 : p.norm == LinearNorm::kRms ? 2 : 0;
  pro.weight = pro.norm != 0 ? p.norm_weight : nullptr;
  pro.bias = pro.norm != 0 ? p.norm_bias : nullptr;
  pro.eps = p.eps;
  pro.activation = static_cast<int>(p.activation);
  pro.y = p.y;
  const auto blocks = static_cast<unsigned>(p.rows);
  constexpr int kThreads = kernels::kQuantizeThreads;
  const std::int64_t chunks = (p.k + 16 * kThreads - 1) / (16 * kThreads);  // 16-value chunks per thread
  // The register paths read the norm's weight and bias in float4s: unaligned ones take the last path.
  const bool held = p.k % 16 == 0 && aligned16(p.x) && aligned16(p.q) && (p.y == nullptr || aligned16(p.y)) &&
                    (pro.weight == nullptr || aligned16(pro.weight)) && (pro.bias == nullptr || aligned16(pro.bias));
  const int group = held ? group_for(p.k / 16) : 0;
  if (group == 32) {
    launch_grouped<T, 32>(x, q, p, p.k / 16, qmax, fp8, pro, stream);
  } else if (group == 16) {
    launch_grouped<T, 16>(x, q, p, p.k / 16, qmax, fp8, pro, stream);
  } else if (group == 8) {
    launch_grouped<T, 8>(x, q, p, p.k / 16, qmax, fp8, pro, stream);
  } else if (held && chunks <= 1) {
    kernels::quantize_rows_held<T, 1><<<blocks, held_threads(p.k, 1), 0, stream>>>(x, q, p.scales, p.k, qmax, fp8, pro);
  } else if (held && chunks <= 2) {
    kernels::quantize_rows_held<T, 2><<<blocks, held_threads(p.k, 2), 0, stream>>>(x, q, p.scales, p.k, qmax, fp8, pro);
  } else if (held && chunks <= 4) {
    kernels::quantize_rows_held<T, 4><<<blocks, held_threads(p.k, 4), 0, stream>>>(x, q, p.scales, p.k, qmax, fp8, pro);
  } else {
    kernels::quantize_rows_any<T><<<blocks, kThreads, 0, stream>>>(x, q, p.scales, p.k, qmax, fp8, pro);
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
  GPUOPT_CHECK_VALUE(p.norm_bias == nullptr || p.norm == LinearNorm::kLayer,
                     "quantize_rows: a norm bias is taken with a layer norm only");
  GPUOPT_CHECK_VALUE(p.eps >= 0.0f, "quantize_rows: eps must be >= 0, got ", p.eps);
  switch (p.type) {
    case ActivationType::kFloat16: launch<__half>(p, stream); break;
    case ActivationType::kBFloat16: launch<__nv_bfloat16>(p, stream); break;
    case ActivationType::kFloat32: launch<float>(p, stream); break;
  }
}

}  // namespace gpuopt::cuda
