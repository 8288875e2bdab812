#include "ceilings.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "device.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {

KernelCeilings measure_kernel_ceilings(std::int64_t device, bool quick) {
  const c10::DeviceIndex index = checked_cuda_device(device, "ceilings");
  KernelCeilings c;
#ifdef GPUOPT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(index);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(index).stream();
  const int reps = quick ? 5 : 20;
  // HBM: buffers many times the L2, filled with non-zero data first.
  const std::size_t l2 = cuda::l2_cache_bytes(index);
  const std::size_t hbm = std::max<std::size_t>(quick ? (256u << 20) : (1u << 30), 16 * l2) / 16 * 16;
  cuda::DeviceBuffer a(hbm), b(hbm);
  cuda::fill_pattern(static_cast<std::uint32_t*>(a.get()), static_cast<std::int64_t>(hbm / 4), 1, stream);
  c.hbm_bytes = static_cast<std::int64_t>(hbm);
  c.hbm_read_gbps = cuda::hbm_read_gbps(a.get(), hbm, reps, stream).median;
  c.hbm_write_gbps = cuda::hbm_write_gbps(b.get(), hbm, reps, stream).median;
  c.hbm_copy_gbps = cuda::hbm_copy_gbps(b.get(), a.get(), hbm, reps, stream).median;
  // L2: a quarter of it, read many times.
  const std::size_t small = std::max<std::size_t>(l2 / 4 / 16 * 16, 16);
  c.l2_bytes = static_cast<std::int64_t>(small);
  c.l2_gbps = cuda::l2_read_gbps(a.get(), small, quick ? 16 : 64, reps, stream).median;
  cuda::DeviceBuffer sink(sizeof(float));
  c.fp32_fma_tflops = cuda::fp32_fma_tflops(static_cast<float*>(sink.get()), reps, stream).median;
  const cuda::LaunchCost launch = cuda::launch_overhead(quick ? 1000 : 10000, stream);
  c.launch_host_us = launch.host_us_per_launch;
  c.launch_device_us = launch.device_us_per_kernel;
  c.graph_node_us = cuda::graph_node_us(1000, reps, stream).median;
#else
  (void)index;
  (void)quick;
#endif
  return c;
}

}  // namespace gpuopt::torch_ext
