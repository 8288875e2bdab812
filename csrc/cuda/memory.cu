// CUDA pieces of the memory pools: recycled events, event fences, pinned and device allocators.
#include <mutex>
#include <unordered_map>
#include <vector>

#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace {

// Restores the caller's current device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&prev_);
    if (prev_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() { cudaSetDevice(prev_); }

 private:
  int prev_ = 0;
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

EventFence::EventFence(int device, const cudaStream_t* streams, std::size_t count) : device_(device) {
  GPUOPT_CHECK(count <= 4, "an event fence covers at most 4 streams, got ", count);
  for (std::size_t i = 0; i < count; ++i) {
    events_[i] = acquire_event(device);
    ++count_;
    GPUOPT_CHECK_CUDA(cudaEventRecord(events_[i], streams[i]));
  }
}

EventFence::~EventFence() {
  for (std::size_t i = 0; i < count_; ++i) release_event(device_, events_[i]);
}

bool EventFence::ready() {
  for (std::size_t i = 0; i < count_; ++i) {
    const cudaError_t status = cudaEventQuery(events_[i]);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    GPUOPT_CHECK_CUDA(status);
  }
  return true;
}

void EventFence::wait() {
  for (std::size_t i = 0; i < count_; ++i) GPUOPT_CHECK_CUDA(cudaEventSynchronize(events_[i]));
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
