// The process-wide settings of gpuopt::decode_linear (decode_linear.cpp), for tests and benchmarks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// A chain of decode linear layers in one persistent kernel (gpuopt::cuda::decode_chain, a probe for the chain
// benchmark): out_s = act_s(x_s @ weights[s].T + biases[s]), x_0 = x, x_s = out_{s-1} (its first K_s columns);
// returns the last. activations: "none" or "relu" per layer. counter: two CUDA int64, zero when first used, one
// chain at a time. stages: the weight ring's depth (0: as many as fit). wait: false skips the waits between
// layers (timing only). trace: None or int64 [SMs, layers, 7] (a profile, decode_chain.cu); options: bit 0,
// the waits sleep between polls, bit 1 the tagged form (tags: int32, the layers' n summed, zeros when first used). TypeError/ValueError for what the kernel does not take.
at::Tensor decode_chain(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                        const std::vector<std::optional<at::Tensor>>& biases, const std::vector<std::string>& activations,
                        const at::Tensor& counter, std::int64_t stages, bool wait,
                        const std::optional<at::Tensor>& trace, std::int64_t options,
                        const std::optional<at::Tensor>& tags);

}  // namespace gpuopt::torch_ext
