#include "graphs.h"

#ifdef GPUOPT_WITH_CUDA
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace gpuopt::torch_ext {

#ifdef GPUOPT_WITH_CUDA
namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;
using Mempool = std::pair<unsigned long long, unsigned long long>;  // MempoolId_t, wherever a release puts it

Mempool mempool(PoolId pool) {
  return {static_cast<unsigned long long>(pool.first), static_cast<unsigned long long>(pool.second)};
}

// The pinned-host allocator routes a capture's allocations to the pool too, in torch releases that
// have the calls; in those without, there is nothing to undo.
template <class A>
auto end_host_routing(A* host, Mempool pool, int) -> decltype(host->end_allocate_to_pool(pool), bool()) {
  try {
    host->end_allocate_to_pool(pool);
    return true;
  } catch (...) {  // not routing to it (any more): torch ended it
    return false;
  }
}
template <class A>
bool end_host_routing(A*, Mempool, long) {
  return false;
}

// The private pool's use count, where this torch can tell it (-1: it cannot).
template <class A>
auto use_count(A* a, c10::DeviceIndex device, Mempool pool, int) -> decltype(a->getPoolUseCount(device, pool), int()) {
  try {
    return a->getPoolUseCount(device, pool);
  } catch (...) {  // no such pool
    return 0;
  }
}
template <class A>
int use_count(A*, c10::DeviceIndex, Mempool, long) {
  return -1;
}

template <class A>
auto release_host_pool(A* host, Mempool pool, int) -> decltype(host->release_pool(pool), void()) {
  try {
    host->release_pool(pool);
  } catch (...) {
  }
}
template <class A>
void release_host_pool(A*, Mempool, long) {}

}  // namespace
#endif

int graph_pool_use_count(std::int64_t device, PoolId pool) {
#ifdef GPUOPT_WITH_CUDA
  try {
    // Only torch's own caching allocator tells a missing pool (an error) from a count; another backend
    // (cudaMallocAsync) errors for every pool.
    if (alloc::get()->name() != "native") return -1;
    return use_count(alloc::get(), static_cast<c10::DeviceIndex>(device), mempool(pool), 0);
  } catch (...) {
    return -1;
  }
#else
  (void)device;
  (void)pool;
  return 0;
#endif
}

int release_failed_capture(std::int64_t device, PoolId pool, int use_count_before) noexcept {
#ifdef GPUOPT_WITH_CUDA
  const auto index = static_cast<c10::DeviceIndex>(device);
  const Mempool id = mempool(pool);
  int undone = 0;
  bool routing_left = false;
  try {
    alloc::endAllocateToPool(index, id);
    routing_left = true;
    ++undone;
  } catch (...) {  // torch ended the routing (capture_end got that far, or reset() did it)
  }
  try {
    at::HostAllocator* host = at::getHostAllocator(at::kCUDA);
    if (host != nullptr && end_host_routing(host, id, 0)) {
      ++undone;
      release_host_pool(host, id, 0);  // routing left on: its reference was left too
    }
  } catch (...) {
  }
  try {
    const int now = graph_pool_use_count(device, pool);
    // Without a use count to read, a routing torch left on says its reset() kept the reference too.
    if (now < 0 ? routing_left : now > use_count_before) {
      alloc::releasePool(index, id);
      ++undone;
    }
  } catch (...) {
  }
  return undone;
#else
  (void)device;
  (void)pool;
  (void)use_count_before;
  return 0;
#endif
}

}  // namespace gpuopt::torch_ext
