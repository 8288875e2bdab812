// Which of this binary's device code a device runs, and the process-wide programmatic-launch setting:
// asked by every kernel family's launcher (decode_linear, int8_linear, decode_attention).
#include <atomic>

#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace {

// Built for the same architecture list as every other kernel, so its code's version is theirs.
__global__ void code_probe() {}

// The compute capability's major number per device, asked once (a host query, no stream work).
int cc_major(int device) {
  constexpr int kDevices = 64;
  static std::atomic<int> cache[kDevices] = {};
  if (device < 0 || device >= kDevices) return device_attribute(cudaDevAttrComputeCapabilityMajor, device);
  int v = cache[device].load(std::memory_order_relaxed);
  if (v == 0) {
    v = device_attribute(cudaDevAttrComputeCapabilityMajor, device);
    cache[device].store(v, std::memory_order_relaxed);
  }
  return v;
}

// The virtual architecture (major * 10 + minor) of this binary's code that `device` runs, 0 where it has
// none. A build for 8.0 alone runs its compute_80 PTX on a 9.0 device, JIT-compiled, with the 9.0-only
// code compiled out. Asked once per device (made current for the query).
int code_arch(int device) {
  constexpr int kDevices = 64;
  static std::atomic<int> cache[kDevices] = {};  // 0 unknown, else the answer + 1
  if (device >= 0 && device < kDevices) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known != 0) return known - 1;
  }
  int current = 0;
  GPUOPT_CHECK_CUDA(cudaGetDevice(&current));
  if (current != device) GPUOPT_CHECK_CUDA(cudaSetDevice(device));
  cudaFuncAttributes attributes = {};
  const cudaError_t status = cudaFuncGetAttributes(&attributes, code_probe);
  if (current != device) GPUOPT_CHECK_CUDA(cudaSetDevice(current));
  // No code for this device in the binary (cudaErrorInvalidDeviceFunction, say): the callers' fallbacks run;
  // the error is not left for the next check to find.
  if (status != cudaSuccess) (void)cudaGetLastError();
  const int arch = status == cudaSuccess ? attributes.ptxVersion : 0;
  if (device >= 0 && device < kDevices) cache[device].store(arch + 1, std::memory_order_relaxed);
  return arch;
}

std::atomic<bool> g_programmatic{true};

}  // namespace

bool programmatic_launch() { return g_programmatic.load(); }

bool set_programmatic_launch(bool enabled) { return g_programmatic.exchange(enabled); }

// Programmatic launch needs the device (9.0+) and code built for it: in code JIT-compiled from an older
// virtual architecture the kernels' trigger and wait are compiled out, and the attribute must not be set.
bool programmatic_launch_runs(int device) {
  return g_programmatic.load(std::memory_order_relaxed) && hopper_code_runs(device);
}

bool hopper_code_runs(int device) { return cc_major(device) >= 9 && code_arch(device) >= 90; }

// Tensor-core (mma.sync) code needs 8.0+ and code built for it (a build for 7.5 alone would run its
// compute_75 PTX there, JIT-compiled, whose MMA is compiled out).
bool mma_code_runs(int device) { return cc_major(device) >= 8 && code_arch(device) >= 80; }

}  // namespace gpuopt::cuda
