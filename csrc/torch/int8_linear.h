// The kernel gpuopt::int8_weight_only_linear runs for decode rows on CUDA (int8_linear.cpp).
#pragma once

#include <string>

namespace gpuopt::torch_ext {

// "auto" (tensor cores where they apply -- float16/bfloat16 x, K % 64 == 0, compute capability 8.0
// or newer -- from two rows on (four for N > 16384), for K >= 4096 or N <= 2048; else the SIMT kernel,
// which streams one row of a wide, short matrix faster in a decode step), "simt" or "tensor-core" (a
// case it cannot run is a ValueError).
// Process-wide, read at each call (a captured graph keeps the kernel it captured); for tests and
// benchmarks that compare the two. set_ returns the previous name; ValueError for any other name.
std::string int8_linear_kernel();
std::string set_int8_linear_kernel(const std::string& name);
// The tensor-core kernel's warps per block (they split K): 0 (chosen from N and K), 4, 8, 16 or 32.
// Process-wide like the kernel; set_ returns the previous value; ValueError for any other.
int int8_linear_warps();
int set_int8_linear_warps(int warps);
// Its 16-byte loads per weight row, lane and 64-value chunk: 0 (chosen: 2 where K % 128 == 0), 1 or 2.
// Process-wide like the kernel; set_ returns the previous value; ValueError for any other.
int int8_linear_vector();
int set_int8_linear_vector(int vector);

}  // namespace gpuopt::torch_ext
