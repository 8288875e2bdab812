#pragma once

// Programmatic dependent launch (compute capability 9.0+) for gpuopt's decode kernels.
//
// A decode step is a chain of short kernels, each of which spends its first microsecond or two waiting
// for its first loads to come back from HBM. Launched with cudaLaunchAttributeProgrammaticStreamSerialization,
// a kernel may start while the kernel before it in the stream is still running, once every block of that
// kernel has called allow_next_grid() (or exited). It must then call wait_for_prior_grid() before it reads
// anything: the wait returns when the prior grid has completed and its memory is visible. The kernels here
// trigger and wait first thing, so what overlaps is the launch of one kernel's blocks with the end of the
// kernel before (not its loads). Without the attribute (before 9.0, or turned off) the wait returns at once
// and the trigger does nothing. Captured into CUDA graphs as programmatic edges.

#include <cuda_runtime.h>

#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace kernels {

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel in the stream (if launched programmatically) start its blocks. Called first
// thing: the next kernel waits for this one to complete before it loads anything, so this is about when
// its blocks may be scheduled, not about data.
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

}  // namespace kernels

// Launches `kernel` with programmatic dependent launch where programmatic_launch_runs(device) (9.0+ and code
// built for it; the kernel must call kernels::wait_for_prior_grid() before it touches memory), plainly
// otherwise.
template <typename... Params, typename... Args>
void launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, int device, cudaStream_t stream,
                         Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic_launch_runs(device) ? 1 : 0;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  if (status != cudaSuccess) (void)cudaGetLastError();  // a bad launch is reported here, not by the next check
  GPUOPT_CHECK(status == cudaSuccess, "cudaLaunchKernelEx failed: ", cudaGetErrorName(status), " (",
               cudaGetErrorString(status), ")");
}

}  // namespace gpuopt::cuda
