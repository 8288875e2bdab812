#pragma once

// Programmatic dependent launch (compute capability 9.0+) for gpuopt's decode kernels.
//
// A decode step is a chain of short kernels, each of which spends its first microsecond or two waiting
// for its first loads to come back from HBM. Launched with cudaLaunchAttributeProgrammaticStreamSerialization,
// a kernel may start while the kernel before it in the stream is still running, once every block of that
// kernel has called allow_next_grid() (or exited). It must then call wait_for_prior_grid() before it reads
// anything: the wait returns when the prior grid has completed and its memory is visible. Before the wait
// the GEMV kernels only ask for their first weight lines to be brought into L2 (prefetch_l2: no data
// reaches the kernel, and L2 is where every write lands, so a weight written by the kernel before is
// still read right), so the weights start streaming while the kernel before finishes. Without the
// attribute (before 9.0, or turned off) the wait returns at once and the trigger does nothing. Captured
// into CUDA graphs as programmatic edges.

#include <cuda_runtime.h>

#include <cstdint>

#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace kernels {

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Asks for the 128-byte line at p to be brought into L2 (a hint: nothing is read into registers).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// prefetch_l2(p) where p starts a 128-byte line: called by every lane for each 16-byte word it is about to
// load, it asks for each whole line in a contiguous range once.
__device__ __forceinline__ void prefetch_l2_line_start(const void* p) {
  if ((reinterpret_cast<std::uintptr_t>(p) & 127u) == 0) prefetch_l2(p);
}

// Lets the next kernel in the stream (if launched programmatically) start its blocks. Called first
// thing: the next kernel waits for this one to complete before it touches its output, so this is
// about when its blocks may start fetching their weights, not about data.
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

}  // namespace kernels

// Launches `kernel` with programmatic dependent launch where programmatic_launch_runs(device) (the kernel
// must call kernels::wait_for_prior_grid() before touching data others write), plainly otherwise.
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
  GPUOPT_CHECK_CUDA(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

}  // namespace gpuopt::cuda
