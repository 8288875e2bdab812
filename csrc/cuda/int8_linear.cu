#include <cstdint>

#include "gpuopt/cuda.h"
#include "int8_linear_kernels.cuh"
#include "pdl.cuh"

namespace gpuopt::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <typename T, int kRows, bool kStats>
void launch(const Int8LinearParams& p, cudaStream_t stream) {
  constexpr int kWarps = kernels::kInt8LinearWarps;
  const auto blocks = static_cast<unsigned>((p.n + kWarps - 1) / kWarps);
  launch_programmatic(kernels::int8_linear<T, kRows, kStats>, dim3(blocks), dim3(kWarps * 32), p.device, stream,
                      static_cast<const T*>(p.x), p.weight, p.scales, p.scales_fp32, static_cast<const T*>(p.bias),
                      static_cast<T*>(p.out), static_cast<int>(p.rows), p.n, p.k,
                      kernels::linear_epilogue<T>(p, p.relu));
}

// The smallest row tile that holds p.rows: five instantiations per type instead of sixteen.
template <typename T, bool kStats>
void launch_rows(const Int8LinearParams& p, cudaStream_t stream) {
  if (p.rows <= 1) {
    launch<T, 1, kStats>(p, stream);
  } else if (p.rows <= 2) {
    launch<T, 2, kStats>(p, stream);
  } else if (p.rows <= 4) {
    launch<T, 4, kStats>(p, stream);
  } else if (p.rows <= 8) {
    launch<T, 8, kStats>(p, stream);
  } else {
    static_assert(kInt8LinearMaxRows == 16, "the largest tile must hold kInt8LinearMaxRows rows");
    launch<T, 16, kStats>(p, stream);
  }
}

template <typename T>
void launch_simt(const Int8LinearParams& p, cudaStream_t stream) {
  if (p.norm != LinearNorm::kNone) {
    launch_rows<T, true>(p, stream);
  } else {
    launch_rows<T, false>(p, stream);
  }
}

template <typename T, int kTiles, int kWarps, int kVec, bool kStats>
void launch_mma(const Int8LinearParams& p, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((p.n + 15) / 16);
  launch_programmatic(kernels::int8_linear_mma<T, kTiles, kWarps, kVec, kStats>, dim3(blocks), dim3(kWarps * 32),
                      p.device, stream, static_cast<const T*>(p.x), p.weight, p.scales, p.scales_fp32,
                      static_cast<const T*>(p.bias), static_cast<T*>(p.out), static_cast<int>(p.rows), p.n, p.k,
                      kernels::linear_epilogue<T>(p, p.relu));
}

// 16-byte loads per weight row, lane and chunk: forced by p.mma_vector (where k allows), else 2 where k
// % 128 == 0 (a row's chunk is then 128 contiguous bytes, a whole L2 line), else 1.
int mma_vector(const Int8LinearParams& p) {
  const int v = p.mma_vector != 0 ? p.mma_vector : 2;
  return v == 2 && p.k % (2 * kernels::kInt8MmaChunk) == 0 ? 2 : 1;
}

// Warps per block (they split K, in chunks of 64 * vector values): forced by p.mma_warps, else one batch
// of kInt8MmaBatch / vector chunks per warp (4 to 32 warps), or, where the matrix has no more blocks than
// an H100 has SMs (n <= 2048: n / 16 blocks), one chunk per warp, up to 32. Measured on the H100 with one
// load per row and chunk, 24 layers' calls in one CUDA graph (--parts gemv): 6144 x 2048 7.3 us with 8
// warps against 8.4 with 16 and 9.9 with 32; 2048 x 2048 4.4 us with 32 or 16 against 5.2 with 8; 2048 x
// 8192 9.0 with 32 against 9.8 with 16.
int mma_warps(const Int8LinearParams& p, int vector) {
  if (p.mma_warps != 0) return p.mma_warps;
  const std::int64_t chunks = p.k / (kernels::kInt8MmaChunk * vector);
  const std::int64_t want = p.n <= kInt8LinearNarrowN ? chunks : chunks / (kernels::kInt8MmaBatch / vector);
  return want >= 32 ? 32 : want >= 16 ? 16 : want >= 8 ? 8 : 4;
}

template <typename T, int kTiles, int kVec, bool kStats>
void launch_mma_warps(const Int8LinearParams& p, cudaStream_t stream) {
  switch (mma_warps(p, kVec)) {
    case 4: launch_mma<T, kTiles, 4, kVec, kStats>(p, stream); return;
    case 8: launch_mma<T, kTiles, 8, kVec, kStats>(p, stream); return;
    case 16: launch_mma<T, kTiles, 16, kVec, kStats>(p, stream); return;
    default: launch_mma<T, kTiles, 32, kVec, kStats>(p, stream); return;
  }
}

template <typename T, int kTiles, bool kStats>
void launch_mma_vector(const Int8LinearParams& p, cudaStream_t stream) {
  if (mma_vector(p) == 2) {
    launch_mma_warps<T, kTiles, 2, kStats>(p, stream);
  } else {
    launch_mma_warps<T, kTiles, 1, kStats>(p, stream);
  }
}

template <typename T, bool kStats>
void launch_mma_rows_stats(const Int8LinearParams& p, cudaStream_t stream) {
  static_assert(kInt8LinearMaxRows == 16, "two 8-row tiles must hold kInt8LinearMaxRows rows");
  if (p.rows <= 8) {
    launch_mma_vector<T, 1, kStats>(p, stream);
  } else {
    launch_mma_vector<T, 2, kStats>(p, stream);
  }
}

template <typename T>
void launch_mma_rows(const Int8LinearParams& p, cudaStream_t stream) {
  if (p.norm != LinearNorm::kNone) {
    launch_mma_rows_stats<T, true>(p, stream);
  } else {
    launch_mma_rows_stats<T, false>(p, stream);
  }
}

}  // namespace

bool int8_linear_tensor_cores(const Int8LinearParams& p) {
  return p.type != ActivationType::kFloat32 && p.k % kernels::kInt8MmaChunk == 0 && mma_code_runs(p.device);
}

bool int8_linear_supported(const Int8LinearParams& p) {
  return p.rows >= 1 && p.rows <= kInt8LinearMaxRows && p.n >= 1 && p.k > 0 && p.k % 16 == 0 &&
         aligned16(p.x) && aligned16(p.weight);
}

void int8_linear(const Int8LinearParams& p, cudaStream_t stream) {
  GPUOPT_CHECK_VALUE(
      int8_linear_supported(p), "int8_linear: needs 1 <= rows <= ", kInt8LinearMaxRows,
      ", n >= 1, k a positive multiple of 16 and 16-byte aligned x and weight; got rows=", p.rows,
      ", n=", p.n, ", k=", p.k, ", x at ", p.x, ", weight at ", static_cast<const void*>(p.weight));
  GPUOPT_CHECK_VALUE(p.mma_warps == 0 || p.mma_warps == 4 || p.mma_warps == 8 || p.mma_warps == 16 ||
                         p.mma_warps == 32,
                     "int8_linear: mma_warps must be 0 (chosen from n and k), 4, 8, 16 or 32; got ", p.mma_warps);
  GPUOPT_CHECK_VALUE(p.mma_vector == 0 || p.mma_vector == 1 || p.mma_vector == 2,
                     "int8_linear: mma_vector must be 0 (chosen from k), 1 or 2; got ", p.mma_vector);
  GPUOPT_CHECK_VALUE(p.scales != nullptr && p.out != nullptr,
                     "int8_linear: scales and out must not be null");
  GPUOPT_CHECK_VALUE(p.norm != LinearNorm::kLayer || p.norm_sum != nullptr,
                     "int8_linear: a folded layer norm needs norm_sum (the weight's row sums times the scales)");
  const bool can_mma = int8_linear_tensor_cores(p);
  GPUOPT_CHECK_VALUE(can_mma || p.kernel != Int8Kernel::kTensorCore,
                     "int8_linear: the tensor-core kernel needs float16 or bfloat16 x, k a multiple of ",
                     kernels::kInt8MmaChunk, " and compute capability 8.0 or newer; got k=", p.k,
                     ", compute capability ", device_attribute(cudaDevAttrComputeCapabilityMajor, p.device), ".x");
  // Auto: one row of x with k < 4096 and n > 2048 streams faster through the SIMT kernel in a decode
  // step (OPT-1.3B on an H100, int8 static-graph-compile: its q/k/v, fc1 and LM head took 387 us per
  // step in SIMT kernels, 400 us in tensor-core ones with 8 warps, 464 us in a SIMT variant staging x
  // in shared memory -- though 24 layers' calls of one shape alone in a CUDA graph ranked them the
  // other way round), and so do two rows of a matrix wider than 16384; from two rows on (four for
  // those), longer rows or n <= 2048 (the SIMT kernel has only n / 8 blocks there), the tensor cores
  // win (2.0-4.7x at 8 rows: the SIMT kernel's work grows with the rows, theirs hardly does).
  const std::int64_t mma_rows = p.n > kInt8LinearWideN ? 4 : 2;
  const bool mma = p.kernel == Int8Kernel::kTensorCore ||
                   (p.kernel == Int8Kernel::kAuto && can_mma &&
                    (p.rows >= mma_rows || p.k >= kInt8LinearLongK || p.n <= kInt8LinearNarrowN));
  if (mma) {
    if (p.type == ActivationType::kFloat16) {
      launch_mma_rows<__half>(p, stream);
    } else {
      launch_mma_rows<__nv_bfloat16>(p, stream);
    }
    return;
  }
  switch (p.type) {
    case ActivationType::kFloat32: launch_simt<float>(p, stream); break;
    case ActivationType::kFloat16: launch_simt<__half>(p, stream); break;
    case ActivationType::kBFloat16: launch_simt<__nv_bfloat16>(p, stream); break;
  }
}

}  // namespace gpuopt::cuda
