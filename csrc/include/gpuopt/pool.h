// A thread-safe pool of memory blocks in size classes. A released block carries a fence (for CUDA:
// events recorded on every stream that used it) and is handed out again only once the fence says
// that work has finished. What memory is (pinned host, device, plain host) is the RawAllocator's
// business; what "finished" means is the Fence's. No CUDA and no torch here.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace gpuopt {

class Fence {
 public:
  virtual ~Fence() = default;
  virtual bool ready() = 0;  // the work that used the block has finished
  virtual void wait() = 0;   // block until ready
};

class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  // nullptr when the memory cannot be had (the pool turns that into an error naming the size).
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) noexcept = 0;
  virtual const char* kind() const = 0;
};

// Page-aligned host memory (std::aligned_alloc): the fallback for pinned memory without CUDA.
class HostAllocator final : public RawAllocator {
 public:
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) noexcept override;
  const char* kind() const override { return "host"; }
};

struct PoolOptions {
  std::string name = "pool";
  std::size_t capacity_bytes = 0;  // 0: unlimited; else reserved bytes may not exceed it
  // Under capacity_bytes, how long a request may wait for fenced free blocks (work still running on
  // a stream) to become reusable before it fails; 0 fails at once. At most kMaxFenceWaitTimeoutS.
  double fence_wait_timeout_s = 10.0;
};

constexpr double kMaxFenceWaitTimeoutS = 3600.0;

struct PoolStats {
  std::uint64_t acquisitions = 0, releases = 0;
  std::uint64_t hits = 0, misses = 0;    // served from the free lists / by a new allocation
  std::uint64_t busy_skips = 0;          // free blocks passed over because their fence was not ready
  std::uint64_t fence_waits = 0;         // requests that waited for fences to make room under capacity
  std::uint64_t allocations = 0, frees = 0;  // raw allocator calls
  std::uint64_t blocks_leaked = 0;  // free blocks whose fence failed (a CUDA error): never reused, never freed
  std::uint64_t bytes_reserved = 0, peak_bytes_reserved = 0;
  std::uint64_t bytes_in_use = 0, peak_bytes_in_use = 0;
  std::uint64_t bytes_requested_in_use = 0;
  std::uint64_t blocks_in_use = 0, free_blocks = 0;
  std::uint64_t largest_free_block = 0;
  double fragmentation = 0;  // 1 - requested / in use: what size-class rounding wastes now
};

struct Block {
  void* ptr = nullptr;
  std::size_t size = 0;       // the size class
  std::size_t requested = 0;  // what was asked for
};

class BlockPool {
 public:
  BlockPool(std::unique_ptr<RawAllocator> allocator, PoolOptions options);
  ~BlockPool();  // waits for fences and frees every block it holds
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `bytes`. Under capacity_bytes, when only free blocks whose fences are not
  // yet ready stand in the way, waits (up to fence_wait_timeout_s) for them. ValueError-kind errors
  // for 0 bytes, a closed pool, or a request that would exceed capacity_bytes even after freeing
  // idle blocks and waiting; RuntimeError-kind when the allocator fails.
  Block acquire(std::size_t bytes);
  // A pool hit or nothing: a free block of the size class whose fence is ready, without allocating
  // or waiting (so a caller can keep a lock, such as Python's GIL, across it). Errors as acquire().
  std::optional<Block> reuse(std::size_t bytes);
  // Returns a block; it is reused only once `fence` (if any) is ready.
  void release(const Block& block, std::unique_ptr<Fence> fence = nullptr);
  // Frees idle blocks whose fences are ready; returns the bytes freed.
  std::size_t trim();
  // Frees idle blocks (waiting for their fences) and refuses further acquisitions; blocks still in
  // use are freed when they are released.
  void close();
  bool closed() const;
  PoolStats stats() const;
  const PoolOptions& options() const { return options_; }
  const char* kind() const { return allocator_->kind(); }

  // 512-byte minimum; above 4 KiB four classes per power of two (at most 25% rounding waste).
  static std::size_t size_class(std::size_t bytes);

 private:
  struct FreeBlock {
    void* ptr;
    std::unique_ptr<Fence> fence;
  };
  using BlockList = std::vector<std::pair<void*, std::size_t>>;
  // A free block of class `cls` whose fence is ready, taken out of the free list; nullptr if none.
  void* take_ready_locked(std::size_t cls, bool count_skips);
  // Removes idle blocks with ready fences (all, waiting, if `wait`); the caller frees them unlocked.
  BlockList take_idle_locked(bool wait);
  void free_blocks(const BlockList& blocks);
  void update_free_stats_locked();
  void count_acquired_locked(std::size_t cls, std::size_t bytes);

  std::unique_ptr<RawAllocator> allocator_;
  PoolOptions options_;
  mutable std::mutex mu_;
  std::condition_variable released_;  // wakes requests waiting for room under capacity
  std::map<std::size_t, std::vector<FreeBlock>> free_;
  PoolStats stats_;
  bool closed_ = false;
};

}  // namespace gpuopt
