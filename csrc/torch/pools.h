// Pools that hand out torch tensors: pinned host memory (plain page-aligned host memory without
// CUDA) and device memory, both gpuopt::BlockPool underneath. A tensor's storage goes back to its
// pool when the tensor is freed, fenced by an event on every stream that used it: the stream
// current when it was allocated, the stream current when it is freed, and every stream named with
// record_stream. Its block is reused only after all that work has finished.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "gpuopt/pool.h"

namespace gpuopt::torch_ext {

// Distinct streams a pool tensor can be fenced on through record_stream (the stream current at
// allocation counts; the one current at release is added on top). A bound, so a tensor recorded in
// a loop fails loudly instead of growing its fence without limit.
constexpr std::size_t kMaxStreamsPerTensor = 16;

class TensorPool {
 public:
  enum class Kind { kPinned, kDevice };

  // device: the CUDA device of a device pool (ignored for pinned pools). options.name prefixes
  // every error; capacity_bytes and fence_wait_timeout_s as in gpuopt::PoolOptions.
  static std::shared_ptr<TensorPool> create(Kind kind, std::int64_t device, PoolOptions options);

  at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype);
  // A tensor on a free block whose fence is ready, or nothing: never allocates and never waits, so
  // the Python binding keeps the GIL for it and releases it only for empty()'s slow path.
  std::optional<at::Tensor> reuse(at::IntArrayRef shape, at::ScalarType dtype);
  // Marks `t` (a tensor of this pool) as used on `stream`: its block waits for that work too.
  // Recording a stream twice is a no-op; more than kMaxStreamsPerTensor streams is a ValueError.
  void record_stream(const at::Tensor& t, const c10::Stream& stream);
  PoolStats stats() const { return pool_->stats(); }
  std::size_t trim() { return pool_->trim(); }
  void close() { pool_->close(); }
  bool closed() const { return pool_->closed(); }
  // True when blocks are page-locked (CUDA pinned) rather than plain host memory.
  bool page_locked() const { return page_locked_; }
  Kind kind() const { return kind_; }
  c10::DeviceIndex device() const { return device_; }  // -1 for pinned pools
  const std::string& name() const { return pool_->options().name; }
  const PoolOptions& options() const { return pool_->options(); }

 private:
  TensorPool(Kind kind, c10::DeviceIndex device, std::unique_ptr<BlockPool> pool);
  // The tensor whose storage is `block`, returned to the pool (fenced) when the storage is freed.
  at::Tensor wrap(const Block& block, at::IntArrayRef shape, at::ScalarType dtype);

  Kind kind_;
  c10::DeviceIndex device_;  // a device pool's device; -1 for pinned pools
  bool page_locked_;
  std::shared_ptr<BlockPool> pool_;
};

// Microbenchmarks for benchmarks/memory_pool.py, timed in C++ so no interpreter cost is counted:
// nanoseconds per empty() + free of a pool tensor (a pool hit after the first), and per
// cudaHostAlloc + cudaFreeHost of the same size (0 without CUDA).
double pool_cycle_ns(TensorPool& pool, at::IntArrayRef shape, at::ScalarType dtype, std::int64_t iters);
double host_alloc_cycle_ns(std::int64_t bytes, std::int64_t iters);

struct PoolStressResult {
  std::int64_t tensors = 0;    // created and freed, in all threads
  std::int64_t corrupted = 0;  // tensors whose contents another thread overwrote (a block handed out twice)
  double seconds = 0;
};
// A concurrency check without the GIL: `threads` C++ threads each create and free `iters` tensors
// of random sizes (uint8, 16 B to 16 KiB) from a host-accessible pool, holding up to four at a
// time, tagging each at both ends and checking the tags before freeing it.
PoolStressResult pool_stress(TensorPool& pool, std::int64_t threads, std::int64_t iters, std::int64_t seed);

}  // namespace gpuopt::torch_ext
