// RAII guards for the global switches an optimization config flips: autocast (enable, dtype, cache),
// TF32 for cuBLAS and cuDNN, cudnn.benchmark, inference mode. Each restores exactly what it found,
// so a config never leaks state into the caller's program.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace gpuopt::torch_ext {

struct StateSpec {
  // Autocast: nullopt leaves the caller's setting alone; false disables it; true enables it with
  // `autocast_dtype` for `device_type`.
  std::optional<bool> autocast;
  at::ScalarType autocast_dtype = at::kHalf;
  c10::DeviceType device_type = c10::DeviceType::CUDA;
  bool autocast_cache = true;  // must be false while capturing CUDA graphs
  std::optional<bool> tf32;  // TF32 for fp32 matmuls (cuBLAS) and convolutions (cuDNN)
  std::optional<bool> cudnn_benchmark;
  bool inference_mode = false;
};

// Throws ValueError for an autocast dtype or device type torch's autocast does not support.
void validate(const StateSpec& spec);

class StateGuard {
 public:
  explicit StateGuard(const StateSpec& spec);
  ~StateGuard();
  StateGuard(const StateGuard&) = delete;
  StateGuard& operator=(const StateGuard&) = delete;

 private:
  StateSpec spec_;
  bool prev_autocast_ = false;
  at::ScalarType prev_autocast_dtype_ = at::kHalf;
  bool prev_autocast_cache_ = true;
  std::string prev_matmul_precision_;
  bool prev_cudnn_tf32_ = false;
  bool prev_cudnn_benchmark_ = false;
  std::optional<c10::InferenceMode> inference_;
};

// The state as torch reports it, for tests and for the record of a run.
struct StateSnapshot {
  bool autocast_cuda, autocast_cpu;
  at::ScalarType autocast_cuda_dtype, autocast_cpu_dtype;
  std::string matmul_precision;  // "highest", "high", "medium"
  bool cudnn_tf32, cudnn_benchmark, inference_mode;
};
StateSnapshot snapshot();

}  // namespace gpuopt::torch_ext
