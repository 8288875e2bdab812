#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gpuopt/errors.h"
#include "gpuopt/pool.h"

namespace {

using gpuopt::Block;
using gpuopt::BlockPool;
using gpuopt::PoolOptions;

// A fence the test opens by hand, standing in for a CUDA event on a busy stream.
struct Gate {
  std::atomic<bool> open{false};
};
class GateFence : public gpuopt::Fence {
 public:
  explicit GateFence(std::shared_ptr<Gate> g) : g_(std::move(g)) {}
  bool ready() override { return g_->open.load(); }
  void wait() override {
    while (!g_->open.load()) std::this_thread::yield();
  }

 private:
  std::shared_ptr<Gate> g_;
};

// Counts allocations so tests can see misses and leaks.
class CountingAllocator : public gpuopt::RawAllocator {
 public:
  explicit CountingAllocator(std::shared_ptr<std::atomic<long>> live) : live_(std::move(live)) {}
  void* allocate(std::size_t bytes) override {
    ++*live_;
    return host_.allocate(bytes);
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    --*live_;
    host_.deallocate(p, bytes);
  }
  const char* kind() const override { return "counting"; }

 private:
  gpuopt::HostAllocator host_;
  std::shared_ptr<std::atomic<long>> live_;
};

std::unique_ptr<BlockPool> make_pool(std::shared_ptr<std::atomic<long>> live, std::size_t capacity = 0) {
  PoolOptions o;
  o.name = "TestPool";
  o.capacity_bytes = capacity;
  return std::make_unique<BlockPool>(std::make_unique<CountingAllocator>(std::move(live)), o);
}

TEST(Pool, SizeClassesRoundUpByAtMostAQuarter) {
  EXPECT_EQ(BlockPool::size_class(1), 512u);
  EXPECT_EQ(BlockPool::size_class(512), 512u);
  EXPECT_EQ(BlockPool::size_class(513), 1024u);
  EXPECT_EQ(BlockPool::size_class(4096), 4096u);
  for (std::size_t b = 1; b < (1u << 26); b = b * 3 / 2 + 7) {
    const std::size_t c = BlockPool::size_class(b);
    EXPECT_GE(c, b);
    if (b > 4096) {
      EXPECT_LE(static_cast<double>(c), 1.25 * static_cast<double>(b) + 512) << b;
    }
    EXPECT_EQ(BlockPool::size_class(c), c);  // classes are fixed points
  }
}

TEST(Pool, ReusesReleasedBlocksAndCountsHits) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto pool = make_pool(live);
  Block a = pool->acquire(1000);
  std::memset(a.ptr, 1, 1000);  // the memory is real and writable
  pool->release(a);
  Block b = pool->acquire(900);  // same class
  EXPECT_EQ(a.ptr, b.ptr);
  const auto s = pool->stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.allocations, 1u);
  EXPECT_EQ(s.bytes_in_use, 1024u);
  EXPECT_EQ(s.bytes_requested_in_use, 900u);
  EXPECT_NEAR(s.fragmentation, 1.0 - 900.0 / 1024.0, 1e-12);
  pool->release(b);
  EXPECT_EQ(pool->stats().free_blocks, 1u);
  EXPECT_EQ(pool->stats().largest_free_block, 1024u);
}

TEST(Pool, ABlockIsNotReusedBeforeItsFenceIsReady) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto pool = make_pool(live);
  auto gate = std::make_shared<Gate>();
  Block a = pool->acquire(4096);
  pool->release(a, std::make_unique<GateFence>(gate));
  Block b = pool->acquire(4096);  // the fence is closed: a new block
  EXPECT_NE(a.ptr, b.ptr);
  EXPECT_EQ(pool->stats().busy_skips, 1u);
  gate->open = true;
  Block c = pool->acquire(4096);
  EXPECT_EQ(c.ptr, a.ptr);
  pool->release(b);
  pool->release(c);
}

TEST(Pool, CapacityIsEnforcedAfterTrimmingIdleBlocks) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto pool = make_pool(live, 8192);
  Block a = pool->acquire(4096);
  Block b = pool->acquire(4096);
  try {
    pool->acquire(512);
    FAIL() << "expected the capacity error";
  } catch (const gpuopt::Error& e) {
    EXPECT_EQ(e.kind(), gpuopt::ErrorKind::kValue);
    EXPECT_NE(std::string(e.what()).find("TestPool"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("capacity_bytes=8192"), std::string::npos);
  }
  pool->release(a);
  Block c = pool->acquire(1024);  // a different class: the idle 4 KiB block is trimmed to make room
  EXPECT_EQ(pool->stats().frees, 1u);
  pool->release(b);
  pool->release(c);
}

TEST(Pool, BadRequestsAndUseAfterClose) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto pool = make_pool(live);
  EXPECT_THROW(pool->acquire(0), gpuopt::Error);
  Block held = pool->acquire(2048);
  Block idle = pool->acquire(2048);
  pool->release(idle);
  pool->close();
  EXPECT_TRUE(pool->closed());
  EXPECT_EQ(*live, 1);  // the idle block is gone, the held one not yet
  try {
    pool->acquire(16);
    FAIL();
  } catch (const gpuopt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("TestPool is closed"), std::string::npos);
  }
  pool->release(held);  // freed at once
  EXPECT_EQ(*live, 0);
}

TEST(Pool, TrimFreesOnlyBlocksWhoseFencesAreReady) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto pool = make_pool(live);
  auto gate = std::make_shared<Gate>();
  Block a = pool->acquire(8192), b = pool->acquire(8192);
  pool->release(a, std::make_unique<GateFence>(gate));
  pool->release(b);
  EXPECT_EQ(pool->trim(), 8192u);
  EXPECT_EQ(*live, 1);
  gate->open = true;
  EXPECT_EQ(pool->trim(), 8192u);
  EXPECT_EQ(*live, 0);
  EXPECT_EQ(pool->stats().bytes_reserved, 0u);
}

TEST(Pool, DestructorWaitsForFencesAndFreesEverything) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto gate = std::make_shared<Gate>();
  {
    auto pool = make_pool(live);
    pool->release(pool->acquire(100), std::make_unique<GateFence>(gate));
    std::thread opener([gate] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      gate->open = true;
    });
    pool.reset();
    opener.join();
  }
  EXPECT_EQ(*live, 0);
}

// 8 threads, 10^6 acquire/release pairs in all, sizes across many classes, some with fences that
// complete a few operations later. Run under ASan (leaks) and TSan (races) in CI.
TEST(Pool, EightThreadsMillionOperations) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto pool = make_pool(live);
  constexpr int kThreads = 8;
  constexpr int kOpsPerThread = 125000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&pool, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::uniform_int_distribution<std::size_t> size(1, 1 << 16);
      std::vector<std::shared_ptr<Gate>> gates;
      for (int i = 0; i < kOpsPerThread; ++i) {
        const std::size_t n = size(rng);
        Block b = pool->acquire(n);
        static_cast<unsigned char*>(b.ptr)[0] = static_cast<unsigned char>(i);
        static_cast<unsigned char*>(b.ptr)[n - 1] = static_cast<unsigned char>(i);
        if (i % 4 == 0) {
          auto g = std::make_shared<Gate>();
          gates.push_back(g);
          pool->release(b, std::make_unique<GateFence>(g));
        } else {
          pool->release(b);
        }
        if (gates.size() > 8) {  // "work" completes a few operations later
          gates.front()->open = true;
          gates.erase(gates.begin());
        }
      }
      for (auto& g : gates) g->open = true;
    });
  }
  for (auto& th : threads) th.join();
  const auto s = pool->stats();
  EXPECT_EQ(s.acquisitions, static_cast<std::uint64_t>(kThreads) * kOpsPerThread);
  EXPECT_EQ(s.releases, s.acquisitions);
  EXPECT_EQ(s.hits + s.misses, s.acquisitions);
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.blocks_in_use, 0u);
  EXPECT_GT(s.hits, s.misses * 10);  // the pool actually pools
  pool.reset();
  EXPECT_EQ(*live, 0);
}

}  // namespace
