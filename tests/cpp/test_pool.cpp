#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
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

std::unique_ptr<BlockPool> make_pool(std::shared_ptr<std::atomic<long>> live, std::size_t capacity = 0,
                                     double fence_wait_timeout_s = 10.0) {
  PoolOptions o;
  o.name = "TestPool";
  o.capacity_bytes = capacity;
  o.fence_wait_timeout_s = fence_wait_timeout_s;
  return std::make_unique<BlockPool>(std::make_unique<CountingAllocator>(std::move(live)), o);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Opens `gate` after `ms` on another thread, as a GPU completes work while the host waits.
std::thread open_later(std::shared_ptr<Gate> gate, int ms) {
  return std::thread([gate = std::move(gate), ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    gate->open = true;
  });
}

std::string value_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const gpuopt::Error& e) {
    EXPECT_EQ(e.kind(), gpuopt::ErrorKind::kValue) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a ValueError-kind gpuopt::Error";
  return "";
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

TEST(Pool, ReuseIsAHitOrNothingAndNeverAllocates) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto pool = make_pool(live);
  auto gate = std::make_shared<Gate>();
  EXPECT_FALSE(pool->reuse(3000).has_value());  // empty pool: no allocation either
  EXPECT_EQ(*live, 0);
  Block a = pool->acquire(3000);
  pool->release(a, std::make_unique<GateFence>(gate));
  EXPECT_FALSE(pool->reuse(2900).has_value());  // fenced
  gate->open = true;
  const std::optional<Block> b = pool->reuse(2900);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->ptr, a.ptr);
  EXPECT_EQ(b->requested, 2900u);
  const auto s = pool->stats();
  EXPECT_EQ(s.acquisitions, 2u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.busy_skips, 0u);  // counted by acquire(), which follows a failed reuse()
  EXPECT_EQ(*live, 1);
  pool->release(*b);
  pool->close();
  EXPECT_EQ(value_error_of([&] { pool->reuse(10); }), "TestPool is closed; create a new pool");
}

TEST(Pool, UnderCapacityARequestWaitsForTheFenceOfItsOnlyReusableBlock) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto pool = make_pool(live, 4096);
  auto gate = std::make_shared<Gate>();
  Block a = pool->acquire(4000);
  pool->release(a, std::make_unique<GateFence>(gate));
  std::thread opener = open_later(gate, 100);
  const auto t0 = Clock::now();
  Block b = pool->acquire(3500);  // same class, fenced: waits instead of failing with "0 B are in use"
  const double waited = seconds_since(t0);
  opener.join();
  EXPECT_EQ(b.ptr, a.ptr);
  EXPECT_GE(waited, 0.09);
  EXPECT_LT(waited, 5.0);
  const auto s = pool->stats();
  EXPECT_EQ(s.fence_waits, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.allocations, 1u);
  EXPECT_EQ(s.bytes_reserved, 4096u);
  pool->release(b);
}

TEST(Pool, UnderCapacityAFencedBlockOfAnotherClassIsFreedOnceReady) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto pool = make_pool(live, 4096);
  auto gate = std::make_shared<Gate>();
  pool->release(pool->acquire(4096), std::make_unique<GateFence>(gate));
  std::thread opener = open_later(gate, 80);
  Block b = pool->acquire(1000);  // 1 KiB class: room comes from freeing the 4 KiB block
  opener.join();
  const auto s = pool->stats();
  EXPECT_EQ(s.fence_waits, 1u);
  EXPECT_EQ(s.frees, 1u);
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.bytes_reserved, 1024u);
  EXPECT_EQ(*live, 1);
  pool->release(b);
}

TEST(Pool, FenceWaitIsBoundedAndSaysWhatHoldsTheMemory) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto gate = std::make_shared<Gate>();
  {
    auto pool = make_pool(live, 8192, 0.2);
    Block held = pool->acquire(4096);
    pool->release(pool->acquire(4096), std::make_unique<GateFence>(gate));
    const auto t0 = Clock::now();
    const std::string msg = value_error_of([&] { pool->acquire(4096); });
    const double waited = seconds_since(t0);
    EXPECT_GE(waited, 0.19);
    EXPECT_LT(waited, 5.0);
    EXPECT_EQ(msg,
              "TestPool: a 4 KiB request (4 KiB size class) would exceed capacity_bytes=8192 (8 KiB); 4 KiB of free "
              "blocks are held by pending GPU work (their fences did not complete within fence_wait_timeout_s=0.2) "
              "and 4 KiB are in use. Synchronize the streams that use this pool's tensors before allocating, or raise "
              "fence_wait_timeout_s or capacity_bytes");
    EXPECT_EQ(pool->stats().fence_waits, 1u);
    EXPECT_EQ(pool->stats().acquisitions, 2u);  // the failed request is not counted
    pool->release(held);
    gate->open = true;  // the destructor waits for fences
  }
  EXPECT_EQ(*live, 0);
}

TEST(Pool, NoWaitWhenFencesCannotMakeRoomOrTheBoundIsZero) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto gate = std::make_shared<Gate>();
  {
    auto pool = make_pool(live, 8192);
    Block held = pool->acquire(4096);
    pool->release(pool->acquire(4096), std::make_unique<GateFence>(gate));
    auto t0 = Clock::now();
    // 8 KiB needs the held block back too: waiting for the fence cannot help, so it fails at once.
    EXPECT_EQ(value_error_of([&] { pool->acquire(8192); }),
              "TestPool: a 8 KiB request (8 KiB size class) would exceed capacity_bytes=8192 (8 KiB); 4 KiB are in "
              "use. Release tensors or raise capacity_bytes");
    EXPECT_LT(seconds_since(t0), 0.5);
    EXPECT_EQ(pool->stats().fence_waits, 0u);
    pool->release(held);
    gate->open = true;
  }
  auto gate2 = std::make_shared<Gate>();
  {
    auto pool = make_pool(live, 4096, 0.0);
    pool->release(pool->acquire(4096), std::make_unique<GateFence>(gate2));
    const auto t0 = Clock::now();
    const std::string msg = value_error_of([&] { pool->acquire(100); });
    EXPECT_LT(seconds_since(t0), 0.5);
    EXPECT_NE(msg.find("held by pending GPU work (their fences did not complete within fence_wait_timeout_s=0)"),
              std::string::npos)
        << msg;
    gate2->open = true;
  }
  EXPECT_EQ(*live, 0);
}

TEST(Pool, ClosingWakesARequestWaitingForAFence) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto gate = std::make_shared<Gate>();
  auto pool = make_pool(live, 4096, 30.0);
  pool->release(pool->acquire(4096), std::make_unique<GateFence>(gate));
  std::string msg;
  std::thread waiter([&] { msg = value_error_of([&] { pool->acquire(4096); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::thread opener = open_later(gate, 50);  // close() waits for fences before freeing
  const auto t0 = Clock::now();
  pool->close();
  waiter.join();
  opener.join();
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(msg, "TestPool is closed; create a new pool");
  EXPECT_EQ(*live, 0);
}

TEST(Pool, BadFenceWaitTimeouts) {
  auto live = std::make_shared<std::atomic<long>>(0);
  for (double bad : {-1.0, std::nan(""), 3601.0}) {
    const std::string msg = value_error_of([&] { make_pool(live, 0, bad); });
    EXPECT_NE(msg.find("TestPool: fence_wait_timeout_s must be in [0, 3600] seconds, got "), std::string::npos) << msg;
  }
}

// 4 threads under a tight capacity; every block is released with a fence that a separate thread
// opens a little later (as the GPU would). Requests wait for fences and none fails.
TEST(Pool, CapacityWithFencesOpenedByAnotherThread) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto pool = make_pool(live, 64 << 10);
  std::mutex mu;
  std::deque<std::shared_ptr<Gate>> closed_gates;
  std::atomic<bool> done{false};
  std::thread gpu([&] {
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      std::lock_guard<std::mutex> lock(mu);
      for (int k = 0; k < 4 && !closed_gates.empty(); ++k) {
        closed_gates.front()->open = true;
        closed_gates.pop_front();
      }
    }
  });
  constexpr int kThreads = 4, kOps = 1500;
  std::atomic<long> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(100 + t));
      std::uniform_int_distribution<std::size_t> size(1, 8192);
      for (int i = 0; i < kOps; ++i) {
        try {
          const std::size_t n = size(rng);
          Block b = pool->acquire(n);
          static_cast<unsigned char*>(b.ptr)[n - 1] = static_cast<unsigned char>(i);
          auto g = std::make_shared<Gate>();
          {
            std::lock_guard<std::mutex> lock(mu);
            closed_gates.push_back(g);
          }
          pool->release(b, std::make_unique<GateFence>(g));
        } catch (const gpuopt::Error&) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  gpu.join();
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& g : closed_gates) g->open = true;
  }
  const auto s = pool->stats();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(s.acquisitions, static_cast<std::uint64_t>(kThreads) * kOps);
  EXPECT_EQ(s.releases, s.acquisitions);
  EXPECT_LE(s.peak_bytes_reserved, 64u << 10);
  EXPECT_GT(s.fence_waits, 0u);  // the capacity was really the constraint
  pool.reset();
  EXPECT_EQ(*live, 0);
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

// A fence that fails, as a CUDA event does after a sticky error (a device-side assert).
class FailingFence : public gpuopt::Fence {
 public:
  bool ready() override { throw std::runtime_error("cudaEventQuery: device-side assert triggered"); }
  void wait() override { throw std::runtime_error("cudaEventSynchronize: device-side assert triggered"); }
};

// Nothing can say when the GPU is done with such a block: it is neither reused nor freed, and neither
// trim() nor the destructor may throw (a destructor that throws aborts the process).
TEST(Pool, ABlockWhoseFenceFailsIsLeakedNotReusedAndNothingThrows) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto pool = make_pool(live);
  const Block failed = pool->acquire(100);
  const Block busy = pool->acquire(100);
  auto gate = std::make_shared<Gate>();
  pool->release(failed, std::make_unique<FailingFence>());
  pool->release(busy, std::make_unique<GateFence>(gate));
  EXPECT_EQ(pool->trim(), 0u);
  gpuopt::PoolStats s = pool->stats();
  EXPECT_EQ(s.blocks_leaked, 1u);
  EXPECT_EQ(s.free_blocks, 1u);  // the busy block is still there, its fence intact
  EXPECT_EQ(s.bytes_reserved, busy.size);
  EXPECT_EQ(*live, 2);
  const Block fresh = pool->acquire(100);  // neither the leaked nor the busy block
  EXPECT_NE(fresh.ptr, failed.ptr);
  EXPECT_NE(fresh.ptr, busy.ptr);
  pool->release(fresh, nullptr);
  gate->open = true;
  pool.reset();  // waits for the busy block, frees it and the fresh one
  EXPECT_EQ(*live, 1);
  gpuopt::HostAllocator().deallocate(failed.ptr, failed.size);  // the test frees what the pool leaked
}

TEST(Pool, ReleaseIntoAClosedPoolWithAFailingFenceLeaksWithoutThrowing) {
  auto live = std::make_shared<std::atomic<long>>(0);
  auto pool = make_pool(live);
  const Block b = pool->acquire(100);
  pool->close();
  EXPECT_NO_THROW(pool->release(b, std::make_unique<FailingFence>()));
  const gpuopt::PoolStats s = pool->stats();
  EXPECT_EQ(s.blocks_leaked, 1u);
  EXPECT_EQ(s.frees, 0u);
  EXPECT_EQ(*live, 1);
  pool.reset();
  gpuopt::HostAllocator().deallocate(b.ptr, b.size);
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
