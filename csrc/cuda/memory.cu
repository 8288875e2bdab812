// CUDA pieces of the memory pools: recycled events, event fences, pinned and device allocators.
#include <mutex>
#include <unordered_map>
#include <vector>

#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace {

// Makes `device` current for the scope and restores the caller's device (switching only if needed).
// Never throws: it is also used by noexcept deallocators, where a failure shows in the next call.
class DeviceScope {
 public:
  explicit DeviceScope(int device) noexcept {
    if (cudaGetDevice(&prev_) == cudaSuccess && prev_ != device) switched_ = cudaSetDevice(device) == cudaSuccess;
  }
  ~DeviceScope() {
    if (switched_) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

std::mutex& event_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<int, std::vector<cudaEvent_t>>& event_cache() {
  // Leaked on purpose: events must outlive any pool that is destroyed during interpreter shutdown.
  static auto* cache = new std::unordered_map<int, std::vector<cudaEvent_t>>();
  return *cache;
}

}  // namespace

cudaEvent_t acquire_event(int device) {
  {
    std::lock_guard<std::mutex> lock(event_mutex());
    auto& list = event_cache()[device];
    if (!list.empty()) {
      cudaEvent_t e = list.back();
      list.pop_back();
      return e;
    }
  }
  DeviceScope scope(device);
  cudaEvent_t e = nullptr;
  GPUOPT_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void release_event(int device, cudaEvent_t event) noexcept {
  std::lock_guard<std::mutex> lock(event_mutex());
  event_cache()[device].push_back(event);
}

EventFence::EventFence(const StreamRef* streams, std::size_t count) {
  pending_.reserve(count);
  try {
    for (std::size_t i = 0; i < count; ++i) {
      const StreamRef& s = streams[i];
      pending_.push_back(Recorded{s.device, acquire_event(s.device)});
      const DeviceScope scope(s.device);  // the legacy default stream is the current device's
      GPUOPT_CHECK_CUDA(cudaEventRecord(pending_.back().event, s.stream));
    }
  } catch (...) {
    for (const Recorded& r : pending_) release_event(r.device, r.event);
    throw;
  }
}

EventFence::~EventFence() {
  for (const Recorded& r : pending_) release_event(r.device, r.event);
}

bool EventFence::ready() {
  while (!pending_.empty()) {
    const Recorded r = pending_.back();
    const cudaError_t status = cudaEventQuery(r.event);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    GPUOPT_CHECK_CUDA(status);
    pending_.pop_back();
    release_event(r.device, r.event);
  }
  return true;
}

void EventFence::wait() {
  while (!pending_.empty()) {
    const Recorded r = pending_.back();
    GPUOPT_CHECK_CUDA(cudaEventSynchronize(r.event));
    pending_.pop_back();
    release_event(r.device, r.event);
  }
}

void* PinnedAllocator::allocate(std::size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}

void PinnedAllocator::deallocate(void* ptr, std::size_t /*bytes*/) noexcept { cudaFreeHost(ptr); }

void* DeviceAllocator::allocate(std::size_t bytes) {
  DeviceScope scope(device_);
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}

void DeviceAllocator::deallocate(void* ptr, std::size_t /*bytes*/) noexcept {
  DeviceScope scope(device_);
  cudaFree(ptr);
}

}  // namespace gpuopt::cuda
