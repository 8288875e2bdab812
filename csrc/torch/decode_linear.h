// The process-wide settings of gpuopt::decode_linear (decode_linear.cpp), for tests and benchmarks.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace gpuopt::torch_ext {

// "auto" (gpuopt's kernel where it applies, else cuBLAS) or "cublas" (always ATen's linear). Read at
// each call: a captured graph keeps what it captured. set_ returns the previous name; ValueError for
// any other.
std::string decode_linear_kernel();
std::string set_decode_linear_kernel(const std::string& name);
// The kernel's layout: warps per block (0: chosen from K; 4, 8, 16, 32) and 16-byte loads per weight row,
// lane and chunk (0: chosen; 1, 2, 4 -- each where K is a multiple of 32 times it, else the largest that fits). Process-wide like the kernel; set_
// returns the previous pair; ValueError for any other value.
std::pair<int, int> decode_linear_layout();
std::pair<int, int> set_decode_linear_layout(int warps, int vector);
// Whether the decode kernels (decode_linear, int8_weight_only_linear, decode_attention) launch with
// programmatic dependent launch on compute capability 9.0+ (csrc/cuda/pdl.cuh; default true). Read at each
// call: a captured graph keeps what it captured. set_ returns the previous value.
bool programmatic_launch();
bool set_programmatic_launch(bool enabled);
// Whether the decode kernels launch programmatically on CUDA device `device` now: the setting is on, the
// device is 9.0+ and this binary's code for it is built for 9.0+. False in a build without CUDA (nothing
// launches); checked_cuda_device's errors otherwise (ValueError without a visible device, IndexError for
// an index out of range).
bool programmatic_launch_runs(int device);

}  // namespace gpuopt::torch_ext
