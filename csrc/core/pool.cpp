#include "gpuopt/pool.h"

#include <algorithm>
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
}

BlockPool::~BlockPool() {
  std::vector<std::pair<void*, std::size_t>> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle = take_idle_locked(/*wait=*/true);
  }
  free_blocks(idle);
}

Block BlockPool::acquire(std::size_t bytes) {
  GPUOPT_CHECK_VALUE(bytes > 0, options_.name, ": size must be > 0 bytes, got ", bytes);
  const std::size_t cls = size_class(bytes);
  std::vector<std::pair<void*, std::size_t>> trimmed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    GPUOPT_CHECK_VALUE(!closed_, options_.name, " is closed; create a new pool");
    ++stats_.acquisitions;
    auto it = free_.find(cls);
    if (it != free_.end()) {
      std::vector<FreeBlock>& list = it->second;
      for (std::size_t k = list.size(); k-- > 0;) {  // newest first: its memory is warmest
        if (list[k].fence == nullptr || list[k].fence->ready()) {
          Block b{list[k].ptr, cls, bytes};
          list.erase(list.begin() + static_cast<std::ptrdiff_t>(k));
          ++stats_.hits;
          stats_.bytes_in_use += cls;
          stats_.bytes_requested_in_use += bytes;
          ++stats_.blocks_in_use;
          stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
          update_free_stats_locked();
          return b;
        }
        ++stats_.busy_skips;
      }
    }
    ++stats_.misses;
    const std::size_t cap = options_.capacity_bytes;
    if (cap > 0 && stats_.bytes_reserved + cls > cap) {
      trimmed = take_idle_locked(/*wait=*/false);
      GPUOPT_CHECK_VALUE(stats_.bytes_reserved + cls <= cap, options_.name, ": a ", human_bytes(bytes),
                         " request (", human_bytes(cls), " size class) would exceed capacity_bytes=", cap, " (",
                         human_bytes(cap), "); ", human_bytes(stats_.bytes_in_use), " are in use. Release tensors or raise "
                         "capacity_bytes");
    }
    stats_.bytes_reserved += cls;  // reserved before allocating: concurrent misses respect capacity
  }
  free_blocks(trimmed);
  void* ptr = allocator_->allocate(cls);  // outside the lock: pinned allocations take milliseconds
  std::lock_guard<std::mutex> lock(mu_);
  if (ptr == nullptr) {
    stats_.bytes_reserved -= cls;
    GPUOPT_CHECK(false, options_.name, ": the ", allocator_->kind(), " allocator could not provide ", human_bytes(cls));
  }
  ++stats_.allocations;
  stats_.peak_bytes_reserved = std::max(stats_.peak_bytes_reserved, stats_.bytes_reserved);
  stats_.bytes_in_use += cls;
  stats_.bytes_requested_in_use += bytes;
  ++stats_.blocks_in_use;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
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
  if (free_now) {
    if (fence != nullptr) fence->wait();
    allocator_->deallocate(block.ptr, block.size);
  }
}

std::vector<std::pair<void*, std::size_t>> BlockPool::take_idle_locked(bool wait) {
  std::vector<std::pair<void*, std::size_t>> out;
  for (auto& [cls, list] : free_) {
    std::vector<FreeBlock> keep;
    for (FreeBlock& fb : list) {
      if (fb.fence != nullptr && !fb.fence->ready()) {
        if (!wait) {
          keep.push_back(std::move(fb));
          continue;
        }
        fb.fence->wait();
      }
      out.emplace_back(fb.ptr, cls);
      stats_.bytes_reserved -= cls;
      ++stats_.frees;
    }
    list = std::move(keep);
  }
  update_free_stats_locked();
  return out;
}

void BlockPool::free_blocks(const std::vector<std::pair<void*, std::size_t>>& blocks) {
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
  std::vector<std::pair<void*, std::size_t>> idle;
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
  std::vector<std::pair<void*, std::size_t>> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    idle = take_idle_locked(/*wait=*/true);
  }
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
