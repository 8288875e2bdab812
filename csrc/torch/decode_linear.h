// The process-wide settings of gpuopt::decode_linear (decode_linear.cpp), for tests and benchmarks.
#pragma once

#include <cstdint>
#include <string>

namespace gpuopt::torch_ext {

// The most bytes of `prefetch` the kernel asks the L2 for, unless set otherwise.
constexpr std::int64_t kDefaultPrefetchBytes = 32LL << 20;

// "auto" (gpuopt's kernel where it applies, else cuBLAS) or "cublas" (always ATen's linear). Read at
// each call: a captured graph keeps what it captured. set_ returns the previous name; ValueError for
// any other.
std::string decode_linear_kernel();
std::string set_decode_linear_kernel(const std::string& name);
// The cap on the bytes of `prefetch` asked for (0: none). set_ returns the previous value; ValueError
// for a negative one.
std::int64_t decode_linear_prefetch_bytes();
std::int64_t set_decode_linear_prefetch_bytes(std::int64_t bytes);

}  // namespace gpuopt::torch_ext
