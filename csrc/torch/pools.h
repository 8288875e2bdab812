// Pools that hand out torch tensors: pinned host memory (plain page-aligned host memory without
// CUDA) and device memory, both gpuopt::BlockPool underneath. A tensor's storage goes back to its
// pool when the tensor is freed, with an event recorded on the current stream (and on every stream
// named with record_stream), so its block is reused only after that work has finished.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <memory>
#include <string>

#include "gpuopt/pool.h"

namespace gpuopt::torch_ext {

class TensorPool {
 public:
  enum class Kind { kPinned, kDevice };

  // device: the CUDA device of a device pool (ignored for pinned pools).
  static std::shared_ptr<TensorPool> create(Kind kind, std::int64_t device, std::size_t capacity_bytes,
                                            std::string name);

  at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype);
  // Marks `t` (a tensor of this pool) as used on `stream`: its block waits for that work too.
  void record_stream(const at::Tensor& t, const c10::Stream& stream);
  PoolStats stats() const { return pool_->stats(); }
  std::size_t trim() { return pool_->trim(); }
  void close() { pool_->close(); }
  bool closed() const { return pool_->closed(); }
  // True when blocks are page-locked (CUDA pinned) rather than plain host memory.
  bool page_locked() const;
  Kind kind() const { return kind_; }
  const std::string& name() const { return pool_->options().name; }

 private:
  TensorPool(Kind kind, std::int64_t device, std::unique_ptr<BlockPool> pool)
      : kind_(kind), device_(device), pool_(std::move(pool)) {}

  Kind kind_;
  std::int64_t device_;
  std::shared_ptr<BlockPool> pool_;
};

// Microbenchmarks for benchmarks/memory_pool.py, timed in C++ so no interpreter cost is counted:
// nanoseconds per empty() + free of a pool tensor (a pool hit after the first), and per
// cudaHostAlloc + cudaFreeHost of the same size (0 without CUDA).
double pool_cycle_ns(TensorPool& pool, at::IntArrayRef shape, at::ScalarType dtype, std::int64_t iters);
double host_alloc_cycle_ns(std::int64_t bytes, std::int64_t iters);

}  // namespace gpuopt::torch_ext
