#include "gpuopt/pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>

#include "gpuopt/errors.h"

namespace gpuopt {
namespace {

constexpr std::size_t kMinBlock = 512;
constexpr std::size_t kHostAlignment = 4096;

std::size_t round_up(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }

std::size_t bit_ceil(std::size_t x) {
  std::size_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

// 512 B, 8 KiB, 1.5 MiB, 2 GiB: sizes in error messages a person reads.
std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  std::ostringstream out;
  out.precision(u == 0 ? 0 : 3);
  out << v << " " << units[u];
  return out.str();
}

enum class FenceState { kReady, kBusy, kFailed };

// Never throws: it runs in destructors and in the middle of rebuilding a free list. A fence that fails
// (a sticky CUDA error such as a device-side assert) cannot say when the GPU is done with the block, so
// the block is leaked rather than reused or freed early.
FenceState poll_fence(Fence* fence, bool wait) noexcept {
  if (fence == nullptr) return FenceState::kReady;
  try {
    if (fence->ready()) return FenceState::kReady;
    if (!wait) return FenceState::kBusy;
    fence->wait();
    return FenceState::kReady;
  } catch (...) {
    return FenceState::kFailed;
  }
}

}  // namespace

void* HostAllocator::allocate(std::size_t bytes) {
  return std::aligned_alloc(kHostAlignment, round_up(bytes, kHostAlignment));
}

void HostAllocator::deallocate(void* ptr, std::size_t /*bytes*/) noexcept { std::free(ptr); }

std::size_t BlockPool::size_class(std::size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  const std::size_t p = bit_ceil(bytes);
  if (p <= 4096) return p;
  const std::size_t half = p / 2;
  for (std::size_t quarters : {5, 6, 7}) {
    const std::size_t c = round_up(half / 4 * quarters, kMinBlock);
    if (c >= bytes) return c;
  }
  return p;
}

BlockPool::BlockPool(std::unique_ptr<RawAllocator> allocator, PoolOptions options)
    : allocator_(std::move(allocator)), options_(std::move(options)) {
  GPUOPT_CHECK(allocator_ != nullptr, "BlockPool needs an allocator");
  const double t = options_.fence_wait_timeout_s;
  GPUOPT_CHECK_VALUE(t >= 0 && t <= kMaxFenceWaitTimeoutS, options_.name, ": fence_wait_timeout_s must be in [0, ",
                     kMaxFenceWaitTimeoutS, "] seconds, got ", t);
}

BlockPool::~BlockPool() {
  BlockList idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle = take_idle_locked(/*wait=*/true);
  }
  free_blocks(idle);
}

void* BlockPool::take_ready_locked(std::size_t cls, bool count_skips) {
  auto it = free_.find(cls);
  if (it == free_.end()) return nullptr;
  std::vector<FreeBlock>& list = it->second;
  for (std::size_t k = list.size(); k-- > 0;) {  // newest first: its memory is warmest
    if (list[k].fence == nullptr || list[k].fence->ready()) {
      void* ptr = list[k].ptr;
      list.erase(list.begin() + static_cast<std::ptrdiff_t>(k));
      update_free_stats_locked();
      return ptr;
    }
    if (count_skips) ++stats_.busy_skips;
  }
  return nullptr;
}

void BlockPool::count_acquired_locked(std::size_t cls, std::size_t bytes) {
  ++stats_.acquisitions;
  stats_.bytes_in_use += cls;
  stats_.bytes_requested_in_use += bytes;
  ++stats_.blocks_in_use;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
}

std::optional<Block> BlockPool::reuse(std::size_t bytes) {
  GPUOPT_CHECK_VALUE(bytes > 0, options_.name, ": size must be > 0 bytes, got ", bytes);
  const std::size_t cls = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  GPUOPT_CHECK_VALUE(!closed_, options_.name, " is closed; create a new pool");
  void* ptr = take_ready_locked(cls, /*count_skips=*/false);  // acquire() counts them if it follows
  if (ptr == nullptr) return std::nullopt;
  ++stats_.hits;
  count_acquired_locked(cls, bytes);
  return Block{ptr, cls, bytes};
}

Block BlockPool::acquire(std::size_t bytes) {
  GPUOPT_CHECK_VALUE(bytes > 0, options_.name, ": size must be > 0 bytes, got ", bytes);
  const std::size_t cls = size_class(bytes);
  const std::size_t cap = options_.capacity_bytes;
  // Declared before the lock, so trimmed blocks are freed after it is released, also on errors.
  struct Trimmed {
    BlockPool* pool;
    BlockList blocks;
    ~Trimmed() { pool->free_blocks(blocks); }
  } trimmed{this, {}};
  std::unique_lock<std::mutex> lock(mu_);
  std::chrono::steady_clock::time_point deadline;  // set when a wait begins: hits never read the clock
  auto poll = std::chrono::microseconds(50);
  bool waited = false;
  for (;;) {
    GPUOPT_CHECK_VALUE(!closed_, options_.name, " is closed; create a new pool");
    if (void* ptr = take_ready_locked(cls, /*count_skips=*/!waited)) {
      ++stats_.hits;
      count_acquired_locked(cls, bytes);
      return Block{ptr, cls, bytes};
    }
    if (cap == 0 || stats_.bytes_reserved + cls <= cap) break;
    BlockList idle = take_idle_locked(/*wait=*/false);
    trimmed.blocks.insert(trimmed.blocks.end(), idle.begin(), idle.end());
    if (stats_.bytes_reserved + cls <= cap) break;
    // What is still in the free lists now is fenced: reusable once the work on its streams is done.
    std::uint64_t fenced = 0;
    for (const auto& [c, list] : free_) fenced += c * list.size();
    const auto request = [&] {
      return detail::cat(options_.name, ": a ", human_bytes(bytes), " request (", human_bytes(cls),
                         " size class) would exceed capacity_bytes=", cap, " (", human_bytes(cap), "); ");
    };
    GPUOPT_CHECK_VALUE(fenced > 0 && stats_.bytes_reserved - fenced + cls <= cap, request(),
                       human_bytes(stats_.bytes_in_use), " are in use. Release tensors or raise capacity_bytes");
    const auto now = std::chrono::steady_clock::now();
    if (!waited) {
      deadline = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(options_.fence_wait_timeout_s));
    }
    GPUOPT_CHECK_VALUE(now < deadline, request(), human_bytes(fenced),
                       " of free blocks are held by pending GPU work (their fences did not complete within "
                       "fence_wait_timeout_s=", options_.fence_wait_timeout_s, ") and ", human_bytes(stats_.bytes_in_use),
                       " are in use. Synchronize the streams that use this pool's tensors before allocating, or "
                       "raise fence_wait_timeout_s or capacity_bytes");
    if (!waited) {
      waited = true;
      ++stats_.fence_waits;
    }
    // Fences complete on the GPU without telling anyone: poll, woken early by releases.
    released_.wait_for(lock, std::min<std::chrono::steady_clock::duration>(poll, deadline - now));
    poll = std::min(poll * 2, std::chrono::microseconds(2000));
  }
  stats_.bytes_reserved += cls;  // reserved before allocating: concurrent misses respect capacity
  lock.unlock();
  free_blocks(trimmed.blocks);  // before allocating: the memory is needed back first
  trimmed.blocks.clear();
  void* ptr = allocator_->allocate(cls);  // outside the lock: pinned allocations take milliseconds
  lock.lock();
  if (ptr == nullptr) {
    stats_.bytes_reserved -= cls;
    GPUOPT_CHECK(false, options_.name, ": the ", allocator_->kind(), " allocator could not provide ", human_bytes(cls));
  }
  ++stats_.misses;
  ++stats_.allocations;
  stats_.peak_bytes_reserved = std::max(stats_.peak_bytes_reserved, stats_.bytes_reserved);
  count_acquired_locked(cls, bytes);
  return Block{ptr, cls, bytes};
}

void BlockPool::release(const Block& block, std::unique_ptr<Fence> fence) {
  GPUOPT_CHECK_VALUE(block.ptr != nullptr && block.size == size_class(block.requested),
                     options_.name, ": release of a block this pool did not hand out");
  bool free_now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.releases;
    stats_.bytes_in_use -= block.size;
    stats_.bytes_requested_in_use -= block.requested;
    --stats_.blocks_in_use;
    if (closed_) {
      free_now = true;
      stats_.bytes_reserved -= block.size;
      ++stats_.frees;
    } else {
      free_[block.size].push_back(FreeBlock{block.ptr, std::move(fence)});
      update_free_stats_locked();
    }
  }
  released_.notify_all();
  if (!free_now) return;
  if (poll_fence(fence.get(), /*wait=*/true) == FenceState::kReady) {
    allocator_->deallocate(block.ptr, block.size);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    --stats_.frees;
    ++stats_.blocks_leaked;
  }
}

BlockPool::BlockList BlockPool::take_idle_locked(bool wait) {
  BlockList out;
  for (auto& [cls, list] : free_) {
    std::vector<FreeBlock> keep;
    for (FreeBlock& fb : list) {
      switch (poll_fence(fb.fence.get(), wait)) {
        case FenceState::kBusy:
          keep.push_back(std::move(fb));
          continue;
        case FenceState::kReady:
          out.emplace_back(fb.ptr, cls);
          ++stats_.frees;
          break;
        case FenceState::kFailed:
          ++stats_.blocks_leaked;
          break;
      }
      stats_.bytes_reserved -= cls;
    }
    list = std::move(keep);
  }
  update_free_stats_locked();
  return out;
}

void BlockPool::free_blocks(const BlockList& blocks) {
  for (const auto& [ptr, size] : blocks) allocator_->deallocate(ptr, size);
}

void BlockPool::update_free_stats_locked() {
  std::uint64_t count = 0, largest = 0;
  for (const auto& [cls, list] : free_) {
    count += list.size();
    if (!list.empty()) largest = cls;  // the map is ordered by size class
  }
  stats_.free_blocks = count;
  stats_.largest_free_block = largest;
}

std::size_t BlockPool::trim() {
  BlockList idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle = take_idle_locked(/*wait=*/false);
  }
  free_blocks(idle);
  std::size_t bytes = 0;
  for (const auto& b : idle) bytes += b.second;
  return bytes;
}

void BlockPool::close() {
  BlockList idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    idle = take_idle_locked(/*wait=*/true);
  }
  released_.notify_all();  // waiting requests fail at once
  free_blocks(idle);
}

bool BlockPool::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

PoolStats BlockPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PoolStats s = stats_;
  s.fragmentation = s.bytes_in_use > 0
                        ? 1.0 - static_cast<double>(s.bytes_requested_in_use) / static_cast<double>(s.bytes_in_use)
                        : 0.0;
  return s;
}

}  // namespace gpuopt
