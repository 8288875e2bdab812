// Executors spread over devices: which device each serves, busy time per device, and dispatch through
// one BatchQueue to fake executors of unequal speed (the least-loaded behaviour of the pull model).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gpuopt/batcher.h"
#include "gpuopt/busy.h"
#include "gpuopt/errors.h"

namespace {

using gpuopt::serve::Batch;
using gpuopt::serve::BatcherOptions;
using gpuopt::serve::BatchQueue;
using gpuopt::serve::BusyClock;
using gpuopt::serve::EnqueueStatus;
using gpuopt::serve::QueuedRequest;
using gpuopt::serve::executor_devices;

std::string value_error(const std::vector<std::int64_t>& devices, std::int64_t instances) {
  try {
    executor_devices(devices, instances);
  } catch (const gpuopt::Error& e) {
    EXPECT_EQ(e.kind(), gpuopt::ErrorKind::kValue);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(ExecutorDevices, InterleavesInstancesPerDevice) {
  EXPECT_EQ(executor_devices({0, 1}, 2), (std::vector<std::int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(executor_devices({3}, 3), (std::vector<std::int64_t>{3, 3, 3}));
  EXPECT_EQ(executor_devices({2, 0, 1}, 1), (std::vector<std::int64_t>{2, 0, 1}));
}

TEST(ExecutorDevices, RejectsBadArguments) {
  EXPECT_NE(value_error({}, 1).find("devices must name at least one"), std::string::npos);
  EXPECT_NE(value_error({0}, 0).find("instances must be >= 1"), std::string::npos);
  EXPECT_NE(value_error({0, -1}, 1).find("got -1"), std::string::npos);
  EXPECT_NE(value_error({1, 0, 1}, 1).find("distinct, got 1 twice"), std::string::npos);
}

TEST(BusyClock, CountsOverlapOncePerDeviceAndForTheServer) {
  BusyClock clock(2);
  clock.begin(0);
  clock.begin(0);  // two executors of device 0 overlap: one busy interval
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  clock.end(0);
  clock.begin(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  clock.end(0);
  clock.end(1);
  const BusyClock::Reading r = clock.read();
  EXPECT_EQ(r.batches, (std::vector<std::int64_t>{2, 1}));
  EXPECT_GE(r.device_s[0], 0.040);
  EXPECT_GE(r.device_s[1], 0.020);
  EXPECT_LT(r.device_s[1], r.device_s[0]);
  EXPECT_GE(r.any_s, r.device_s[0]);                   // the union covers each device's time
  EXPECT_LE(r.any_s, r.device_s[0] + r.device_s[1]);  // and counts the overlap once
}

TEST(BusyClock, ABatchInServiceCountsUpToNow) {
  BusyClock clock(1);
  clock.begin(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const BusyClock::Reading r = clock.read();
  EXPECT_GE(r.any_s, 0.010);
  EXPECT_GE(r.device_s[0], 0.010);
  EXPECT_EQ(r.batches[0], 0);
  clock.end(0);
  EXPECT_THROW(clock.end(0), gpuopt::Error);
  EXPECT_THROW(BusyClock(0), gpuopt::Error);
}

// Two devices, two executors each, pulling batches from one queue; device 1 is four times slower.
// Every request is served once, each device's batches are counted, the fast device takes more of
// them, and each device's busy time is at least its batches' service time over its executors.
TEST(Dispatch, FreeExecutorsPullBatchesLeastLoadedFirst) {
  BatcherOptions options;
  options.max_batch_size = 4;
  BatchQueue queue(options);
  const std::vector<std::int64_t> devices = {0, 1};
  const std::vector<std::int64_t> of_executor = executor_devices(devices, 2);
  const std::chrono::milliseconds service[] = {std::chrono::milliseconds(1), std::chrono::milliseconds(4)};
  constexpr int kRequests = 400;
  for (int i = 0; i < kRequests; ++i) {
    QueuedRequest q;
    q.id = static_cast<std::uint64_t>(i);
    ASSERT_EQ(queue.enqueue(q), EnqueueStatus::kAccepted);
  }
  queue.close(/*drain=*/true);
  BusyClock clock(devices.size());
  std::vector<std::atomic<int>> served(kRequests);
  std::vector<std::int64_t> service_ms(devices.size(), 0);  // per slot, written by its executors under `mu`
  std::mutex mu;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> executors;
  for (const std::int64_t device : of_executor) {
    executors.emplace_back([&, slot = static_cast<std::size_t>(device)] {
      while (true) {
        std::optional<Batch> batch = queue.next_batch(0.05);
        if (!batch) {
          if (queue.closed() && queue.waiting() == 0) break;
          continue;
        }
        clock.begin(slot);
        std::this_thread::sleep_for(service[slot]);
        for (const QueuedRequest& q : batch->requests) served[q.id].fetch_add(1);
        clock.end(slot);
        const std::lock_guard<std::mutex> lock(mu);
        service_ms[slot] += service[slot].count();
      }
    });
  }
  for (std::thread& t : executors) t.join();
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(served[i].load(), 1) << "request " << i;
  const BusyClock::Reading r = clock.read();
  EXPECT_EQ(r.batches[0] + r.batches[1], queue.stats().batches);
  EXPECT_GT(r.batches[0], r.batches[1]) << "the fast device should pull more batches";
  for (std::size_t d = 0; d < devices.size(); ++d) {
    EXPECT_GE(r.device_s[d], 0.001 * static_cast<double>(service_ms[d]) / 2 * 0.99) << "device " << d;
    EXPECT_LE(r.device_s[d], r.any_s + 1e-9);
  }
  EXPECT_LE(r.any_s, wall_s);
}

}  // namespace
