// gpuopt's CUDA layer: kernels and CUDA-runtime helpers with no torch and no Python. Every launch
// takes an explicit stream. Only available when the build compiled CUDA (GPUOPT_WITH_CUDA).
#pragma once

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <cstddef>
#include <cstdint>

#include "gpuopt/errors.h"
#include "gpuopt/pool.h"

#define GPUOPT_CHECK_CUDA(expr)                                                              \
  do {                                                                                       \
    const cudaError_t gpuopt_status_ = (expr);                                               \
    GPUOPT_CHECK(gpuopt_status_ == cudaSuccess, #expr, " failed: ",                          \
                 cudaGetErrorName(gpuopt_status_), " (", cudaGetErrorString(gpuopt_status_), \
                 ")");                                                                       \
  } while (0)

// After every kernel launch: a bad configuration shows up here, not at the next sync.
#define GPUOPT_CHECK_LAUNCH() GPUOPT_CHECK_CUDA(cudaGetLastError())

namespace gpuopt::cuda {

// A CUDA event with timing enabled, destroyed with its owner.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;

  void record(cudaStream_t stream);
  void synchronize() const;
  bool query() const;  // true when the work before the record has completed
  cudaEvent_t get() const { return event_; }
  // Milliseconds between two recorded events (start must precede end on the device).
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  cudaEvent_t event_ = nullptr;
};

// Device memory from cudaMalloc, outside torch's caching allocator (so that gpuopt's own scratch,
// such as the L2 flush buffer, never shows in a model's peak-memory figures).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// An NVTX range for the scope, so profiler traces show gpuopt's phases. Costs a few ns without a tool.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// Events without timing, recycled: recording a fence must cost about a microsecond, not the tens of
// microseconds cudaEventCreate can take. Thread-safe; per device.
cudaEvent_t acquire_event(int device);
void release_event(int device, cudaEvent_t event) noexcept;

// A pool fence: events recorded on the streams that used a block; ready when all have completed.
class EventFence final : public gpuopt::Fence {
 public:
  EventFence(int device, const cudaStream_t* streams, std::size_t count);
  ~EventFence() override;
  bool ready() override;
  void wait() override;

 private:
  int device_;
  cudaEvent_t events_[4] = {};
  std::size_t count_ = 0;
};

// Raw allocators for gpuopt::BlockPool.
class PinnedAllocator final : public gpuopt::RawAllocator {
 public:
  void* allocate(std::size_t bytes) override;  // cudaHostAlloc (portable)
  void deallocate(void* ptr, std::size_t bytes) noexcept override;
  const char* kind() const override { return "pinned"; }
};

class DeviceAllocator final : public gpuopt::RawAllocator {
 public:
  explicit DeviceAllocator(int device) : device_(device) {}
  void* allocate(std::size_t bytes) override;  // cudaMalloc on `device`
  void deallocate(void* ptr, std::size_t bytes) noexcept override;
  const char* kind() const override { return "device"; }

 private:
  int device_;
};

// out[i] = pattern(i, seed) for i < n: a cheap integer hash, so results are checkable
// exactly on the host. Also what flush_l2 writes (every byte of the buffer is stored).
void fill_pattern(std::uint32_t* out, std::int64_t n, std::uint32_t seed, cudaStream_t stream);

// A single-thread kernel that spins for `ns` nanoseconds of %globaltimer. Queued before a timed
// region it keeps the GPU busy while the host enqueues the region, so launch gaps stay out of
// device-time measurements.
void delay(std::uint64_t ns, cudaStream_t stream);

// Device-to-device copy of `bytes`, `reps` times back to back between events; ms per copy.
double time_copy_ms(void* dst, const void* src, std::size_t bytes, int reps, cudaStream_t stream);

// cudaDeviceGetAttribute, checked.
int device_attribute(cudaDeviceAttr attribute, int device);

// ---- Device ceilings (micro-benchmarks of ours). Each runs `reps` timed launches on `stream` after
// one warm-up launch and returns the median rate. Buffers are the caller's.
struct Rate {
  double median = 0;  // GB/s, TFLOP/s or us, per the function
  double best = 0;
};
// HBM: 16-byte vectorised grid-stride loops; bytes counted once each (copy: read + written).
Rate hbm_read_gbps(const void* buffer, std::size_t bytes, int reps, cudaStream_t stream);
Rate hbm_write_gbps(void* buffer, std::size_t bytes, int reps, cudaStream_t stream);
Rate hbm_copy_gbps(void* dst, const void* src, std::size_t bytes, int reps, cudaStream_t stream);
// L2: `passes` reads of a buffer small enough to stay in L2, loads cached at L2 only (ld.global.cg).
Rate l2_read_gbps(const void* buffer, std::size_t bytes, int passes, int reps, cudaStream_t stream);
// CUDA-core FP32: independent FMA chains in every thread of a full grid; FLOPs = 2 per FMA.
Rate fp32_fma_tflops(float* sink, int reps, cudaStream_t stream);
// Empty kernels: host microseconds per launch, and device microseconds per kernel when launched
// back to back (launch-rate bound).
struct LaunchCost {
  double host_us_per_launch = 0;
  double device_us_per_kernel = 0;
};
LaunchCost launch_overhead(int launches, cudaStream_t stream);
// A CUDA graph of `nodes` empty kernels, replayed: device microseconds per node.
Rate graph_node_us(int nodes, int reps, cudaStream_t stream);

int runtime_version();  // e.g. 13000
int driver_version();   // the CUDA version the driver supports, e.g. 13000; 0 without a driver

}  // namespace gpuopt::cuda
