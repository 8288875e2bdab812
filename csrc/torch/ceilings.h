// The device ceilings gpuopt measures with kernels of its own (the GEMM and transfer ceilings are
// measured from Python through torch's cuBLAS/copy paths, timed by gpuopt's loop).
#pragma once

#include <cstdint>

namespace gpuopt::torch_ext {

struct KernelCeilings {
  double hbm_read_gbps = 0, hbm_write_gbps = 0, hbm_copy_gbps = 0;
  double l2_gbps = 0;
  double fp32_fma_tflops = 0;
  double launch_host_us = 0, launch_device_us = 0;
  double graph_node_us = 0;
  std::int64_t hbm_bytes = 0, l2_bytes = 0;
};

// `quick`: smaller buffers and fewer repetitions (a smoke run, not a ceiling).
KernelCeilings measure_kernel_ceilings(std::int64_t device, bool quick);

}  // namespace gpuopt::torch_ext
